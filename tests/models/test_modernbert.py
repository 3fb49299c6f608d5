"""vlbert's ModernBERT on the library's own paths: every attention kernel (sliding windows included) gives eager's
values and gradients, a kernel without windows falls back in one log line, the collator's layout changes nothing,
the fill-mask pipeline equals transformers', and bad configurations or checkpoints are refused in one line."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

import vlbert
from vlbert.inference import TextFillMaskPipeline, pipeline
from vlbert.layers.attention import ATTENTION_FUNCTIONS, register_attention, sdpa_attention
from vlbert.layers.unpadded import unpadded_layout


def tiny(**overrides) -> vlbert.ModernBertConfig:
    values = dict(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=96,
        local_attention=8,
        global_attn_every_n_layers=2,
        pad_token_id=0,
    )
    return vlbert.ModernBertConfig(**{**values, **overrides})


def ragged(vocab_size: int = 101, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (3, 30), generator=g)
    mask = (torch.arange(30)[None] < torch.tensor([[30], [17], [4]])).long()
    labels = torch.where((torch.rand(ids.shape, generator=g) < 0.4) & mask.bool(), ids, -100)
    return ids, mask, labels


def run(kernel: str, state: dict, layout: bool = False):
    model = vlbert.ModernBertForMaskedLM(tiny(attn_implementation=kernel)).train()  # dropouts 0: deterministic
    model.load_state_dict(state)
    ids, mask, labels = ragged()
    out = model(ids, mask, labels=labels, layout=unpadded_layout(mask) if layout else None)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_every_kernel_equals_eager_with_sliding_windows_values_and_gradients():
    torch.manual_seed(0)
    state = vlbert.ModernBertForMaskedLM(tiny()).state_dict()
    loss, grads = run("eager", state)
    for kernel, layout in (("sdpa", False), ("varlen", False), ("varlen", True), ("sdpa", True)):
        other_loss, other_grads = run(kernel, state, layout)
        torch.testing.assert_close(other_loss, loss, atol=1e-6, rtol=0)
        for name, grad in grads.items():
            torch.testing.assert_close(other_grads[name], grad, atol=1e-6, rtol=1e-5, msg=f"{kernel}: {name}")


def test_a_kernel_without_windows_falls_back_in_one_line_for_the_local_layers(caplog):
    def plain(q, k, v, unpadding, dropout_p, training, output_attentions=False):
        return sdpa_attention(q, k, v, unpadding, dropout_p, training, output_attentions)

    register_attention("test-no-window", plain)
    try:
        torch.manual_seed(1)
        model = vlbert.ModernBertForMaskedLM(tiny(attn_implementation="test-no-window")).eval()
        ids, mask, _ = ragged(seed=1)
        with caplog.at_level(logging.WARNING, logger="vlbert.layers.attention"):
            kernels = model.bert.encoder.kernels(model.bert.embeddings(ids), False)
            got = model(ids, mask).prediction_logits
        assert kernels == {None: "test-no-window", 4: "sdpa"}
        assert [r.getMessage() for r in caplog.records] == [
            "attention: test-no-window cannot run here (it takes no sliding window (a local layer's 4 positions "
            "each side)); using sdpa"
        ]
        model.bert.encoder.attn_implementation = "sdpa"
        torch.testing.assert_close(got, model(ids, mask).prediction_logits)
    finally:
        del ATTENTION_FUNCTIONS["test-no-window"]


def test_fill_mask_equals_the_transformers_pipeline(tmp_path, tokenizer):
    config = transformers.ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        local_attention=8,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        cls_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        sep_token_id=tokenizer.sep_token_id,
        attn_implementation="sdpa",
    )
    torch.manual_seed(2)
    hf = transformers.ModernBertForMaskedLM(config).eval()
    with torch.no_grad():
        hf.decoder.bias.normal_(0, 2.0)  # a spread distribution: a well-defined top-k order
    hf.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    ours = vlbert.ModernBertForMaskedLM.from_pretrained(tmp_path)
    reference = transformers.pipeline("fill-mask", model=hf, tokenizer=tokenizer, top_k=3)
    fill = pipeline(model=ours, tokenizer=tokenizer, batch_size=2)
    assert isinstance(fill, TextFillMaskPipeline)
    texts = ["the cat sat on the [MASK].", "[MASK] markets rose and [MASK] fell sharply today."]
    for text, fillers in zip(texts, fill(texts, top_k=3), strict=True):
        expected = reference(text)
        fillers, expected = ([fillers], [expected]) if isinstance(expected[0], dict) else (fillers, expected)
        assert [[x["token"] for x in m] for m in fillers] == [[x["token"] for x in m] for m in expected]
        assert [[x["sequence"] for x in m] for m in fillers] == [[x["sequence"] for x in m] for m in expected]
        assert [x["score"] for m in fillers for x in m] == pytest.approx(
            [x["score"] for m in expected for x in m], abs=1e-5
        )


def one_line_error(call, *words):
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_bad_configurations_and_checkpoints_are_refused_in_one_line(tmp_path):
    # a window that covers every position of the longest sequence: the local layers would be global
    one_line_error(
        lambda: tiny(local_attention=200), "local_attention=200", "below 190", "global_attn_every_n_layers=1"
    )
    tiny(local_attention=200, global_attn_every_n_layers=1)  # no local layer: nothing to refuse
    one_line_error(lambda: tiny(hidden_size=36, num_attention_heads=4), "even head size")
    one_line_error(lambda: tiny(layer_types=["full_attention"]), "layer_types", "global_attn_every_n_layers")
    rope = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1.0}}
    one_line_error(lambda: vlbert.ModernBertConfig.from_dict({"rope_parameters": rope}), "rope_type='linear'")
    # a BERT checkpoint (learned absolute positions) is not a ModernBERT, and the other way round
    bert = vlbert.BertForPreTraining(
        vlbert.BertConfig(
            vocab_size=101, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40
        )
    )
    bert.save_pretrained(tmp_path / "bert")
    one_line_error(
        lambda: vlbert.ModernBertForMaskedLM.from_pretrained(tmp_path / "bert"),
        "model_type='bert'",
        "learned absolute positions",
        "vlbert.BertModel",
    )
    one_line_error(
        lambda: vlbert.ModernBertForMaskedLM.from_pretrained(tmp_path / "bert", config=tiny()),
        "position_embeddings",
        "vlbert.BertModel",
    )
    vlbert.ModernBertForMaskedLM(tiny()).save_pretrained(tmp_path / "modernbert")
    one_line_error(
        lambda: vlbert.BertModel.from_pretrained(tmp_path / "modernbert"), "model_type='modernbert'", "ModernBertModel"
    )
