"""vlbert's ModernBERT equals transformers' ModernBERT with the same weights (float32, eval mode): logits and every
hidden state within 1e-5 on padded, ragged and left-padded batches longer than the local window, through each of
the library's attention kernels; a directory saved by either loads in the other."""

from __future__ import annotations

import pytest
import torch
import transformers

import vlbert

ATOL = 1e-5

#: small configs that differ where ModernBERT's options differ (window, global period, biases, activations, pooling)
VARIANTS = [
    dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=4, local_attention=16, global_attn_every_n_layers=3),
    dict(
        hidden_size=48,
        num_attention_heads=2,
        num_hidden_layers=3,
        local_attention=8,
        global_attn_every_n_layers=2,
        attention_bias=True,
        mlp_bias=True,
        norm_bias=True,
        classifier_bias=True,
        hidden_activation="gelu_pytorch_tanh",
        classifier_pooling="mean",
    ),
]


def hf_config(variant: int, implementation: str = "eager", **overrides) -> transformers.ModernBertConfig:
    values = dict(
        vocab_size=97,
        intermediate_size=40,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        global_rope_theta=160_000.0,
        local_rope_theta=10_000.0,
        attn_implementation=implementation,
        **VARIANTS[variant],
    )
    values.update(overrides)
    return transformers.ModernBertConfig(**values)


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn anew (norms and biases too, which start at 1 and 0), so a misplaced one shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            centre, spread = (1.0, 0.2) if "norm" in name and name.endswith("weight") else (0.0, 0.08)
            p.copy_(centre + spread * torch.randn(p.shape, generator=g))


def batches(vocab_size: int, seed: int) -> list[torch.Tensor]:
    """(input_ids, attention_mask) pairs: full, right-padded ragged, one left-padded row, lengths up to 70 (beyond
    every variant's window), and one short batch inside the window."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for b, t, lengths, left in (
        (2, 70, (70, 70), False),
        (4, 70, (70, 33, 9, 1), False),
        (3, 40, (40, 17, 25), True),
        (2, 5, (5, 3), False),
    ):
        ids = torch.randint(3, vocab_size, (b, t), generator=g)
        mask = torch.zeros(b, t, dtype=torch.long)
        for row, n in enumerate(lengths):
            if left and row == b - 1:
                mask[row, t - n :] = 1
            else:
                mask[row, :n] = 1
        out.append((ids.masked_fill(mask == 0, 0), mask))
    return out


def ours_from(hf_model, cls, attn_implementation: str):
    config = vlbert.ModernBertConfig.from_dict(
        {**hf_model.config.to_dict(), "attn_implementation": attn_implementation}
    )
    ours = cls(config).eval()
    info = ours.load_converted_state_dict(cls.from_hf_state_dict(hf_model.state_dict()), strict=True)
    assert info.missing_keys == [] and info.unexpected_keys == []
    return ours


@pytest.mark.parametrize(
    ("variant", "theirs", "kernel"),
    [(0, "eager", "eager"), (1, "sdpa", "sdpa"), (0, "sdpa", "varlen"), (1, "eager", "varlen")],
)
def test_masked_lm_logits_and_hidden_states_match_transformers(variant, theirs, kernel):
    torch.manual_seed(variant)
    hf = transformers.ModernBertForMaskedLM(hf_config(variant, theirs)).eval()
    randomise(hf, variant)
    ours = ours_from(hf, vlbert.ModernBertForMaskedLM, kernel)
    for ids, mask in batches(hf.config.vocab_size, variant):
        with torch.no_grad():
            a = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            b = ours(ids, mask, output_hidden_states=True)
        real = mask.bool()
        assert len(a.hidden_states) == len(b.hidden_states) == hf.config.num_hidden_layers + 1
        for ha, hb in zip(a.hidden_states, b.hidden_states, strict=True):
            torch.testing.assert_close(hb[real], ha[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(b.prediction_logits[real], a.logits[real], atol=ATOL, rtol=0)


def test_the_local_window_is_what_changes_the_outputs():
    """A sequence longer than the window: the same weights with every layer global give other states (so the
    parity above tests the window), and our window is transformers' (+-local_attention // 2, inclusive)."""
    hf = transformers.ModernBertForMaskedLM(hf_config(0)).eval()
    randomise(hf, 3)
    ours = ours_from(hf, vlbert.ModernBertForMaskedLM, "sdpa")
    ids, mask = batches(hf.config.vocab_size, 3)[0]
    everywhere = ours_from(hf, vlbert.ModernBertForMaskedLM, "sdpa")
    for layer in everywhere.bert.encoder.layers:
        layer.window = None
    with torch.no_grad():
        local, dense = ours(ids, mask).prediction_logits, everywhere(ids, mask).prediction_logits
    assert (local - dense).abs().max() > 1e-3
    assert ours.config.sliding_window == hf.config.sliding_window == 8


def test_masked_lm_loss_matches_transformers():
    hf = transformers.ModernBertForMaskedLM(hf_config(1, "sdpa")).eval()
    randomise(hf, 5)
    ours = ours_from(hf, vlbert.ModernBertForMaskedLM, "varlen")
    ids, mask = batches(hf.config.vocab_size, 5)[1]
    g = torch.Generator().manual_seed(5)
    labels = torch.where((torch.rand(ids.shape, generator=g) < 0.3) & mask.bool(), ids, -100)
    labels[0, 0] = ids[0, 0]
    with torch.no_grad():
        a, b = hf(input_ids=ids, attention_mask=mask, labels=labels), ours(ids, mask, labels=labels)
    torch.testing.assert_close(b.loss, a.loss, atol=ATOL, rtol=0)
    torch.testing.assert_close(b.prediction_logits, a.logits[labels != -100], atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", [0, 1])
def test_a_directory_saved_by_either_loads_in_the_other(tmp_path, variant):
    hf = transformers.ModernBertForMaskedLM(hf_config(variant)).eval()
    randomise(hf, 7 + variant)
    hf.save_pretrained(tmp_path / "theirs")
    ours = vlbert.ModernBertForMaskedLM.from_pretrained(tmp_path / "theirs").eval()
    assert ours.loading_info.missing_keys == [] and ours.loading_info.unexpected_keys == []
    ours.save_pretrained(tmp_path / "ours")
    back, info = transformers.ModernBertForMaskedLM.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert back.config.layer_types == hf.config.layer_types and back.config.sliding_window == hf.config.sliding_window
    assert back.config.rope_parameters == hf.config.rope_parameters
    ids, mask = batches(hf.config.vocab_size, variant)[1]
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).logits
        for logits in (ours(ids, mask).prediction_logits, back.eval()(input_ids=ids, attention_mask=mask).logits):
            torch.testing.assert_close(logits[mask.bool()], expected[mask.bool()], atol=ATOL, rtol=0)
    bare = vlbert.ModernBertModel.from_pretrained(tmp_path / "theirs")  # the encoder alone, heads reported unused
    assert bare.loading_info.missing_keys == [] and "head.dense.weight" in bare.loading_info.unexpected_keys
    bare.save_pretrained(tmp_path / "bare")
    _, info = transformers.ModernBertModel.from_pretrained(tmp_path / "bare", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


@pytest.mark.parametrize("variant", [0, 1])
def test_task_heads_match_transformers_and_start_from_a_masked_lm_checkpoint(tmp_path, variant):
    """Sequence classification (cls and mean pooling) and token classification from transformers' saved heads give
    transformers' logits; from a masked-LM directory the prediction head loads and only the classifier is new."""
    pairs = (
        (transformers.ModernBertForSequenceClassification, vlbert.ModernBertForSequenceClassification),
        (transformers.ModernBertForTokenClassification, vlbert.ModernBertForTokenClassification),
    )
    ids, mask = batches(97, variant)[1]
    real = mask.bool()
    for theirs_cls, ours_cls in pairs:
        hf = theirs_cls(hf_config(variant, "sdpa", num_labels=3)).eval()
        randomise(hf, 11)
        hf.save_pretrained(tmp_path / theirs_cls.__name__)
        ours = ours_cls.from_pretrained(tmp_path / theirs_cls.__name__).eval()
        assert ours.loading_info.missing_keys == [] and ours.loading_info.unexpected_keys == []
        with torch.no_grad():
            a, b = hf(input_ids=ids, attention_mask=mask).logits, ours(ids, mask).logits
        if a.dim() == 3:
            a, b = a[real], b[real]
        torch.testing.assert_close(b, a, atol=ATOL, rtol=0)
    mlm = transformers.ModernBertForMaskedLM(hf_config(variant))
    mlm.save_pretrained(tmp_path / "mlm")
    head = vlbert.ModernBertForSequenceClassification.from_pretrained(tmp_path / "mlm", num_labels=3)
    assert head.loading_info.missing_keys == ["classifier.bias", "classifier.weight"]
    torch.testing.assert_close(head.head.dense.weight, mlm.head.dense.weight)
    labels = torch.tensor([0, 2, 1, 1])
    out = head(ids, mask, labels=labels)
    assert out.loss is not None and "cls_accuracy" in out.metrics
