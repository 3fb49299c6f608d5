"""Looking inside the models: fill-mask against transformers' pipeline, conditioned on regions."""

from __future__ import annotations

import pytest
import torch
import transformers

import vlbert
from vlbert.analysis.fill_mask import fill_mask


@pytest.fixture(scope="module")
def saved_bert(tmp_path_factory, tokenizer):
    """A small BERT with trained-looking (random) MLM weights saved in the Hugging Face layout."""
    torch.manual_seed(0)
    config = vlbert.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = vlbert.BertForPreTraining(config)
    with torch.no_grad():
        model.masked_lm.bias.normal_(0, 2.0)  # spread the distribution so the top-k order is well defined
    path = tmp_path_factory.mktemp("bert")
    model.save_pretrained(path, tokenizer=tokenizer)
    return path


def test_fill_mask_equals_the_transformers_pipeline(saved_bert, tokenizer):
    ours = vlbert.BertForPreTraining.from_pretrained(saved_bert)
    pipe = transformers.pipeline(
        "fill-mask",
        model=transformers.BertForMaskedLM.from_pretrained(saved_bert),
        tokenizer=transformers.AutoTokenizer.from_pretrained(saved_bert),
        top_k=5,
    )
    for text in ("the cat sat on the [MASK].", "[MASK] markets rose and [MASK] fell."):
        expected = pipe(text)
        expected = [expected] if isinstance(expected[0], dict) else expected
        got = fill_mask(ours, tokenizer, text, top_k=5)
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert [x["token"] for x in g] == [x["token"] for x in e]
            assert [x["token_str"] for x in g] == [x["token_str"] for x in e]
            assert [x["score"] for x in g] == pytest.approx([x["score"] for x in e], abs=1e-6)
    with pytest.raises(ValueError, match=r"no \[MASK\]"):
        fill_mask(ours, tokenizer, "no mask here")


def test_fill_mask_pipeline_over_a_model_in_memory_batches_as_transformers(saved_bert, tokenizer):
    """pipeline(model=..., tokenizer=...) over a BertForPreTraining in memory: one forward per batch chunk of
    padded texts, and per text the fillers transformers' fill-mask pipeline gives that text alone."""
    from vlbert.inference import TextFillMaskPipeline, pipeline

    ours = vlbert.BertForPreTraining.from_pretrained(saved_bert)
    forwards = []
    ours.register_forward_hook(lambda module, args, out: forwards.append(1))
    fill = pipeline(model=ours, tokenizer=tokenizer, batch_size=2)
    assert isinstance(fill, TextFillMaskPipeline)
    texts = ["the [MASK] sat.", "[MASK] markets rose and [MASK] fell sharply today.", "a [MASK]"]
    got = fill(texts, top_k=3)
    assert len(forwards) == 2  # 3 texts at batch_size 2: two passes, not one per text
    reference = transformers.pipeline(
        "fill-mask",
        model=transformers.BertForMaskedLM.from_pretrained(saved_bert),
        tokenizer=transformers.AutoTokenizer.from_pretrained(saved_bert),
        top_k=3,
    )
    for text, fillers in zip(texts, got, strict=True):
        expected = reference(text)
        assert isinstance(fillers[0], dict) == isinstance(expected[0], dict)  # transformers' shape: one mask, a list
        fillers, expected = ([fillers], [expected]) if isinstance(expected[0], dict) else (fillers, expected)
        assert [[x["token"] for x in m] for m in fillers] == [[x["token"] for x in m] for m in expected]
        assert [[x["sequence"] for x in m] for m in fillers] == [[x["sequence"] for x in m] for m in expected]
        assert [x["score"] for m in fillers for x in m] == pytest.approx(
            [x["score"] for m in expected for x in m], abs=1e-5
        )  # padding changes nothing but rounding
    with pytest.raises(ValueError, match="needs its tokenizer"):
        pipeline(model=ours)


def test_mask_predict_and_gibbs(saved_bert, tokenizer):
    from vlbert.analysis.generation import gibbs_sample, mask_predict

    model = vlbert.BertForPreTraining.from_pretrained(saved_bert)
    one_pass = mask_predict(model, tokenizer, length=4, iterations=1)[0]
    ids = torch.tensor([[tokenizer.cls_token_id] + [tokenizer.mask_token_id] * 4 + [tokenizer.sep_token_id]])
    with torch.no_grad():
        expected = model.eval()(ids, torch.zeros_like(ids), torch.ones_like(ids)).prediction_logits[0, 1:5].argmax(-1)
    assert one_pass == tokenizer.decode(expected)  # T = 1: every position from one parallel pass
    refined = mask_predict(model, tokenizer, length=4, iterations=4)[0]
    assert tokenizer.mask_token not in refined and len(tokenizer(refined, add_special_tokens=False)["input_ids"]) >= 1
    a, b = (
        gibbs_sample(model, tokenizer, 5, sweeps=2, seed=1, batch=3),
        gibbs_sample(model, tokenizer, 5, sweeps=2, seed=1, batch=3),
    )
    assert a == b and a != gibbs_sample(model, tokenizer, 5, sweeps=2, seed=2, batch=3)
    with pytest.raises(ValueError, match="length and iterations"):
        mask_predict(model, tokenizer, length=0)


def test_head_statistics_on_hand_made_attention():
    from vlbert.analysis.attention_maps import head_statistics

    t = 4  # [CLS] a b [SEP]; head 0 attends to the previous token, head 1 to [CLS]
    previous = torch.zeros(t, t)
    previous[0, 0] = 1
    for i in range(1, t):
        previous[i, i - 1] = 1
    to_cls = torch.zeros(t, t)
    to_cls[:, 0] = 1
    attentions = (torch.stack([previous, to_cls])[None],)
    stats = head_statistics(
        attentions, torch.tensor([[101, 5, 6, 102]]), torch.ones(1, t, dtype=torch.long), cls_id=101, sep_id=102
    )
    assert stats["previous"][0].tolist() == pytest.approx([3 / 4, 1 / 4])
    assert stats["cls"][0].tolist() == pytest.approx([2 / 4, 1.0])
    assert stats["next"][0].tolist() == pytest.approx([0.0, 0.0])


def test_probe_finds_the_layer_that_holds_the_label():
    """Layer 2 of 4 carries the label (plus noise), the others noise: the mix weights peak there and so does the
    per-layer accuracy."""
    from vlbert.analysis.probing import probe_layers

    g = torch.Generator().manual_seed(0)

    def make(n):
        labels = torch.randint(0, 3, (n,), generator=g)
        x = torch.randn(n, 4, 8, generator=g)
        x[:, 2, :3] += 3 * torch.nn.functional.one_hot(labels, 3).float()
        return x, labels

    (tx, ty), (ex, ey) = make(400), make(200)
    result = probe_layers(tx, ty, ex, ey, steps=200)
    assert max(range(4), key=lambda i: result.mix_weights[i]) == 2 and abs(result.expected_layer - 2) < 0.5
    assert result.layer_accuracy[2] > 0.9 and max(result.layer_accuracy[:2] + result.layer_accuracy[3:]) < 0.6
    assert result.mix_accuracy > 0.9 > result.majority_accuracy + 0.4
