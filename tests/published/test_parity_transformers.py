"""vlbert's BERT equals transformers' BERT with the same weights (fp32, eval mode, padded batches)."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers.builders import padded_batch, random_hf_config

import vlbert
from vlbert import checkpoint as ckpt

ATOL = 1e-5


def pair_from_hf(hf_model, ours_cls):
    config = vlbert.BertConfig.from_dict(hf_model.config.to_dict())
    ours = ours_cls(config).eval()
    info = ours.load_converted_state_dict(ckpt.hf_to_vlbert(hf_model.state_dict()), strict=True)
    assert info.missing_keys == [] and info.unexpected_keys == []
    return ours


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_pretraining_outputs_match_transformers(seed):
    torch.manual_seed(seed)
    hf_config = random_hf_config(seed)
    hf = transformers.BertForPreTraining(hf_config).eval()
    ours = pair_from_hf(hf, vlbert.BertForPreTraining)
    ids, types, mask = padded_batch(
        hf_config.vocab_size,
        seq_len=hf_config.max_position_embeddings // 2,
        seed=seed,
        type_vocab_size=hf_config.type_vocab_size,
    )
    with torch.no_grad():
        a = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
        b = ours(ids, types, mask, output_hidden_states=True)
    assert len(a.hidden_states) == len(b.hidden_states) == hf_config.num_hidden_layers + 1
    real = mask.bool()
    for ha, hb in zip(a.hidden_states, b.hidden_states, strict=True):
        torch.testing.assert_close(hb[real], ha[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(b.prediction_logits[real], a.prediction_logits[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(b.seq_relationship_logits, a.seq_relationship_logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("seed", [0, 5])
def test_loss_and_gradients_match_transformers(seed):
    torch.manual_seed(seed)
    hf_config = random_hf_config(seed)
    hf = transformers.BertForPreTraining(hf_config).eval()
    ours = pair_from_hf(hf, vlbert.BertForPreTraining)
    ids, types, mask = padded_batch(hf_config.vocab_size, seed=seed, type_vocab_size=hf_config.type_vocab_size)
    g = torch.Generator().manual_seed(seed)
    labels = torch.where((torch.rand(ids.shape, generator=g) < 0.3) & mask.bool(), ids, -100)
    labels[0, 1] = ids[0, 1]  # at least one masked position
    nsp = torch.randint(0, 2, (ids.shape[0],), generator=g)
    a = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels, next_sentence_label=nsp)
    b = ours(ids, types, mask, labels=labels, next_sentence_label=nsp)
    torch.testing.assert_close(b.loss, a.loss, atol=ATOL, rtol=0)
    # Sparse MLM: [N, V] logits are the masked rows of transformers' dense [B, T, V] logits.
    torch.testing.assert_close(b.prediction_logits, a.prediction_logits[labels != -100], atol=ATOL, rtol=0)
    assert b.prediction_logits.shape == ((labels != -100).sum().item(), hf_config.vocab_size)
    a.loss.backward()
    b.loss.backward()
    hf_grads = ckpt.hf_to_vlbert({n: p.grad for n, p in hf.named_parameters() if p.grad is not None})
    ours_grads = {n: p.grad for n, p in ours.named_parameters()}
    # The tied decoder/word-embedding matrix gathers gradient from both uses in both libraries.
    for name, grad in ours_grads.items():
        torch.testing.assert_close(grad, hf_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_packaged_minilm_matches_transformers(minilm_dir, tokenizer):
    hf = transformers.BertModel.from_pretrained(minilm_dir).eval()
    ours = vlbert.BertModel.from_pretrained(minilm_dir).eval()
    assert ours.loading_info.missing_keys == [] and ours.loading_info.unexpected_keys == []
    enc = tokenizer(
        ["A blue rectangle sits on a red background.", "Markets fell sharply in London today."],
        ["Is the shape blue?", "Shares closed lower."],
        padding=True,
        return_tensors="pt",
    )
    enc["attention_mask"][1, -2:] = 0  # extra padding inside the batch
    with torch.no_grad():
        a = hf(**enc, output_hidden_states=True)
        b = ours(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"], output_hidden_states=True)
    real = enc["attention_mask"].bool()
    for ha, hb in zip(a.hidden_states, b.hidden_states, strict=True):
        torch.testing.assert_close(hb[real], ha[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(b.pooler_output, a.pooler_output, atol=ATOL, rtol=0)


def test_attention_ignores_padding():
    """Changing padded tokens changes nothing at real positions (key padding mask works)."""
    torch.manual_seed(0)
    model = vlbert.BertModel(vlbert.BertConfig.from_dict(random_hf_config(3).to_dict())).eval()
    ids, types, mask = padded_batch(model.config.vocab_size, seed=1)
    other = ids.clone()
    other[mask == 0] = 7
    with torch.no_grad():
        a = model(ids, types, mask).last_hidden_state
        b = model(other, types, mask).last_hidden_state
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()], atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", [0, 2])
def test_attentions_match_transformers_eager(seed):
    """output_attentions: one [B, heads, T, T] tensor per layer, equal to transformers' eager attention
    probabilities at every real query; the hidden states stay equal on that path too."""
    torch.manual_seed(seed)
    hf_config = random_hf_config(seed, attn_implementation="eager")
    hf = transformers.BertForPreTraining(hf_config).eval()
    ours = pair_from_hf(hf, vlbert.BertForPreTraining)
    ids, types, mask = padded_batch(
        hf_config.vocab_size, seq_len=16, seed=seed, type_vocab_size=hf_config.type_vocab_size
    )
    with torch.no_grad():
        a = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, output_attentions=True)
        b = ours(ids, types, mask, output_attentions=True)
    assert len(b.attentions) == hf_config.num_hidden_layers
    real = mask.bool()
    for pa, pb in zip(a.attentions, b.attentions, strict=True):
        assert pb.shape == (4, hf_config.num_attention_heads, 16, 16)
        torch.testing.assert_close(pb.transpose(1, 2)[real], pa.transpose(1, 2)[real], atol=1e-6, rtol=0)
    torch.testing.assert_close(b.prediction_logits[real], a.prediction_logits[real], atol=ATOL, rtol=0)
    assert ours(ids, types, mask).attentions is None  # nothing computed unless asked


def test_vl_attentions_cover_text_and_regions():
    torch.manual_seed(0)
    config = vlbert.VLBertConfig.from_dict({**random_hf_config(1).to_dict(), "region_feature_dim": 6})
    model = vlbert.VLBertModel(config).eval()
    ids, types, mask = padded_batch(config.vocab_size, seq_len=10)
    feats = torch.randn(4, 3, 6)
    boxes = torch.tensor([0.0, 0.0, 0.5, 0.5]).expand(4, 3, 4)
    region_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    with torch.no_grad():
        out = model(
            ids,
            token_type_ids=types,
            attention_mask=mask,
            region_features=feats,
            region_boxes=boxes,
            region_mask=region_mask,
            output_attentions=True,
        )
        text_only = model(
            ids,
            token_type_ids=types,
            attention_mask=mask,
            region_features=feats,
            region_boxes=boxes,
            region_mask=torch.zeros_like(region_mask),
            output_attentions=True,
        )
        bert = vlbert.BertModel(vlbert.BertConfig.from_dict(random_hf_config(1).to_dict())).eval()
        bert.load_converted_state_dict({"bert." + k: v for k, v in model.state_dict().items()})
        plain = bert(ids, types, mask, output_attentions=True)
    keys = torch.cat([mask, region_mask], 1).bool()
    for p in out.attentions:
        assert p.shape == (4, config.num_attention_heads, 13, 13)
        torch.testing.assert_close(
            p.sum(-1)[keys[:, None].expand_as(p.sum(-1))], torch.ones(int(keys.sum()) * p.shape[1])
        )
        assert (p.transpose(1, 3)[~keys] == 0).all()  # padded text and regions receive nothing
    real = mask.bool()
    for pv, pt in zip(
        text_only.attentions, plain.attentions, strict=True
    ):  # regions masked out: BERT's attention on the text
        torch.testing.assert_close(
            pv[:, :, :10, :10].transpose(1, 2)[real], pt.transpose(1, 2)[real], atol=1e-6, rtol=0
        )
