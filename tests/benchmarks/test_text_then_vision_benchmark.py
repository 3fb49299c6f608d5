"""``python -m benchmarks text-then-vision`` at a tiny size: one row per encoder and budget with its seeds, the
majority row as its definition gives it (the most frequent answer of the training questions, scored on the
evaluated test questions), and a second invocation that reads every result from the cache instead of training."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from benchmarks import text_then_vision
from vlbert.data.easy_vqa import first_images
from vlbert.data.vqa import easy_vqa_examples

TINY_TEXT = ["model.hidden_size=32", "model.num_attention_heads=2", "model.intermediate_size=48"]
TINY_TEXT += ["data.max_seq_length=32", "data.max_eval_batches=2", "training.batch_size=8"]
SETS = [*(f"text:{s}" for s in TINY_TEXT), "vl:training.batch_size=2", "vl:data.eval_fraction=0.25"]
SETS += ["vqa:training.batch_size=4"]


def _argv(root, corpus) -> list[str]:
    sets = [*SETS, f"text:data.corpus={corpus}", f"text:data.corpus_cache_dir={root / 'corpus-cache'}"]
    sizes = ["--text-steps", "2", "--vl-steps", "2", "--budgets", "2", "--seeds", "0"]
    sizes += ["--train-images", "8", "--test-images", "2"]
    return [*sizes, "--cache-dir", str(root), *[w for s in sets for w in ("--set", s)], "--json"]


def _printed(lines: list[str]) -> tuple[list[dict], list[str]]:
    """(the JSON results, the table after them) of the benchmark's stdout (the tools print their own lines first)."""
    last = max(i for i, line in enumerate(lines) if line.startswith("{"))
    return [json.loads(line) for line in lines[: last + 1] if line.startswith('{"run"')], lines[last + 1 :]


@pytest.mark.slow
def test_table_rows_majority_baseline_and_a_cached_second_invocation(small_corpus, tmp_path, capsys, monkeypatch):
    argv = _argv(tmp_path, small_corpus)
    assert text_then_vision.main(argv) == 0
    results, table = _printed(capsys.readouterr().out.splitlines())
    runs = [r["run"] for r in results]
    assert runs == ["text-2", "vl-minilm", "vl-text-2", "vqa-a-2-s0", "vqa-c-2-s0", "vqa-b2-2-s0", "vqa-d2-2-s0"]

    # the majority row: the most frequent answer of the questions of the first 8 training images, scored on
    # every question of the first 2 test images (one answer each: right or wrong)
    train_ids, test_ids = set(first_images("train", 8)), set(first_images("test", 2))
    train = [ex for ex in easy_vqa_examples("train") if ex.image_id in train_ids]
    test = [ex for ex in easy_vqa_examples("test") if ex.image_id in test_ids]
    majority = Counter(ex.answers[0] for ex in train).most_common(1)[0][0]
    expected = sum(ex.answers[0] == majority for ex in test) / len(test)
    vqa = [r for r in results if r["run"].startswith("vqa-")]
    assert all(r["vqa_accuracy_majority_baseline"] == pytest.approx(expected) for r in vqa)
    assert all(r["eval_questions"] == len(test) == text_then_vision.eval_questions(2) for r in vqa)
    assert table[1].split()[-1] == f"{100 * expected:.1f}"

    # one row per encoder at the one budget: its seed's accuracy, then mean +- std (0 for one seed)
    rows = {line[:34].strip(): line[34:].split() for line in table[2:-1]}
    assert list(rows) == [label for _, label, _ in text_then_vision.encoders([2])]
    for (key, _, _), cells in zip(text_then_vision.encoders([2]), rows.values(), strict=True):
        accuracy = next(r["vqa_accuracy"] for r in vqa if r["run"] == f"vqa-{key}-2-s0")
        assert cells == ["2", f"{100 * accuracy:.1f}", f"{100 * accuracy:.1f}", "+-", "0.0"]

    # a second invocation trains nothing: only the extraction tool runs (and finds every image extracted)
    called = []
    real = text_then_vision.script_main
    monkeypatch.setattr(text_then_vision, "script_main", lambda name: called.append(name) or real(name))
    assert text_then_vision.main(argv) == 0
    assert called == ["extract_regions"]
    assert _printed(capsys.readouterr().out.splitlines()) == (results, table)


def test_the_documented_evaluation_set_and_stage_overrides(tmp_path):
    # the first 250 test images hold the first 2,449 of the 9,673 test questions
    assert text_then_vision.eval_questions(250) == 2449
    with pytest.raises(ValueError, match="STAGE:KEY=VALUE"):
        text_then_vision.main(["--cache-dir", str(tmp_path), "--set", "training.seed=1"])
