"""Fine-tuning heads equal their transformers counterparts with the same weights (logits and loss), plus span
decoding, layer mixing and label errors."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers.builders import padded_batch, random_hf_config

import vlbert
from vlbert import checkpoint as ckpt
from vlbert.models import heads

ATOL = 1e-5


def pair(hf_cls, ours_cls, seed, **config):
    torch.manual_seed(seed)
    hf = hf_cls(random_hf_config(seed, **config)).eval()
    ours = ours_cls(vlbert.BertConfig.from_dict(hf.config.to_dict())).eval()
    info = ours.load_converted_state_dict(ckpt.hf_to_vlbert(hf.state_dict()), strict=True)
    assert not info.missing_keys and not info.unexpected_keys
    return hf, ours


@pytest.mark.parametrize("num_labels, kind", [(3, "single"), (1, "regression"), (4, "multi")])
def test_sequence_classification(num_labels, kind):
    hf, ours = pair(
        transformers.BertForSequenceClassification, heads.BertForSequenceClassification, 1, num_labels=num_labels
    )
    ids, types, mask = padded_batch(hf.config.vocab_size, seed=2)
    g = torch.Generator().manual_seed(0)
    labels = {
        "single": torch.randint(0, num_labels, (4,), generator=g),
        "regression": torch.rand(4, generator=g),
        "multi": (torch.rand(4, num_labels, generator=g) > 0.5).float(),
    }[kind]
    a = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)
    b = ours(ids, types, mask, labels=labels)
    torch.testing.assert_close(b.logits, a.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=ATOL, rtol=0)


def test_token_classification():
    hf, ours = pair(transformers.BertForTokenClassification, heads.BertForTokenClassification, 3, num_labels=5)
    ids, types, mask = padded_batch(hf.config.vocab_size, seed=3)
    labels = torch.randint(0, 5, ids.shape).masked_fill(mask == 0, -100)
    a = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)
    b = ours(ids, types, mask, labels=labels)
    torch.testing.assert_close(b.logits[mask.bool()], a.logits[mask.bool()], atol=ATOL, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=ATOL, rtol=0)


def test_question_answering():
    hf, ours = pair(transformers.BertForQuestionAnswering, heads.BertForQuestionAnswering, 4)
    ids, types, mask = padded_batch(hf.config.vocab_size, seed=4)
    start, end = torch.tensor([1, 2, 0, 40]), torch.tensor([3, 2, 1, 50])  # the last is out of range: ignored
    a = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, start_positions=start, end_positions=end)
    b = ours(ids, types, mask, start_positions=start, end_positions=end)
    real = mask.bool()
    torch.testing.assert_close(b.start_logits[real], a.start_logits[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(b.end_logits[real], a.end_logits[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=ATOL, rtol=0)


def test_multiple_choice():
    hf, ours = pair(transformers.BertForMultipleChoice, heads.BertForMultipleChoice, 5)
    ids, types, mask = padded_batch(hf.config.vocab_size, batch=6, seed=5)
    ids, types, mask = (x.view(2, 3, -1) for x in (ids, types, mask))
    labels = torch.tensor([2, 0])
    a = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)
    b = ours(ids, types, mask, labels=labels)
    torch.testing.assert_close(b.logits, a.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=ATOL, rtol=0)


def test_head_checkpoint_loads_in_transformers(tmp_path):
    model = heads.BertForSequenceClassification(
        vlbert.BertConfig.from_dict(random_hf_config(6, num_labels=5).to_dict())
    )
    model.eval().save_pretrained(tmp_path)
    hf, info = transformers.BertForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert hf.config.num_labels == 5 and not info["missing_keys"] and not info["unexpected_keys"]
    ids, types, mask = padded_batch(model.config.vocab_size, seed=6)
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, types, mask).logits,
            hf.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask).logits,
            atol=ATOL,
            rtol=0,
        )


def test_best_span_hand_worked():
    start = torch.tensor([[0.0, 5.0, 1.0, 9.0, 0.0]])
    end = torch.tensor([[0.0, 0.0, 6.0, 0.0, 2.0]])
    # Unconstrained argmaxes (start 3, end 2) are not a span; best valid: start 3 end 4 (9 + 2 = 11) vs 1..2 (11):
    s, e, score = heads.best_span(start, end, max_answer_length=5)
    assert score.item() == 11.0 and (s.item(), e.item()) in {(1, 2), (3, 4)}
    s, e, score = heads.best_span(start, end, max_answer_length=1)  # single-token spans only
    assert (s.item(), e.item(), score.item()) == (3, 3, 9.0)
    allowed = torch.tensor([[True, True, True, False, False]])
    s, e, _ = heads.best_span(start, end, allowed=allowed)
    assert (s.item(), e.item()) == (1, 2)


def test_scalar_mix_and_layer_features():
    states = tuple(torch.full((1, 2, 3), float(i)) for i in range(5))
    mix = heads.ScalarMix(5)
    torch.testing.assert_close(mix(states), torch.full((1, 2, 3), 2.0))  # uniform weights: the mean
    assert heads.layer_features(states, "last")[0, 0, 0] == 4
    assert heads.layer_features(states, "second_to_last")[0, 0, 0] == 3
    assert heads.layer_features(states, "sum_last_four")[0, 0, 0] == 1 + 2 + 3 + 4
    assert heads.layer_features(states, "concat_last_four").shape == (1, 2, 12)
    with pytest.raises(ValueError, match="ScalarMix over 5"):
        mix(states[:3])


def test_label_outside_num_labels():
    model = heads.BertForSequenceClassification(
        vlbert.BertConfig.from_dict(random_hf_config(7, num_labels=3).to_dict())
    )
    ids, types, mask = padded_batch(model.config.vocab_size)
    with pytest.raises(ValueError, match="outside \\[0, num_labels=3\\)"):
        model(ids, types, mask, labels=torch.tensor([0, 1, 3, 2]))
