"""The end-of-run table (vlbert.recipes.report): each result beside its baseline, a result at chance called so."""

from __future__ import annotations

import math

import pytest

from vlbert.recipes.report import MARGIN, results_table, standard_error, verdict
from vlbert.training.log_hook import eval_line

# What `tools/pretrain.py --modality text` returns after the quick start's 600 steps (figures of a real run:
# MLM well above its majority baseline, NSP at chance).
TEXT_RUN = {
    "step": 600,
    "train_loss": 5.61,
    "train_seconds": 231.0,
    "eval_mlm_loss": 5.42,
    "eval_nsp_loss": 0.6931,
    "eval_mlm_accuracy": 0.1843,
    "eval_nsp_accuracy": 0.504,
    "eval_mlm_accuracy_majority_baseline": 0.061,
}


def rows(table: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in table.splitlines()[2:] if not line.startswith("note:")}


def test_a_result_that_beats_its_baseline_says_by_how_much_and_one_at_chance_is_called_so():
    table = results_table(TEXT_RUN)
    got = rows(table)
    assert got["eval_mlm_accuracy"][2:6] == ["0.0610", "majority", "class", "yes"]
    assert got["eval_nsp_accuracy"][2:] == ["0.5000", "chance", "at", "baseline"]
    notes = [line for line in table.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith("note: eval_nsp_accuracy is 0.5040, at its chance baseline")
    assert "--max-steps" in notes[0]  # what to do about it
    # baselines fold into their result's row; bookkeeping is left to metrics.json; results without one are listed
    assert "eval_mlm_accuracy_majority_baseline" not in got and "train_seconds" not in got
    assert got["eval_mlm_loss"] == ["eval_mlm_loss", "5.4200"]


def test_task_baselines_and_the_untrained_model_are_baselines_too():
    got = rows(
        results_table(
            {
                "vqa_accuracy": 0.40,
                "vqa_accuracy_majority_baseline": 0.41,
                "accuracy": 0.30,
                "accuracy_majority_position_baseline": 0.5,
                "eval_color_shape_mlm_accuracy_with_regions": 0.8,
                "eval_color_shape_mlm_accuracy_with_regions_before": 0.0,
            }
        )
    )
    assert got["vqa_accuracy"][-2:] == ["at", "baseline"]
    assert got["accuracy"][-3:-1] == ["below", "baseline"] and "position" in got["accuracy"]
    assert got["eval_color_shape_mlm_accuracy_with_regions"][-3:] == ["training", "yes", "(+0.800)"]


def test_the_margin_decides_and_an_undefined_metric_is_not_read_as_chance():
    assert verdict(0.5 + MARGIN / 2, 0.5) == "at baseline"
    assert verdict(0.5 + 2 * MARGIN, 0.5).startswith("yes")
    assert verdict(0.5 - 2 * MARGIN, 0.5).startswith("below")
    assert verdict(math.nan, 0.0) == "undefined"
    assert "note:" not in results_table({"pearson": math.nan, "pearson_majority_baseline": 0.0})


def test_a_held_out_evaluation_prints_as_one_line():
    line = eval_line(
        {
            "split": "eval",
            "step": 200,
            "eval_mlm_loss": 4.10331,
            "eval_mlm_accuracy": 0.312,
            "eval_nsp_accuracy": 0.504,
            "eval_mlm_accuracy_n": 450,  # sampling figures stay in log.jsonl
            "eval_mlm_accuracy_stderr": 0.0218,
        }
    )
    assert line == "held-out at step 200: mlm_accuracy 0.3120, nsp_accuracy 0.5040, mlm_loss 4.1033"


def binomial(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def test_the_same_lead_is_at_baseline_on_45_items_and_beats_it_on_400():
    """A lead of 0.1 over a 0.5 baseline: inside two binomial standard errors of 45 held-out items (0.146), outside
    them on 400 (0.049), where the fixed 0.02 called both a win."""
    metrics = {"eval_itm_accuracy": 0.6, "eval_itm_accuracy_chance": 0.5}
    few = rows(results_table({**metrics, "eval_itm_accuracy_stderr": binomial(0.6, 45), "eval_itm_accuracy_n": 45}))
    many = rows(results_table({**metrics, "eval_itm_accuracy_stderr": binomial(0.6, 400), "eval_itm_accuracy_n": 400}))
    assert few["eval_itm_accuracy"][-2:] == ["at", "baseline"]
    assert many["eval_itm_accuracy"][4:] == ["yes", "(+0.100,", "2", "s.e.", "0.049)"]
    assert "eval_itm_accuracy_stderr" not in many and "eval_itm_accuracy_n" not in many  # folded into the verdict
    assert verdict(0.6, 0.5).startswith("yes")  # without a standard error: the fixed margin


def test_a_loss_beats_its_baseline_by_being_lower():
    assert verdict(1.0, 1.5, stderr=0.1, lower_is_better=True) == "yes (-0.500, 2 s.e. 0.200)"
    assert verdict(1.1, 1.0, stderr=0.1, lower_is_better=True) == "at baseline"
    assert verdict(1.5, 1.0, stderr=0.1, lower_is_better=True).startswith("below baseline (+0.500")
    got = rows(
        results_table(
            {"eval_mrfr_loss": 0.8, "eval_mrfr_loss_mean_feature_baseline": 1.2, "eval_mrfr_loss_stderr": 0.05}
        )
    )
    assert got["eval_mrfr_loss"][2:6] == ["1.2000", "mean", "feature", "yes"]


def test_a_tasks_standard_error_is_the_binomial_one_for_hits():
    """VQA's and NLVR2's figures (standard_error of their per-item scores): for 0/1 hits sqrt(p(1-p)/n), exactly."""
    hits = [1.0] * 30 + [0.0] * 15
    assert standard_error("accuracy", hits) == {"accuracy_n": 45, "accuracy_stderr": pytest.approx(binomial(2 / 3, 45))}
    assert standard_error("accuracy", []) == {}
