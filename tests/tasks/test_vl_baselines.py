"""VL pretraining's held-out baselines (vlbert.recipes.vl_baselines): each is the score of a model built to predict
that constant, on the run's own held-out batches, and the end-of-run table reads it as "at baseline"."""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from vlbert.detectors.regions import Regions
from vlbert.detectors.shards import write_shards

from vlbert.config import VLBertConfig
from vlbert.models.vl import VLBertForPreTraining
from vlbert.recipes.report import results_table
from vlbert.recipes.runner import RunContext
from vlbert.recipes.vl_baselines import held_out_baselines, itm_loss_chance, training_priors
from vlbert.recipes.vl_pretraining import VLDataConfig, VLPretrainingData, baselines, build_model
from vlbert.training.evaluation import evaluate_objectives
from vlbert.training.trainer import TrainingConfig
from vlbert.utils import forward_arguments

DIM, CLASSES, REGIONS = 8, 5, 6
WORDS = ["red", "blue", "green", "circle", "square", "triangle", "a", "shape", "small", "big"]


@pytest.fixture(scope="module")
def data(tmp_path_factory, tokenizer):
    """40 images of synthetic regions (features centred away from 0, class distributions with a skewed prior) and
    two captions each, a quarter of the images held out."""
    root = tmp_path_factory.mktemp("synthetic-vl")
    rng = np.random.default_rng(0)
    regions = [
        Regions(
            f"img{k}",
            64,
            64,
            np.tile(np.array([[0, 0, 32, 32]], dtype=np.float32), (REGIONS, 1)),
            rng.normal(np.arange(DIM), 1.0, (REGIONS, DIM)).astype(np.float16),
            np.ones(REGIONS, dtype=np.float32),
            rng.dirichlet([4.0, 1, 1, 1, 1], REGIONS).astype(np.float16),
        )
        for k in range(40)
    ]
    write_shards(regions, root / "shards")
    captions = [
        {"image_id": f"img{k}", "caption": " ".join(rng.choice(WORDS, 6, p=[0.3] + [0.7 / 9] * 9))}
        for k in range(40)
        for _ in range(2)
    ]
    (root / "captions.jsonl").write_text("".join(json.dumps(c) + "\n" for c in captions))
    config = VLDataConfig(
        sources=[
            {"name": "syn", "format": "jsonl", "path": str(root / "captions.jsonl"), "shards": str(root / "shards")}
        ],
        eval_fraction=0.25,
        max_regions=REGIONS,
        objectives={"mlm": 1, "mrfr": 1, "mrc_kl": 1, "itm": 1},
    )
    ctx = RunContext({}, TrainingConfig(batch_size=8), config, None, tokenizer, None)
    return ctx, VLPretrainingData(ctx)


def constant_model(data, tokenizer) -> VLBertForPreTraining:
    """A tiny VL model whose heads ignore their input and answer the training priors: the unigram distribution
    (MLM logits), the class prior (region classes), the mean feature (MRFR) and even odds (ITM)."""
    config = VLBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        region_feature_dim=DIM,
        num_region_classes=CLASSES,
    )
    model = VLBertForPreTraining(config).eval()
    priors = training_priors(data.train, len(tokenizer), tokenizer.all_special_ids)
    unigram = (priors.token_counts + 1) / (priors.token_counts.sum() + len(priors.token_counts))
    with torch.no_grad():
        for head, bias in (
            (model.masked_lm, unigram.log()),
            (model.mrc, (priors.class_prior / priors.class_prior.sum()).log()),
            (model.mrfr, priors.mean_feature),
        ):
            head.norm.weight.zero_()
            head.norm.bias.zero_()
            (head.decoder.bias if hasattr(head, "decoder") else head.bias).copy_(bias.float())
        for p in model.itm.parameters():
            p.zero_()
    return model, priors


def test_a_model_predicting_each_prior_scores_its_baseline_and_the_table_says_at_baseline(data, tokenizer):
    ctx, data = data
    model, priors = constant_model(data, tokenizer)
    # the accuracy baselines are the majority classes; the model's heads answer the argmax of the priors: the same
    assert int(priors.top_class_counts.argmax()) == int(priors.class_prior.argmax())
    takes = forward_arguments(model)
    metrics = evaluate_objectives(
        model, data.eval_batches(), contextlib.nullcontext, lambda b: {k: v for k, v in b.items() if k in takes}
    )
    base = baselines(ctx, data, model)
    assert base == {**held_out_baselines(data.eval_batches(), priors), "eval_itm_loss_chance": math.log(2)}
    pairs = {
        "eval_mlm_accuracy": "eval_mlm_accuracy_majority_baseline",
        "eval_mlm_loss": "eval_mlm_loss_unigram_baseline",
        "eval_mrc_kl_accuracy": "eval_mrc_kl_accuracy_majority_baseline",
        "eval_mrc_kl_loss": "eval_mrc_kl_loss_class_prior_baseline",
        "eval_mrfr_loss": "eval_mrfr_loss_mean_feature_baseline",
        "eval_mrfr_mse": "eval_mrfr_mse_mean_feature_baseline",
        "eval_itm_loss": "eval_itm_loss_chance",
    }
    for result, baseline in pairs.items():
        assert metrics[result] == pytest.approx(base[baseline], rel=1e-4, abs=1e-6), result
    assert (
        0.1 < base["eval_mlm_accuracy_majority_baseline"] < 0.9 and base["eval_mrfr_loss_mean_feature_baseline"] > 0.5
    )
    table = results_table({**metrics, **base}).splitlines()
    rows = {line.split()[0]: line for line in table[2:] if not line.startswith("note:")}
    assert set(rows) == set(pairs) | {"eval_itm_accuracy"}  # every held-out result, none without a baseline
    assert all(len(line.split()) >= 4 for line in rows.values()), "\n".join(table)
    assert all(rows[r].endswith("at baseline") for r in pairs), "\n".join(table)


def test_held_out_standard_errors_are_those_of_the_predictions(data, tokenizer):
    """Accuracy: the binomial standard error over the masked wordpieces; MRFR: the spread of the regions' squared
    errors (here against the mean feature, computed from the batches directly) over sqrt(n)."""
    ctx, data = data
    model, priors = constant_model(data, tokenizer)
    takes = forward_arguments(model)
    metrics = evaluate_objectives(
        model, data.eval_batches(), contextlib.nullcontext, lambda b: {k: v for k, v in b.items() if k in takes}
    )
    batches = list(data.eval_batches())
    n_words = sum(int((b["labels"] != -100).sum()) for b in batches if b["objective"] == "mlm")
    p = metrics["eval_mlm_accuracy"]
    assert metrics["eval_mlm_accuracy_n"] == n_words
    assert metrics["eval_mlm_accuracy_stderr"] == pytest.approx(math.sqrt(p * (1 - p) / n_words), rel=1e-6)
    errors = np.concatenate(
        [
            (
                (
                    b["region_features"].reshape(-1, DIM)[b["region_targets"]].double().numpy()
                    - priors.mean_feature.numpy()
                )
                ** 2
            ).mean(-1)
            for b in batches
            if b["objective"] == "mrfr"
        ]
    )
    assert metrics["eval_mrfr_loss_n"] == len(errors)
    assert metrics["eval_mrfr_loss_stderr"] == pytest.approx(errors.std() / math.sqrt(len(errors)), rel=1e-3)


def test_itm_chance_loss_follows_the_share_of_matching_pairs():
    assert itm_loss_chance("random") == pytest.approx(math.log(2))
    third = 1 / 3
    assert itm_loss_chance("itc") == pytest.approx(-(third * math.log(third) + 2 * third * math.log(2 * third)))


def _held_out(model, data) -> dict:
    takes = forward_arguments(model)
    return evaluate_objectives(
        model.eval(), data.eval_batches(), contextlib.nullcontext, lambda b: {k: v for k, v in b.items() if k in takes}
    )


def test_new_region_heads_start_at_the_training_priors_and_loaded_ones_keep_their_weights(data, tokenizer, tmp_path):
    """The recipe's model starts MRFR's output bias at the training regions' mean feature and the MRC head's at the
    log class prior: before any step its held-out MRFR loss is within a few percent of the mean-feature baseline
    (the features here are centred at 0..7, so a zero bias starts over ten times higher) and its MRC-kl KL near
    the class prior's. A VL checkpoint's trained heads are loaded as they are."""
    ctx, data = data
    tiny = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}
    torch.manual_seed(0)
    model = build_model(replace(ctx, config={"model": tiny}), data)
    base = held_out_baselines(
        data.eval_batches(), training_priors(data.train, len(tokenizer), tokenizer.all_special_ids)
    )
    start = _held_out(model, data)
    mean_feature = base["eval_mrfr_loss_mean_feature_baseline"]
    assert start["eval_mrfr_loss"] == pytest.approx(mean_feature, rel=0.1)
    assert start["eval_mrc_kl_loss"] == pytest.approx(base["eval_mrc_kl_loss_class_prior_baseline"], rel=0.1)
    with torch.no_grad():
        model.mrfr.decoder.bias.zero_()
    assert _held_out(model, data)["eval_mrfr_loss"] > 10 * mean_feature  # what UNITER's zero bias starts from

    with torch.no_grad():
        model.mrfr.decoder.bias.fill_(3.0)  # "trained" heads of a VL checkpoint
    model.save_pretrained(tmp_path / "vl")
    loaded = build_model(replace(ctx, config={}, init_from=str(tmp_path / "vl")), data)
    assert torch.equal(loaded.mrfr.decoder.bias, torch.full((DIM,), 3.0))
    assert torch.equal(loaded.mrc.decoder.bias, model.mrc.decoder.bias)
