"""Text tasks' figures against the benchmarks' official evaluators (tests/helpers/text_references.py: conlleval.pl,
evaluate-v1.1.py, evaluate-v2.0.py, GLUE's metric code, each restated from a named commit) and the libraries GLUE
and CoNLL use (scikit-learn, scipy, seqeval).

The recipe-level tests run the text recipe's evaluation (:func:`vlbert.recipes.text_classification.evaluate`: the
data it reads, its windows, its predictions files) over models whose outputs are fixed rules of their input tokens,
so every figure is known in advance; the official code then reads the files the recipe wrote and must give the
figure the recipe logged.
"""

from __future__ import annotations

import json
import logging
import math
import random
import types
import warnings

import numpy as np
import pytest
import torch
from helpers.builders import write_jsonl
from helpers.text_references import conlleval, glue, squad_dataset, squad_v1, squad_v2

from vlbert.data.finetuning import TextTaskConfig, max_context_window, window_spans
from vlbert.evaluation import text as m
from vlbert.recipes.runner import RunContext
from vlbert.recipes.text_classification import TextTaskData, evaluate
from vlbert.training.run_config import dataclass_from_section
from vlbert.training.training_config import TrainingConfig


def recipe_data(tmp_path, tokenizer, data: dict) -> tuple[RunContext, TextTaskData]:
    """The text recipe's context and data for a ``data`` section, as ``run`` builds them."""
    training = TrainingConfig.from_dict({"output_dir": str(tmp_path / "run"), "batch_size": 4})
    ctx = RunContext({}, training, dataclass_from_section(TextTaskConfig, data, "data"), None, tokenizer, None)
    return ctx, TextTaskData(ctx)


class RuleModel(torch.nn.Module):
    """A stand-in for a fine-tuned head: its outputs are fixed rules of the input token ids (``rule(input_ids,
    attention_mask) -> dict of output tensors``)."""

    def __init__(self, rule):
        super().__init__()
        self.rule = rule
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # the recipe reads the device from a parameter

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        return types.SimpleNamespace(**self.rule(input_ids, attention_mask))


# --- windows ------------------------------------------------------------------------------------------------------


def test_windows_and_max_context_as_run_squad():
    # run_squad.py's _check_is_max_context example: "the man went to the store and bought a gallon of milk",
    # span B = "to the store and bought" (tokens 3-7), C = "and bought a gallon of" (6-10): 'bought' (7) is
    # max context in C (1 left, 3 right) rather than B (4 left, 0 right).
    spans = [(0, 5), (3, 5), (6, 5)]
    assert max_context_window(spans, 7) == 2 and max_context_window(spans, 4) == 1 and max_context_window(spans, 0) == 0
    assert max_context_window(spans, 11) is None
    # Doc spans: stride 4 over 11 pieces in windows of 5; the last reaches the end; a stride above the window
    # length still skips nothing.
    assert window_spans(11, 5, 4) == [(0, 5), (4, 5), (8, 3)]
    assert window_spans(11, 5, 9) == [(0, 5), (5, 5), (10, 1)]
    assert window_spans(3, 5, 2) == [(0, 3)] and window_spans(0, 5, 2) == [(0, 0)]


# --- token tagging ------------------------------------------------------------------------------------------------


def single_piece_words(tokenizer, n: int) -> list[str]:
    """``n`` distinct lowercase words of one wordpiece each."""
    words = []
    for token in tokenizer.convert_ids_to_tokens(list(range(2000, 4000))):
        if token.isalpha() and len(token) >= 3 and tokenizer.tokenize(token) == [token] and token not in words:
            words.append(token)
        if len(words) == n:
            return words
    raise AssertionError("not enough single-piece words")


def tagging_fixture(tokenizer):
    """A 92-word sentence with 15 entities (one of 3 words whose middle word is a soft hyphen, which has no
    wordpiece) and an 8-word sentence with 2 entities and a zero-width space (no wordpiece either) tagged O."""
    words = single_piece_words(tokenizer, 99)
    tokens, tags = words[:92], ["O"] * 92
    for j in range(15):
        p, kind = 3 + 6 * j, ("PER", "LOC", "ORG")[j % 3]
        tags[p], tags[p + 1] = f"B-{kind}", f"I-{kind}"
        if j == 10:  # word 63 B-LOC, 64 the soft hyphen (I-LOC), 65 I-LOC
            tokens[p + 1], tags[p + 2] = "\u00ad", f"I-{kind}"
    short = {
        "tokens": [*words[92:95], "\u200b", *words[95:99]],
        "tags": ["O", "O", "B-PER", "O", "O", "B-LOC", "O", "O"],
    }
    return [{"tokens": tokens, "tags": tags}, short]


def test_tagging_scores_every_word_of_long_sentences_as_conlleval(tmp_path, tokenizer):
    """A 92-word sentence in windows of 30 wordpieces: every word is scored (it used to be cut to the first
    window's 30 words, and the soft hyphen left out of gold and prediction), each from the window where it has the
    most context, and the soft hyphen, which no window holds, is predicted O. The model tags a word right only
    where it has at least 2 words of context each side in its window, so reading a word from any other window than
    its max-context one loses an entity. conlleval over the recipe's own predictions file: 15 gold entities, 16
    predicted (the soft hyphen splits one entity in two), 14 right: F1 = 28/31 = 0.9032 over that sentence, 32/35
    with the short one (0886c57's recipe scored 37 of the 100 words and reported 0.857)."""
    records = tagging_fixture(tokenizer)
    write_jsonl(tmp_path / "t.jsonl", records)
    path = str(tmp_path / "t.jsonl")
    ctx, data = recipe_data(
        tmp_path,
        tokenizer,
        {"dataset": "custom", "type": "tagging", "train": path, "eval": path, "max_seq_length": 32, "doc_stride": 8},
    )
    names = data.labels
    truth = {
        tokenizer.convert_tokens_to_ids(w): names.index(t)
        for r in records
        for w, t in zip(r["tokens"], r["tags"], strict=True)
        if w not in ("\u00ad", "\u200b")
    }

    def rule(input_ids, attention_mask):
        b, t = input_ids.shape
        logits = torch.zeros(b, t, len(names))
        for i in range(b):
            n = int(attention_mask[i].sum())
            for p in range(1, n - 1):
                context = min(p - 1, n - 2 - p)  # words left and right of it in this window
                label = truth[int(input_ids[i, p])] if context >= 2 else names.index("O")
                logits[i, p, label] = 1.0
        return {"logits": logits}

    metrics = evaluate(ctx, data, RuleModel(rule))
    rows = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert [len(r["predicted_tags"]) for r in rows] == [92, 8]
    assert [r["tokens"] for r in rows] == [r["tokens"] for r in records] and [r["tags"] for r in rows] == [
        r["tags"] for r in records
    ]
    assert rows[0]["predicted_tags"][64] == "O" and rows[1]["predicted_tags"][3] == "O"  # no wordpiece: O
    official = conlleval([(r["tags"], r["predicted_tags"]) for r in rows])
    assert (official["found_correct"], official["found_guessed"], official["correct_chunks"]) == (17, 18, 16)
    assert metrics["entity_f1"] == pytest.approx(official["f1"], abs=1e-12) == pytest.approx(32 / 35)
    assert metrics["token_accuracy"] == pytest.approx(official["accuracy"]) == pytest.approx(99 / 100)
    assert (metrics["eval_sentences"], metrics["eval_words"], metrics["eval_words_without_wordpieces"]) == (2, 100, 2)
    long_only = conlleval([(rows[0]["tags"], rows[0]["predicted_tags"])])
    assert long_only["f1"] == pytest.approx(28 / 31)  # 0.9032


def test_seqeval_default_mode_is_conlleval():
    """entity_f1 (seqeval's default mode) equals conlleval.pl's FB1 on random IOB sequences with every kind of
    ill-formed chunk (I- after O, I- of another type, B- inside a chunk), across sentence boundaries."""
    rng = random.Random(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG", "B-MISC-X", "I-MISC-X"]
    for _ in range(300):
        sentences = []
        for _ in range(rng.randint(1, 4)):
            n = rng.randint(1, 8)
            sentences.append(([rng.choice(tags) for _ in range(n)], [rng.choice(tags) for _ in range(n)]))
        gold, pred = [g for g, _ in sentences], [p for _, p in sentences]
        official = conlleval(sentences)
        assert m.entity_f1(pred, gold) == pytest.approx(official["f1"], abs=1e-12), sentences
        assert m.tag_accuracy(pred, gold) == pytest.approx(official["accuracy"], abs=1e-12)


# --- SQuAD ----------------------------------------------------------------------------------------------------------

FILLER = "people walk along quiet streets near old houses every morning and evening ."


def qa_record(qid, question, context, answers):
    return {
        "id": qid,
        "question": question,
        "context": context,
        "answers": {"text": [a for a in answers], "answer_start": [context.index(a) for a in answers]},
    }


def span_rule(tokenizer, spans: dict[str, float], null: dict[str, float]):
    """Start and end logits: ``spans[word] / 2`` at each of the word's wordpieces (so a one-piece span on it scores
    ``spans[word]``), 0 elsewhere; [CLS] gets ``null[first word of the question] / 2`` each (s_null = their sum)."""
    span_ids = {tokenizer.convert_tokens_to_ids(w): v / 2 for w, v in spans.items()}
    null_ids = {tokenizer.convert_tokens_to_ids(w): v / 2 for w, v in null.items()}

    def rule(input_ids, attention_mask):
        logits = torch.zeros(input_ids.shape)
        for i in range(input_ids.shape[0]):
            for p in range(input_ids.shape[1]):
                logits[i, p] = span_ids.get(int(input_ids[i, p]), 0.0)
            logits[i, 0] = null_ids.get(int(input_ids[i, 1]), 0.0)
        return {"start_logits": logits, "end_logits": logits.clone()}

    return rule


def test_squad_v1_official_semantics_through_the_recipe(tmp_path, tokenizer):
    """SQuAD v1.1 through the recipe's windows and files, as evaluate-v1.1.py scores them: the answer 60 words
    into a context (past the first 24-wordpiece window, which used to be all the recipe read) is found; an answer
    and a gold answer that both normalise to nothing ("The" / "the") get exact match 1 but F1 0 (it was 1: v2.0's
    rule); a partial answer gets its token F1."""
    records = [
        qa_record("far", "where is it ?", f"{FILLER} " * 5 + "it stands in Paris today", ["Paris"]),
        qa_record("article", "which word ?", "The cat sleeps", ["The"]),
        qa_record("partial", "when was it built ?", "It was built in 1889 by workers", ["in 1889"]),
    ]
    write_jsonl(tmp_path / "q.jsonl", records)
    ctx, data = recipe_data(
        tmp_path,
        tokenizer,
        {
            "dataset": "custom",
            "type": "qa",
            "train": str(tmp_path / "q.jsonl"),
            "eval": str(tmp_path / "q.jsonl"),
            "max_seq_length": 24,
            "doc_stride": 6,
        },
    )
    assert len(data.eval.items) > len(records)  # the long context is read in several windows
    metrics = evaluate(ctx, data, RuleModel(span_rule(tokenizer, {"paris": 10, "the": 6, "1889": 4}, {})))
    predictions = json.loads((tmp_path / "run" / "predictions.json").read_text())
    assert predictions == {"far": "Paris", "article": "The", "partial": "1889"}
    official = squad_v1(squad_dataset(records), predictions)
    assert {k: metrics[k] for k in official} == pytest.approx(official, abs=1e-9)
    assert metrics["exact_match"] == pytest.approx(200 / 3) and metrics["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)
    assert metrics["eval_questions"] == 3


def squad_v2_fixture():
    return [
        qa_record("a1", "where is it ?", f"{FILLER} " * 3 + "it stands in Paris", ["Paris"]),
        qa_record("a2", "when was it built ?", "It was built in 1889", ["1889"]),
        qa_record("n1", "who built it ?", "Nobody knows about Berlin", []),
        qa_record("n2", "which city ?", "The city of Rome is old", []),
        # A gold answer that normalises to nothing: dropped, the empty string is the right answer; but the
        # question still counts as answerable (make_qid_to_has_ans reads the raw answers).
        qa_record("e1", "what is it ?", "the cat", ["the"]),
    ]


#: Null scores (s_null) per question (keyed by its first word) and span scores: s_null - s_best = a1 -10,
#: a2 +2, n1 +3, n2 -8, e1 -1.
V2_SPANS, V2_NULL = (
    {"paris": 10, "1889": 2, "berlin": 3, "rome": 8, "cat": 2},
    {"where": 0, "when": 4, "who": 6, "which": 0, "what": 1},
)


def test_squad_v2_null_score_rule_and_official_threshold_through_the_recipe(tmp_path, tokenizer):
    """SQuAD 2.0 (version_2_with_negative): each question's best span and s_null - s_best (BERT section 4.3; the
    null score the smallest over the windows) are written; the threshold is evaluate-v2.0.py's best_f1_thresh
    (-10: answer a1 only), and the script, reading the recipe's files, gives every logged figure: exact/f1/HasAns/
    NoAns of predictions.json, and best_* of the best spans with null_odds.json. e1's gold "the" shows the
    script's own rules: its "" answer scores 1 in f1 (80) but counts as answerable in the search (best_f1 60)."""
    records = squad_v2_fixture()
    write_jsonl(tmp_path / "q.jsonl", records)
    section = {
        "dataset": "custom",
        "type": "qa",
        "train": str(tmp_path / "q.jsonl"),
        "eval": str(tmp_path / "q.jsonl"),
        "max_seq_length": 24,
        "doc_stride": 6,
        "version_2_with_negative": True,
    }
    ctx, data = recipe_data(tmp_path, tokenizer, section)
    model = RuleModel(span_rule(tokenizer, V2_SPANS, V2_NULL))
    metrics = evaluate(ctx, data, model)
    run = tmp_path / "run"
    predictions, odds, best = (
        json.loads((run / name).read_text())
        for name in ("predictions.json", "null_odds.json", "best_non_null_predictions.json")
    )
    assert best == {"a1": "Paris", "a2": "1889", "n1": "Berlin", "n2": "Rome", "e1": "cat"}
    assert odds == pytest.approx({"a1": -10, "a2": 2, "n1": 3, "n2": -8, "e1": -1})
    assert predictions == {"a1": "Paris", "a2": "", "n1": "", "n2": "", "e1": ""}
    dataset = squad_dataset(records)
    official = squad_v2(dataset, predictions)
    search = squad_v2(dataset, best, na_probs=odds)
    assert {k: metrics[k] for k in official} == pytest.approx(official, abs=1e-9)
    assert {k: metrics[k] for k in search if k.startswith("best_")} == pytest.approx(
        {k: v for k, v in search.items() if k.startswith("best_")}, abs=1e-9
    )
    assert (metrics["best_f1"], metrics["best_f1_thresh"], metrics["null_score_diff_threshold"]) == (60.0, -10, -10)
    assert (metrics["f1"], metrics["HasAns_f1"], metrics["NoAns_f1"]) == pytest.approx((80.0, 200 / 3, 100.0))
    assert (metrics["HasAns_total"], metrics["NoAns_total"], metrics["total"]) == (3, 2, 5)

    # A fixed threshold (BERT's null_score_diff_threshold): "no answer" where s_null - s_best > 2.5: n1 only.
    ctx, data = recipe_data(tmp_path / "fixed", tokenizer, {**section, "null_score_diff_threshold": 2.5})
    fixed = evaluate(ctx, data, model)
    predictions = json.loads((tmp_path / "fixed" / "run" / "predictions.json").read_text())
    assert predictions == {"a1": "Paris", "a2": "1889", "n1": "", "n2": "Rome", "e1": "cat"}
    assert {k: fixed[k] for k in official} == pytest.approx(squad_v2(dataset, predictions), abs=1e-9)
    assert (fixed["f1"], fixed["HasAns_f1"], fixed["NoAns_f1"]) == pytest.approx((60.0, 200 / 3, 50.0))


def test_squad_scores_edge_cases_against_the_official_scripts():
    """Per answer, against both scripts' restated rules, on answers that normalise to nothing (articles,
    punctuation, the empty string), partial overlaps and repeated tokens."""
    rng = random.Random(1)
    pieces = ["the", "a", "An", "Paris", "paris", ",", ".", "tower", "Eiffel", "1889", "", "  ", "in"]
    for _ in range(400):
        pred = " ".join(rng.choice(pieces) for _ in range(rng.randint(0, 4)))
        golds = [" ".join(rng.choice(pieces) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(1, 3))]
        dataset = [{"paragraphs": [{"qas": [{"id": "q", "answers": [{"text": g} for g in golds]}]}]}]
        v1 = squad_v1(dataset, {"q": pred})
        assert tuple(100 * x for x in m.squad_v1_scores(pred, golds)) == pytest.approx((v1["exact_match"], v1["f1"])), (
            pred,
            golds,
        )
        v2 = squad_v2(dataset, {"q": pred})
        assert tuple(100 * x for x in m.squad_v2_scores(pred, golds)) == pytest.approx((v2["exact"], v2["f1"]))
    # The rules that differ: both empty after normalisation.
    assert m.squad_v1_scores("The", ["the"]) == (1.0, 0.0) and m.squad_v2_scores("The", ["the"]) == (1.0, 1.0)
    assert m.squad_v2_scores("", ["the", "Paris"]) == (0.0, 0.0)  # "the" dropped: Paris is the only gold answer
    with pytest.raises(ValueError, match="version_2_with_negative"):
        m.squad_v1_scores("x", [])


def test_a_squad_v1_evaluation_question_without_an_answer_is_refused(tmp_path, tokenizer):
    write_jsonl(tmp_path / "q.jsonl", squad_v2_fixture())
    with pytest.raises(ValueError, match="id 'n1'.*version_2_with_negative: true"):
        recipe_data(
            tmp_path,
            tokenizer,
            {"dataset": "custom", "type": "qa", "train": str(tmp_path / "q.jsonl"), "eval": str(tmp_path / "q.jsonl")},
        )


# --- classification and regression --------------------------------------------------------------------------------


def test_classification_metrics_are_the_libraries():
    """macro-F1 over the label set (sklearn: 0.4 where averaging over the classes present gave 0.8), binary F1,
    Matthews correlation and GLUE's figures per task as huggingface/evaluate's glue metric computes them."""
    assert m.macro_f1([0, 1, 0], [0, 0, 0], labels=[0, 1]) == pytest.approx(0.4)
    assert m.macro_f1([0, 0, 1, 1], [0, 1, 1, 1], labels=[0, 1, 2]) == pytest.approx((2 / 3 + 0.8 + 0) / 3)
    rng = np.random.default_rng(0)
    for task in m.GLUE_METRICS:
        if task == "stsb":
            pred, ref = rng.normal(size=20), rng.normal(size=20)
        else:
            classes = 3 if task.startswith("mnli") else 2
            pred, ref = rng.integers(0, classes, 20), rng.integers(0, classes, 20)
        ours = m.glue_metrics(task, pred.tolist(), ref.tolist())
        official = task.split("_")[0] if task.startswith("mnli") else task
        assert ours == pytest.approx(glue(official, pred, ref)), task
        assert tuple(ours) == m.GLUE_METRICS[task]


def test_an_undefined_correlation_is_nan_with_one_warning(tmp_path, tokenizer, caplog):
    """A regression model that predicts one value for every pair: Pearson and Spearman are undefined (scipy:
    nan); the recipe logs nan for both (it logged a Pearson of 0) and one warning line saying why."""
    rows = [{"text": f"pair {i}", "label": float(i % 4)} for i in range(8)]
    write_jsonl(tmp_path / "r.jsonl", rows)
    path = str(tmp_path / "r.jsonl")
    ctx, data = recipe_data(
        tmp_path, tokenizer, {"dataset": "custom", "type": "regression", "train": path, "eval": path}
    )
    constant = RuleModel(lambda input_ids, attention_mask: {"logits": torch.full((input_ids.shape[0], 1), 2.5)})
    with caplog.at_level(logging.WARNING):
        metrics = evaluate(ctx, data, constant)
    assert math.isnan(metrics["pearson"]) and math.isnan(metrics["spearmanr"])
    logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(logged) == 1 and "predictions are constant (every one 2.5)" in logged[0].getMessage()
    written = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in written] == [2.5] * 8
    assert [r["label"] for r in written] == [r["label"] for r in rows]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's ConstantInputWarning
        official = glue("stsb", [r["prediction"] for r in written], [r["label"] for r in written])
    assert math.isnan(official["pearson"]) and math.isnan(official["spearmanr"])
    with caplog.at_level(logging.WARNING):
        assert m.pearson_and_spearman([1.0, 2.0, 4.0], [1.0, 3.0, 2.0]) == pytest.approx(
            glue("stsb", [1.0, 2.0, 4.0], [1.0, 3.0, 2.0])
        )
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


def test_text_data_refusals(tmp_path, tokenizer):
    """docs/bad-input.md rows 102-105 and 115: settings and records the text recipe cannot evaluate as the benchmark
    would, refused before any training with the fix named."""
    write_jsonl(tmp_path / "q.jsonl", [qa_record("a", "where is it ?", "It stands in Paris", ["Paris"])] * 2)
    qa = {"dataset": "custom", "type": "qa", "train": str(tmp_path / "q.jsonl"), "eval": str(tmp_path / "q.jsonl")}
    with pytest.raises(ValueError, match="share the id 'a'"):
        recipe_data(tmp_path, tokenizer, qa)
    write_jsonl(tmp_path / "one.jsonl", [qa_record("a", "where is it ?", "It stands in Paris", ["Paris"])])
    qa = {**qa, "eval": str(tmp_path / "one.jsonl")}
    with pytest.raises(ValueError, match="needs data.version_2_with_negative: true"):
        recipe_data(tmp_path, tokenizer, {**qa, "null_score_diff_threshold": 1.0})
    with pytest.raises(ValueError, match="null_score_diff_threshold must be null or a float, got 'x'"):
        recipe_data(tmp_path, tokenizer, {**qa, "version_2_with_negative": True, "null_score_diff_threshold": "x"})
    with pytest.raises(ValueError, match="data.doc_stride must be .*>= 1, got 0"):
        recipe_data(tmp_path, tokenizer, {**qa, "doc_stride": 0})
    with pytest.raises(ValueError, match="question has 4 wordpieces, which leaves no room.*max_seq_length=7"):
        recipe_data(tmp_path, tokenizer, {**qa, "max_seq_length": 7})
    write_jsonl(
        tmp_path / "empty.jsonl",
        [{"id": "e", "question": "why ?", "context": "\u00ad", "answers": {"text": [], "answer_start": []}}],
    )
    with pytest.raises(ValueError, match="record 0: the context has no wordpiece"):
        recipe_data(tmp_path, tokenizer, {**qa, "eval": str(tmp_path / "empty.jsonl"), "version_2_with_negative": True})
    with pytest.raises(ValueError, match="data.glue_task must name a GLUE task, one of .*'mrpc'"):
        recipe_data(tmp_path, tokenizer, {"dataset": "glue", "glue_task": "mrcp"})
