"""Reference forward passes of published checkpoints, written from their own code's equations, independent of
vlbert's modules (the tests compare vlbert's converted models against these), and writers of files in the
published formats (random values, the families' exact key names and shapes).

* UNITER: ChenRocks/UNITER ``model/model.py`` and ``model/layer.py`` at 1dbfa62 (UniterTextEmbeddings,
  UniterImageEmbeddings, UniterModel with ``get_gather_index`` from ``data/data.py``, the additive -10000 key
  mask, BertLayer with erf GELU), heads of ``model/pretrain.py`` (MLM tied to the word embeddings, RegionFeature-
  Regression tied to ``img_linear`` through ``F.linear(x, W.t())``, RegionClassification, ``itm_output``) and
  ``model/vqa.py`` (``vqa_output``; ``model/ve.py``: the same head over 3 labels), ``model/itm.py``
  (``rank_output`` on the pooled output), ``model/nlvr2.py`` (``paired``: the two pooled outputs of [text; left
  regions typed 1] and [text; right regions typed 2] concatenated into ``nlvr2_output``; ``paired-attn``: each
  sequence attends to the other's through ``attention.py``'s multi-head attention, ``fc``, ``AttentionPool``).
* Oscar / VinVL: microsoft/Oscar ``oscar/modeling/modeling_bert.py`` at 266075f, ``BertImgModel.forward``: BERT text
  embeddings, ``img_embedding`` over the 2054-d input, ``LayerNorm`` when ``use_img_layernorm``, concatenation after
  the text, the additive -10000 mask.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def layer_norm(x, state, prefix, eps=1e-12):
    return F.layer_norm(x, x.shape[-1:], state[prefix + ".weight"], state[prefix + ".bias"], eps)


def linear(x, state, prefix):
    return F.linear(x, state[prefix + ".weight"], state[prefix + ".bias"])


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def bert_encoder(x, additive_mask, state, prefix, num_layers, num_heads):
    """Post-LN BERT layers with Hugging Face key names under ``prefix`` (``uniter.encoder`` / ``bert.encoder``).
    x [B, S, H]; additive_mask [B, 1, 1, S] (0 or -10000)."""
    b, s, h = x.shape
    d = h // num_heads
    for i in range(num_layers):
        p = f"{prefix}.layer.{i}"

        def heads(t):
            return t.view(b, s, num_heads, d).transpose(1, 2)

        q, k, v = (heads(linear(x, state, f"{p}.attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d) + additive_mask
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
        x = layer_norm(
            linear(context, state, f"{p}.attention.output.dense") + x, state, f"{p}.attention.output.LayerNorm"
        )
        ffn = linear(gelu(linear(x, state, f"{p}.intermediate.dense")), state, f"{p}.output.dense")
        x = layer_norm(ffn + x, state, f"{p}.output.LayerNorm")
    return x


# ---------------------------------------------------------------------------------------------------------- UNITER
def uniter_state(
    hidden=32,
    layers=2,
    intermediate=48,
    vocab=60,
    positions=64,
    feature_dim=24,
    classes=1601,
    answers=0,
    seed=0,
    dtype=torch.float16,
    head="",
) -> dict[str, torch.Tensor]:
    """A state dict with exactly UNITER's keys and shapes (UniterForPretraining, or UniterForVisualQuestionAnswering
    with ``answers`` > 0, UniterForVisualEntailment with 3; ``head`` "itm": UniterForImageTextRetrieval, "paired" /
    "paired-attn": UniterForNlvr2Paired / PairedAttn with the 3-row token-type table of ``init_type_embedding``),
    random values stored in ``dtype``, the tied duplicates present as the same tensors."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    def ln(prefix, size=hidden):
        state[prefix + ".weight"] = (1 + rand(size, scale=0.1)).to(dtype)
        state[prefix + ".bias"] = rand(size, scale=0.1)

    def lin(prefix, out_dim, in_dim):
        state[prefix + ".weight"] = rand(out_dim, in_dim)
        state[prefix + ".bias"] = rand(out_dim, scale=0.1)

    state: dict[str, torch.Tensor] = {}
    e = "uniter.embeddings"
    state[f"{e}.word_embeddings.weight"] = rand(vocab, hidden)
    state[f"{e}.position_embeddings.weight"] = rand(positions, hidden)
    state[f"{e}.token_type_embeddings.weight"] = rand(3 if head.startswith("paired") else 2, hidden)
    ln(f"{e}.LayerNorm")
    i = "uniter.img_embeddings"
    lin(f"{i}.img_linear", hidden, feature_dim)
    ln(f"{i}.img_layer_norm")
    lin(f"{i}.pos_linear", hidden, 7)
    ln(f"{i}.pos_layer_norm")
    state[f"{i}.mask_embedding.weight"] = rand(2, feature_dim)
    ln(f"{i}.LayerNorm")
    for n in range(layers):
        p = f"uniter.encoder.layer.{n}"
        for part in ("query", "key", "value"):
            lin(f"{p}.attention.self.{part}", hidden, hidden)
        lin(f"{p}.attention.output.dense", hidden, hidden)
        ln(f"{p}.attention.output.LayerNorm")
        lin(f"{p}.intermediate.dense", intermediate, hidden)
        lin(f"{p}.output.dense", hidden, intermediate)
        ln(f"{p}.output.LayerNorm")
    lin("uniter.pooler.dense", hidden, hidden)
    if head == "itm":
        lin("itm_output", 2, hidden)
        lin("rank_output", 1, hidden)
        return state
    if head.startswith("paired"):
        if head == "paired-attn":
            for attn in ("attn1", "attn2"):
                state[f"{attn}.in_proj_weight"] = rand(3 * hidden, hidden)
                state[f"{attn}.in_proj_bias"] = rand(3 * hidden, scale=0.1)
                lin(f"{attn}.out_proj", hidden, hidden)
            lin("fc.0", hidden, 2 * hidden)
            lin("attn_pool.fc.0", 1, hidden)
        lin("nlvr2_output", 2, 2 * hidden)
        return state
    if answers:
        lin("vqa_output.0", 2 * hidden, hidden)
        ln("vqa_output.2", 2 * hidden)
        lin("vqa_output.3", answers, 2 * hidden)
        return state
    lin("cls.predictions.transform.dense", hidden, hidden)
    ln("cls.predictions.transform.LayerNorm")
    state["cls.predictions.decoder.weight"] = state[f"{e}.word_embeddings.weight"]
    state["cls.predictions.bias"] = rand(vocab, scale=0.1)
    lin("feat_regress.net.0", hidden, hidden)
    ln("feat_regress.net.2")
    state["feat_regress.weight"] = state[f"{i}.img_linear.weight"]
    state["feat_regress.bias"] = rand(feature_dim, scale=0.1)
    lin("region_classifier.net.0", hidden, hidden)
    ln("region_classifier.net.2")
    lin("region_classifier.net.3", classes, hidden)
    lin("itm_output", 2, hidden)
    return state


def uniter_forward(
    state,
    input_ids,
    text_lengths,
    img_feat,
    img_pos7,
    num_boxes,
    num_layers,
    num_heads,
    img_types=None,
    return_mask=False,
):
    """UniterModel.forward + pooler as UNITER computes it: text [B, Tmax] (right-padded), images [B, Nmax, D] and
    their 7-d positions; the sequence gathered by ``get_gather_index``; ``img_types``: each row's region token type
    (default 1; NLVR2's ``use_img_type``: 1 left, 2 right). Returns (sequence [B, max(tl+nbb), H] with row i =
    [text_i, regions_i, junk], pooled [B, H]) and, with ``return_mask``, ``attn_masks`` [B, max(tl+nbb)]."""
    s = {k: v.float() for k, v in state.items()}
    b, t_max = input_ids.shape
    e = "uniter.embeddings"
    text = s[f"{e}.word_embeddings.weight"][input_ids] + s[f"{e}.position_embeddings.weight"][:t_max][None]
    text = layer_norm(text + s[f"{e}.token_type_embeddings.weight"][0], s, f"{e}.LayerNorm")
    i = "uniter.img_embeddings"
    img_type = s[f"{e}.token_type_embeddings.weight"][torch.tensor(img_types or [1] * b)][:, None]
    transformed_im = layer_norm(linear(img_feat, s, f"{i}.img_linear"), s, f"{i}.img_layer_norm")
    transformed_pos = layer_norm(linear(img_pos7, s, f"{i}.pos_linear"), s, f"{i}.pos_layer_norm")
    img = layer_norm(transformed_im + transformed_pos + img_type, s, f"{i}.LayerNorm")
    out_size = int(max(tl + nb for tl, nb in zip(text_lengths, num_boxes, strict=True)))
    gather_index = torch.arange(out_size).repeat(b, 1)
    for row, (tl, nb) in enumerate(zip(text_lengths, num_boxes, strict=True)):
        gather_index[row, tl : tl + nb] = torch.arange(t_max, t_max + nb)
    joint = torch.cat([text, img], 1)
    joint = torch.cat([joint, joint.new_zeros(b, max(0, out_size - joint.shape[1]), joint.shape[2])], 1)
    embedded = joint.gather(1, gather_index[..., None].expand(-1, -1, joint.shape[2]))
    attn = torch.zeros(b, out_size)
    for row, (tl, nb) in enumerate(zip(text_lengths, num_boxes, strict=True)):
        attn[row, : tl + nb] = 1
    additive = (1.0 - attn)[:, None, None, :] * -10000.0
    sequence = bert_encoder(embedded, additive, s, "uniter.encoder", num_layers, num_heads)
    pooled = torch.tanh(linear(sequence[:, 0], s, "uniter.pooler.dense"))
    return (sequence, pooled, attn) if return_mask else (sequence, pooled)


def uniter_heads(state, hidden_text, hidden_regions, pooled):
    """UNITER's head logits: MLM over text positions, MRFR and MRC over region positions, ITM and (fine-tuned) VQA
    over the pooled output."""
    s = {k: v.float() for k, v in state.items()}
    out = {}
    if "cls.predictions.bias" in s:
        h = layer_norm(
            gelu(linear(hidden_text, s, "cls.predictions.transform.dense")), s, "cls.predictions.transform.LayerNorm"
        )
        out["mlm"] = F.linear(h, s["uniter.embeddings.word_embeddings.weight"], s["cls.predictions.bias"])
        h = layer_norm(gelu(linear(hidden_regions, s, "feat_regress.net.0")), s, "feat_regress.net.2")
        out["mrfr"] = F.linear(h, s["feat_regress.weight"].t(), s["feat_regress.bias"])
        h = layer_norm(gelu(linear(hidden_regions, s, "region_classifier.net.0")), s, "region_classifier.net.2")
        out["mrc"] = linear(h, s, "region_classifier.net.3")
        out["itm"] = linear(pooled, s, "itm_output")
    if "vqa_output.0.weight" in s:
        h = layer_norm(gelu(linear(pooled, s, "vqa_output.0")), s, "vqa_output.2")
        out["vqa"] = linear(h, s, "vqa_output.3")
    if "rank_output.weight" in s:
        out["rank"] = linear(pooled, s, "rank_output")[:, 0]
    if "nlvr2_output.weight" in s and "attn1.in_proj_weight" not in s:  # paired: [pooled left ; pooled right]
        out["nlvr2"] = linear(pooled.reshape(pooled.shape[0] // 2, -1), s, "nlvr2_output")
    return out


def multihead_attention(query, key, state, prefix, num_heads, key_padding):
    """``attention.py``'s multi_head_attention_forward (no bias_kv, no zero attention, no dropout), batch first:
    q, k, v from the three row blocks of ``in_proj_weight``, q scaled by head_dim^-0.5, padded keys (True in
    ``key_padding`` [B, S]) at -inf before the softmax, heads merged, ``out_proj``. query [B, L, H], key [B, S, H]."""
    b, length, h = query.shape
    d = h // num_heads
    w, bias = state[prefix + ".in_proj_weight"], state[prefix + ".in_proj_bias"]
    q = F.linear(query, w[:h], bias[:h]) * d**-0.5
    k = F.linear(key, w[h : 2 * h], bias[h : 2 * h])
    v = F.linear(key, w[2 * h :], bias[2 * h :])

    def heads(t):
        return t.view(b, -1, num_heads, d).transpose(1, 2)

    scores = (heads(q) @ heads(k).transpose(-1, -2)).masked_fill(key_padding[:, None, None, :], float("-inf"))
    context = (scores.softmax(-1) @ heads(v)).transpose(1, 2).reshape(b, length, h)
    return linear(context, state, prefix + ".out_proj")


def uniter_nlvr2_paired_attn(state, sequence, attn_masks, num_heads):
    """UniterForNlvr2PairedAttn's head on UNITER's gathered sequences (rows 2i, 2i + 1 = pair i's left and right
    [text; regions; junk]) and their ``attn_masks``: bidirectional attention between the two, ``fc`` (Linear ->
    ReLU) on [attended ; own], AttentionPool (ReLU(Linear(H, 1)) scores, padding -10000, softmax, weighted sum),
    ``nlvr2_output`` on [left ; right]. Returns logits [B/2, 2]."""
    s = {k: v.float() for k, v in state.items()}
    left, right = sequence[0::2], sequence[1::2]
    left_pad, right_pad = attn_masks[0::2] == 0, attn_masks[1::2] == 0
    l2r = multihead_attention(left, right, s, "attn1", num_heads, right_pad)
    r2l = multihead_attention(right, left, s, "attn2", num_heads, left_pad)

    def pool(x, padding):
        score = torch.relu(linear(x, s, "attn_pool.fc.0")).squeeze(-1) + padding.float() * -1e4
        return (score.softmax(1)[:, :, None] * x).sum(1)

    left = pool(torch.relu(linear(torch.cat([l2r, left], -1), s, "fc.0")), left_pad)
    right = pool(torch.relu(linear(torch.cat([r2l, right], -1), s, "fc.0")), right_pad)
    return linear(torch.cat([left, right], -1), s, "nlvr2_output")


# ----------------------------------------------------------------------------------------------------- Oscar/VinVL
def oscar_forward(state, config, input_ids, token_type_ids, attention_mask, img_feats, img_mask):
    """BertImgModel.forward (+ pooler): BERT embeddings of the text, ``img_embedding`` of the 2054-d region input
    (feature ; box6), VinVL's ``LayerNorm`` where ``use_img_layernorm``, concatenated after the text; additive
    -10000 mask over [text ; regions]. Returns (sequence [B, T + R, H], pooled [B, H])."""
    s = {k: v.float() for k, v in state.items()}
    t = input_ids.shape[1]
    e = "bert.embeddings"
    text = (
        s[f"{e}.word_embeddings.weight"][input_ids]
        + s[f"{e}.position_embeddings.weight"][:t][None]
        + s[f"{e}.token_type_embeddings.weight"][token_type_ids]
    )
    text = layer_norm(text, s, f"{e}.LayerNorm", config["layer_norm_eps"])
    img = linear(img_feats, s, "bert.img_embedding")
    if config.get("use_img_layernorm"):
        img = layer_norm(img, s, "bert.LayerNorm", config["img_layer_norm_eps"])
    mask = torch.cat([attention_mask, img_mask], 1).float()
    additive = (1.0 - mask)[:, None, None, :] * -10000.0
    sequence = bert_encoder(
        torch.cat([text, img], 1),
        additive,
        s,
        "bert.encoder",
        config["num_hidden_layers"],
        config["num_attention_heads"],
    )
    return sequence, torch.tanh(linear(sequence[:, 0], s, "bert.pooler.dense"))
