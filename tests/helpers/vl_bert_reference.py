"""VL-BERT's forward written from its own code, independent of vlbert's modules, and a writer of its ``.model``
files (random values, its exact key names and shapes), for tests/published/test_vl_bert.py.

Source: jackroos/VL-BERT at 4373674:
* ``common/utils/bbox.py`` ``coordinate_embeddings`` (pixel boxes + image size -> centre/size x 100 -> sin/cos);
* ``common/fast_rcnn.py`` ``FastRCNN.forward`` (prec: the given features; e2e: ResNet C4 ``body4``, maskrcnn-
  benchmark ``ROIAlign((14, 14), 1/16, sampling_ratio=1)`` = torchvision's with ``aligned=False``, the res5 head,
  ``AvgPool2d(14)``; then ``obj_downsample`` = Dropout, Linear([coord ; feature]), ReLU);
* ``common/backbone/resnet/resnet.py`` (``Bottleneck`` with ``stride_in_1x1``, ``_make_layer``: dilation on every
  block of a stage, the downsample where shape changes);
* ``pretrain/modules/resnet_vlbert_for_pretraining_multitask.py`` (text visual embedding = object 0's; [IMG] =
  ``object_linguistic_embeddings``, masked -> ``object_mask_word_embedding``; prec masked features ->
  ``object_mask_visual_embedding``);
* ``common/visual_linguistic_bert.py`` ``VisualLinguisticBert.embedding`` (seamless text/object/[END] concatenation,
  token types 2 for objects and [END], object position = text length, [END] = text length + 1, TF-style LayerNorm),
  the -10000 additive mask, ``BertOnlyMLMHead`` (tied decoder) and ``VisualLinguisticBertMVRCHead``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.ops import roi_align

from helpers.published_references import bert_encoder, gelu, linear


def tf_layer_norm(x, weight, bias, eps=1e-12):
    u = x.mean(-1, keepdim=True)
    s = (x - u).pow(2).mean(-1, keepdim=True)
    return weight * (x - u) / torch.sqrt(s + eps) + bias


def coordinate_embeddings(boxes, wh, dim=256):
    """boxes [K, 4] pixels xyxy, wh [K, 2] image width/height -> [K, 4, 2 * dim] (bbox.py)."""
    ctr = torch.stack(
        [
            (boxes[:, 0] + boxes[:, 2]) / 2,
            (boxes[:, 1] + boxes[:, 3]) / 2,
            boxes[:, 2] - boxes[:, 0],
            boxes[:, 3] - boxes[:, 1],
        ],
        1,
    )
    pos = ctr / torch.stack([wh[:, 0], wh[:, 1], wh[:, 0], wh[:, 1]], 1) * 100
    dim_mat = 1000 ** (torch.arange(dim, dtype=boxes.dtype) / dim)
    angles = pos.view(-1, 4, 1) / dim_mat.view(1, 1, -1)
    return torch.cat([angles.sin(), angles.cos()], -1)


# ------------------------------------------------------------------------------------------- state writer
def vl_bert_state(
    hidden=32,
    layers=2,
    intermediate=48,
    vocab=60,
    positions=64,
    feature_dim=24,
    classes=1601,
    seed=0,
    backbone_layers=None,
) -> dict[str, torch.Tensor]:
    """``ResNetVLBERTForPretrainingMultitask.state_dict()`` under DDP (``module.``): random values; the MLM decoder
    and the res5 head's second name hold the same tensors as their originals. ``backbone_layers``: an e2e file
    with that many blocks in res2-res4 (feature_dim is then 2048, and no ``object_mask_visual_embedding``)."""
    g = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    def ln(prefix, size=hidden):
        state[prefix + ".weight"], state[prefix + ".bias"] = 1 + rand(size, scale=0.1), rand(size, scale=0.1)

    def lin(prefix, out_dim, in_dim, scale=None):  # fan-in scaled: base-sized sums stay O(1), as trained weights
        weight = rand(out_dim, in_dim, scale=scale or in_dim**-0.5)
        state[prefix + ".weight"], state[prefix + ".bias"] = weight, rand(out_dim, scale=0.1)

    v = "module.vlbert"
    for name, rows in (
        ("word_embeddings", vocab),
        ("end_embedding", 1),
        ("position_embeddings", positions),
        ("token_type_embeddings", 3),
    ):
        state[f"{v}.{name}.weight"] = rand(rows, hidden, scale=min(0.2, hidden**-0.5))
    for name in ("embedding_LayerNorm", "visual_ln_text", "visual_ln_object"):
        ln(f"{v}.{name}")
    for n in range(layers):
        p = f"{v}.encoder.layer.{n}"
        for part in ("query", "key", "value"):
            lin(f"{p}.attention.self.{part}", hidden, hidden)
        lin(f"{p}.attention.output.dense", hidden, hidden)
        ln(f"{p}.attention.output.LayerNorm")
        lin(f"{p}.intermediate.dense", intermediate, hidden)
        lin(f"{p}.output.dense", hidden, intermediate)
        ln(f"{p}.output.LayerNorm")
    lin(f"{v}.mlm_head.predictions.transform.dense", hidden, hidden)
    ln(f"{v}.mlm_head.predictions.transform.LayerNorm")
    state[f"{v}.mlm_head.predictions.bias"] = rand(vocab, scale=0.1)
    state[f"{v}.mlm_head.predictions.decoder.weight"] = state[f"{v}.word_embeddings.weight"]
    lin(f"{v}.mvrc_head.transform.dense", hidden, hidden)
    lin(f"{v}.mvrc_head.region_cls_pred", classes, hidden)
    dim = 2048 if backbone_layers else feature_dim
    lin("module.image_feature_extractor.obj_downsample.1", hidden, 2048 + dim)
    for name in ("object_linguistic_embeddings", "object_mask_word_embedding", "aux_text_visual_embedding"):
        state[f"module.{name}.weight"] = rand(1, hidden)
    if backbone_layers:
        _write_backbone(state, backbone_layers, rand)
    else:
        state["module.object_mask_visual_embedding.weight"] = rand(1, feature_dim)
    return state


def _bottleneck(state, prefix, inplanes, planes, rand, downsample):
    for i, (cin, cout, k) in enumerate(((inplanes, planes, 1), (planes, planes, 3), (planes, planes * 4, 1)), 1):
        state[f"{prefix}.conv{i}.weight"] = rand(cout, cin, k, k, scale=(2.0 / (cin * k * k)) ** 0.5)
        _bn(state, f"{prefix}.bn{i}", cout, rand)
    if downsample:
        state[f"{prefix}.downsample.0.weight"] = rand(planes * 4, inplanes, 1, 1, scale=(1.0 / inplanes) ** 0.5)
        _bn(state, f"{prefix}.downsample.1", planes * 4, rand)


def _bn(state, prefix, c, rand):
    state[prefix + ".weight"], state[prefix + ".bias"] = 0.5 + rand(c, scale=0.05), rand(c, scale=0.05)
    state[prefix + ".running_mean"], state[prefix + ".running_var"] = rand(c, scale=0.05), 1 + rand(c, scale=0.1).abs()
    state[prefix + ".num_batches_tracked"] = torch.tensor(0)


def _write_backbone(state, layers, rand):
    b = "module.image_feature_extractor.backbone"
    state[f"{b}.conv1.weight"] = rand(64, 3, 7, 7, scale=0.05)
    _bn(state, f"{b}.bn1", 64, rand)
    inplanes = 64
    for stage, (planes, blocks) in enumerate(zip((64, 128, 256), layers, strict=True), 1):
        for i in range(blocks):
            _bottleneck(state, f"{b}.layer{stage}.{i}", inplanes, planes, rand, i == 0)
            inplanes = planes * 4
    h = "module.image_feature_extractor.roi_head_feature_extractor"
    for i in range(3):
        _bottleneck(state, f"{h}.{i}", 1024 if i == 0 else 2048, 512, rand, i == 0)
    for k in [k for k in state if k.startswith(h + ".")]:
        state["module.image_feature_extractor.head.0." + k[len(h) + 1 :]] = state[k]


# ----------------------------------------------------------------------------------------------- forward
def _bn_eval(x, state, p):
    return F.batch_norm(
        x,
        state[p + ".running_mean"],
        state[p + ".running_var"],
        state[p + ".weight"],
        state[p + ".bias"],
        False,
        0.0,
        1e-5,
    )


def _block(x, state, p, stride, dilation):
    """resnet.py ``Bottleneck`` with stride_in_1x1=True (the stride on conv1)."""
    out = F.relu(_bn_eval(F.conv2d(x, state[p + ".conv1.weight"], stride=stride), state, p + ".bn1"))
    out = F.relu(
        _bn_eval(F.conv2d(out, state[p + ".conv2.weight"], padding=dilation, dilation=dilation), state, p + ".bn2")
    )
    out = _bn_eval(F.conv2d(out, state[p + ".conv3.weight"]), state, p + ".bn3")
    if p + ".downsample.0.weight" in state:
        x = _bn_eval(F.conv2d(x, state[p + ".downsample.0.weight"], stride=stride), state, p + ".downsample.1")
    return F.relu(out + x)


def e2e_features(state, images, boxes_px, box_mask):
    """FastRCNN (e2e): images [B, 3, H, W], pixel boxes [B, R, 4] -> pooled res5 features [B, R, 2048]."""
    b = "module.image_feature_extractor.backbone"
    x = F.relu(_bn_eval(F.conv2d(images, state[b + ".conv1.weight"], stride=2, padding=3), state, b + ".bn1"))
    x = F.max_pool2d(x, 3, 2, 1)
    for stage in (1, 2, 3):
        i = 0
        while f"{b}.layer{stage}.{i}.conv1.weight" in state:
            x = _block(x, state, f"{b}.layer{stage}.{i}", 2 if (stage > 1 and i == 0) else 1, 1)
            i += 1
    inds = box_mask.nonzero()
    rois = torch.cat([inds[:, :1].float(), boxes_px[inds[:, 0], inds[:, 1]]], 1)
    y = roi_align(x, rois, (14, 14), 1.0 / 16, 1, aligned=False)
    for i in range(3):
        y = _block(y, state, f"module.image_feature_extractor.roi_head_feature_extractor.{i}", 1, 2)
    y = F.avg_pool2d(y, 14, stride=1).flatten(1)
    out = y.new_zeros(*box_mask.shape, y.shape[1])
    out[inds[:, 0], inds[:, 1]] = y
    return out


def vl_bert_forward(
    state, text_ids, text_mask, boxes_px, im_wh, box_mask, mvrc_ops, num_heads, features=None, images=None
):
    """The pretraining forward (eval): returns per row a dict of text hidden [n_text, H], object hidden
    [n_obj, H], MLM logits [n_text, V] and MVRC logits [n_obj, C]."""
    if images is not None:
        features = e2e_features(state, images, boxes_px, box_mask)
    else:
        features = torch.where(
            (mvrc_ops == 1)[..., None], state["module.object_mask_visual_embedding.weight"][0], features
        )
    wh = im_wh[:, None].expand(-1, boxes_px.shape[1], -1)
    coord = coordinate_embeddings(boxes_px.reshape(-1, 4), wh.reshape(-1, 2)).view(*boxes_px.shape[:2], -1)
    obj_reps = F.relu(
        linear(torch.cat([coord, features], -1), state, "module.image_feature_extractor.obj_downsample.1")
    )
    v = "module.vlbert"
    words = state["module.object_linguistic_embeddings.weight"][0].expand(*box_mask.shape, -1)
    words = torch.where((mvrc_ops == 1)[..., None], state["module.object_mask_word_embedding.weight"][0], words)
    ln = lambda x, n: tf_layer_norm(x, state[f"{v}.{n}.weight"], state[f"{v}.{n}.bias"])  # noqa: E731
    text_vl = state[f"{v}.word_embeddings.weight"][text_ids] + ln(obj_reps[:, :1], "visual_ln_text")
    object_vl = words + ln(obj_reps, "visual_ln_object")
    rows, seqs, masks = [], [], []
    length = int((text_mask.sum(1) + box_mask.sum(1)).max()) + 1
    for i in range(text_ids.shape[0]):
        nt, no = int(text_mask[i].sum()), int(box_mask[i].sum())
        emb = torch.cat([text_vl[i, :nt], object_vl[i][box_mask[i].bool()], state[f"{v}.end_embedding.weight"]])
        types = torch.tensor([0] * nt + [2] * (no + 1))
        pos = torch.tensor(list(range(nt)) + [nt] * no + [nt + 1])
        emb = emb + state[f"{v}.token_type_embeddings.weight"][types] + state[f"{v}.position_embeddings.weight"][pos]
        pad = length - emb.shape[0]
        seqs.append(F.pad(ln(emb, "embedding_LayerNorm"), (0, 0, 0, pad)))
        masks.append(torch.tensor([1.0] * emb.shape[0] + [0.0] * pad))
        rows.append((nt, no))
    mask = torch.stack(masks)
    hidden = bert_encoder(
        torch.stack(seqs),
        (1.0 - mask)[:, None, None] * -10000.0,
        state,
        f"{v}.encoder",
        sum(1 for k in state if k.endswith("attention.self.query.weight")),
        num_heads,
    )
    out = []
    for i, (nt, no) in enumerate(rows):
        text, objects = hidden[i, :nt], hidden[i, nt : nt + no]
        p = f"{v}.mlm_head.predictions"
        t = gelu(linear(text, state, p + ".transform.dense"))
        t = tf_layer_norm(t, state[p + ".transform.LayerNorm.weight"], state[p + ".transform.LayerNorm.bias"])
        mlm = t @ state[f"{v}.word_embeddings.weight"].t() + state[p + ".bias"]
        mvrc = linear(
            gelu(linear(objects, state, f"{v}.mvrc_head.transform.dense")), state, f"{v}.mvrc_head.region_cls_pred"
        )
        out.append({"text": text, "objects": objects, "mlm": mlm, "mvrc": mvrc})
    return out
