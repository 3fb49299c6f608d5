"""The single-stream VL model: location features, region permutation equivariance, agreement with BertModel when
regions are masked out, objectives, checkpoints and input errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.builders import padded_batch, random_hf_config

import vlbert
from vlbert.models.region_embeddings import region_location_features
from vlbert.models.vl import VLBertForPreTraining, VLBertModel


def vl_config(seed=0, **kw):
    values = random_hf_config(seed).to_dict()
    values.update(region_feature_dim=12, num_region_classes=5, **kw)
    return vlbert.VLBertConfig.from_dict(values)


def region_inputs(batch=4, regions=5, dim=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(batch, regions, dim, generator=g).half()
    xy = torch.rand(batch, regions, 2, generator=g) * 0.5
    wh = torch.rand(batch, regions, 2, generator=g) * 0.5
    boxes = torch.cat([xy, xy + wh], -1)
    mask = torch.ones(batch, regions, dtype=torch.long)
    mask[1, 3:] = 0
    return feats, boxes, mask


def test_location_features_hand_worked():
    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.25, 0.5, 0.75, 0.75], [0.1, 0.2, 0.1, 0.2]])
    expected = torch.tensor(
        [[0, 0, 1, 1, 1, 1, 1], [0.25, 0.5, 0.75, 0.75, 0.5, 0.25, 0.125], [0.1, 0.2, 0.1, 0.2, 0, 0, 0]]
    )
    torch.testing.assert_close(region_location_features(boxes), expected)


def test_permuting_regions_permutes_outputs_and_keeps_text():
    torch.manual_seed(0)
    model = VLBertModel(vl_config()).eval()
    ids, types, mask = padded_batch(model.config.vocab_size)
    feats, boxes, rmask = region_inputs()
    perm = torch.tensor([3, 0, 4, 1, 2])
    with torch.no_grad():
        a = model(
            ids, token_type_ids=types, attention_mask=mask, region_features=feats, region_boxes=boxes, region_mask=rmask
        ).last_hidden_state
        b = model(
            ids,
            token_type_ids=types,
            attention_mask=mask,
            region_features=feats[:, perm],
            region_boxes=boxes[:, perm],
            region_mask=rmask[:, perm],
        ).last_hidden_state
    t = ids.shape[1]
    real_text = mask.bool()
    torch.testing.assert_close(b[:, :t][real_text], a[:, :t][real_text], atol=1e-5, rtol=0)
    real_regions = rmask[:, perm].bool()
    torch.testing.assert_close(b[:, t:][real_regions], a[:, t:][:, perm][real_regions], atol=1e-5, rtol=0)


def test_all_regions_masked_equals_text_bert():
    torch.manual_seed(1)
    vl = VLBertModel(vl_config(1)).eval()
    bert = vlbert.BertModel(vlbert.BertConfig.from_dict(random_hf_config(1).to_dict())).eval()
    info = bert.load_converted_state_dict({"bert." + k: v for k, v in vl.state_dict().items()})
    assert info.missing_keys == [] and all(k.startswith("region_embeddings") for k in info.unexpected_keys)
    ids, types, mask = padded_batch(vl.config.vocab_size, seed=2)
    feats, boxes, _ = region_inputs(seed=3)
    with torch.no_grad():
        joint = vl(
            ids,
            token_type_ids=types,
            attention_mask=mask,
            region_features=feats,
            region_boxes=boxes,
            region_mask=torch.zeros(4, 5, dtype=torch.long),
        )
        text = bert(ids, types, mask)
    real = mask.bool()
    torch.testing.assert_close(
        joint.last_hidden_state[:, : ids.shape[1]][real], text.last_hidden_state[real], atol=1e-5, rtol=0
    )
    torch.testing.assert_close(joint.pooler_output, text.pooler_output, atol=1e-5, rtol=0)


def test_objectives_match_their_definitions():
    torch.manual_seed(2)
    model = VLBertForPreTraining(vl_config(2)).eval()
    ids, types, mask = padded_batch(model.config.vocab_size, seed=4)
    feats, boxes, rmask = region_inputs(seed=5)
    masked = torch.zeros(4, 5, dtype=torch.bool)
    masked[0, 1] = masked[2, 0] = masked[3, 4] = True
    targets = torch.randn(4, 5, 12).half()
    probs = torch.softmax(torch.randn(4, 5, 5), -1)
    out = model(
        ids,
        token_type_ids=types,
        attention_mask=mask,
        region_features=feats,
        region_boxes=boxes,
        region_mask=rmask,
        masked_regions=masked,
        region_targets=targets,
        region_labels=probs,
        itm_label=torch.tensor([1, 0, 1, 0]),
    )
    assert set(out.losses) == {"mrfr", "mrc_kl", "itm"} and out.counts["mrfr"] == 3
    hidden = out.last_hidden_state[:, ids.shape[1] :][masked]
    torch.testing.assert_close(out.losses["mrfr"], F.mse_loss(model.mrfr(hidden), targets[masked].float()))
    kl = (probs[masked] * (probs[masked].log() - F.log_softmax(model.mrc(hidden), -1))).sum(-1).mean()
    torch.testing.assert_close(out.losses["mrc_kl"], kl, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.loss, out.losses["mrfr"] + out.losses["mrc_kl"] + out.losses["itm"])
    assert out.unused_parameters == list(model.masked_lm.parameters())  # the one head no objective used
    out.loss.backward()
    assert model.bert.region_embeddings.feature_proj.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in out.unused_parameters)  # declared, not in the loss: the trainer adds them
    # under DDP (vlbert.training.distributed.global_batch_loss)


def test_heads_answer_without_labels_as_with_them():
    """As transformers' *ForPreTraining: without labels every head's logits come back; the ITM logits are those of a
    forward given itm_label, and the MLM logits at the masked positions those of a forward given labels."""
    torch.manual_seed(3)
    model = VLBertForPreTraining(vl_config(3)).eval()
    ids, types, mask = padded_batch(model.config.vocab_size, seed=6)
    feats, boxes, rmask = region_inputs(seed=7)
    labels = torch.full_like(ids, -100)
    labels[0, 1] = labels[2, 2] = 7
    with torch.no_grad():
        bare = model(
            ids, token_type_ids=types, attention_mask=mask, region_features=feats, region_boxes=boxes, region_mask=rmask
        )
        itm = model(
            ids,
            token_type_ids=types,
            attention_mask=mask,
            region_features=feats,
            region_boxes=boxes,
            region_mask=rmask,
            itm_label=torch.tensor([1, 0, 1, 0]),
        )
        mlm = model(
            ids,
            token_type_ids=types,
            attention_mask=mask,
            region_features=feats,
            region_boxes=boxes,
            region_mask=rmask,
            labels=labels,
        )
    assert bare.loss is None and bare.seq_relationship_logits.shape == (4, 2)
    torch.testing.assert_close(bare.seq_relationship_logits, itm.seq_relationship_logits, rtol=0, atol=0)
    torch.testing.assert_close(bare.prediction_logits[labels != -100], mlm.prediction_logits, atol=1e-5, rtol=0)
    assert itm.prediction_logits is None  # a training batch computes no head it has no labels for


def test_vl_checkpoint_round_trip_and_init_from_bert(tmp_path, minilm_dir):
    model = VLBertForPreTraining.from_pretrained(minilm_dir, region_feature_dim=12, num_region_classes=5)
    missing = model.loading_info.missing_keys
    assert any(k.startswith("bert.region_embeddings") for k in missing)
    assert not any(k.startswith("bert.encoder") or k.startswith("bert.embeddings") for k in missing)
    model.save_pretrained(tmp_path)
    again = VLBertForPreTraining.from_pretrained(tmp_path)
    assert again.loading_info.missing_keys == [] and again.loading_info.unexpected_keys == []
    assert again.config == model.config
    for (n, p), (m, q) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert n == m and torch.equal(p, q)


@pytest.mark.parametrize("region_embedding", ["uniter", "vl-bert"])
def test_from_pretrained_draws_only_what_the_checkpoint_lacks(minilm_dir, region_embedding):
    """from_pretrained builds the model without drawing its initial weights (transformers' no_init_weights) and
    initialises only what the checkpoint lacks: every tensor the checkpoint holds is the checkpoint's, every other
    is a fresh model's in distribution (N(0, 0.02) weights, zero biases, identity LayerNorms, VL-BERT's zero
    gammas), nothing left as torch.empty gave it."""
    from vlbert import checkpoint as ckpt

    model = VLBertForPreTraining.from_pretrained(
        minilm_dir, region_feature_dim=12, num_region_classes=5, region_embedding=region_embedding
    )
    torch.manual_seed(0)
    fresh = VLBertForPreTraining(model.config).state_dict()  # init_weights over every module
    checkpoint = ckpt.hf_to_vlbert(ckpt.read_state_dict(minilm_dir))
    drawn = []
    for name, value in model.state_dict().items():
        if name in checkpoint:
            assert torch.equal(value, checkpoint[name]), name
        elif fresh[name].unique().numel() == 1:  # zeros, ones
            assert torch.equal(value, fresh[name]), name
        else:  # N(0, initializer_range), a padding row zero as in the fresh model; 5 standard errors of the std
            drawn.append(name)
            real, std = value[fresh[name] != 0], model.config.initializer_range
            assert torch.equal(value.eq(0).all(-1), fresh[name].eq(0).all(-1)), name  # (a draw may be exactly 0)
            assert abs(real.std() - std) < 5 * std / (2 * real.numel()) ** 0.5 and real.abs().max() < 6 * std, name
    assert any("region_embeddings" in n for n in drawn) and any(n.startswith("masked_lm") for n in drawn), drawn
    if region_embedding == "vl-bert":  # its own initialisation ran after the generic one: LN_text's gamma 0
        assert not model.bert.region_embeddings.visual_ln_text.weight.any()


def test_region_input_errors():
    model = VLBertModel(vl_config()).eval()
    ids, types, mask = padded_batch(model.config.vocab_size)
    feats, boxes, rmask = region_inputs()
    with pytest.raises(ValueError, match="region_feature_dim=12"):
        model(
            ids,
            token_type_ids=types,
            attention_mask=mask,
            region_features=torch.zeros(4, 5, 7),
            region_boxes=boxes,
            region_mask=rmask,
        )
    with pytest.raises(ValueError, match="zero regions"):
        model(
            ids,
            token_type_ids=types,
            attention_mask=mask,
            region_features=feats[:, :0],
            region_boxes=boxes[:, :0],
            region_mask=rmask[:, :0],
        )
    with pytest.raises(ValueError, match="region_boxes"):
        model(
            ids,
            token_type_ids=types,
            attention_mask=mask,
            region_features=feats,
            region_boxes=boxes[..., :2],
            region_mask=rmask,
        )


def test_shard_feature_size_must_match_the_config(tokenizer):
    from types import SimpleNamespace

    from vlbert.recipes.runner import RunContext
    from vlbert.recipes.vl_pretraining import build_model

    run = {
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "region_feature_dim": 2048,
        }
    }
    ctx = RunContext(run, None, None, None, tokenizer, None)
    with pytest.raises(ValueError, match="1280-d region features but model.region_feature_dim is 2048"):
        mix = SimpleNamespace(active=["mlm"], paired=[])
        build_model(ctx, SimpleNamespace(feature_dim=1280, num_classes=1000, qa_answers=[], objectives=mix))


def test_mrc_cross_entropy_variant():
    torch.manual_seed(3)
    model = VLBertForPreTraining(vl_config(3)).eval()
    ids, types, mask = padded_batch(model.config.vocab_size, seed=4)
    feats, boxes, rmask = region_inputs(seed=5)
    masked = torch.zeros(4, 5, dtype=torch.bool)
    masked[0, 1] = masked[3, 2] = True
    probs = torch.softmax(torch.randn(4, 5, 5), -1)
    top = probs.argmax(-1).masked_fill(~masked, -100)
    out = model(
        ids,
        token_type_ids=types,
        attention_mask=mask,
        region_features=feats,
        region_boxes=boxes,
        region_mask=rmask,
        masked_regions=masked,
        region_class_labels=top,
    )
    assert set(out.losses) == {"mrc"}
    hidden = out.last_hidden_state[:, ids.shape[1] :][masked]
    expected = F.cross_entropy(model.mrc(hidden), probs[masked].argmax(-1))
    torch.testing.assert_close(out.losses["mrc"], expected)
