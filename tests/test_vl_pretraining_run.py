"""VL pretraining data and an end-to-end run on real easy-VQA images with regions from the real backbone."""

from __future__ import annotations

import json

import pytest
import torch

from vlbert.data.easy_vqa import captions, image_attributes, load_questions
from vlbert.data.pretraining import MaskingCollator
from vlbert.data.vl_pretraining import VLCollator, pad_regions
from vlbert.models.vl import VLBertForPreTraining
from vlbert.training.vl_pretraining import VLPretrainingData, VLDataConfig, DetectorConfig, run_vl_pretraining

N_IMAGES = 48


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("region-cache")


def test_captions_agree_with_the_open_questions():
    questions = load_questions("test")
    caps = captions("test", image_attributes(questions))
    assert len(caps) > 800
    checked = 0
    for q in questions:
        if q.image_id in caps and q.question == "what color is the shape?":
            assert caps[q.image_id][0] == q.answer
            checked += 1
        if q.image_id in caps and q.question == "what shape is in the image?":
            assert caps[q.image_id][1] == q.answer
            checked += 1
    assert checked > 200


@pytest.fixture(scope="module")
def data(cache_dir, tokenizer):
    config = VLDataConfig(max_images=N_IMAGES, cache_dir=str(cache_dir), eval_fraction=0.25)
    return VLPretrainingData(config, DetectorConfig(input_size=96), tokenizer, batch_size=8)


def test_conditional_masking_per_task(data, tokenizer):
    items = [data.train[i] for i in range(8)]
    text = MaskingCollator.from_tokenizer(tokenizer)
    plain = pad_regions(items)
    mlm = VLCollator(text, force_task="mlm")(items)
    assert (mlm["labels"] != -100).any() and torch.equal(mlm["region_features"], plain["region_features"])
    mrfr = VLCollator(text, force_task="mrfr")(items)
    masked = mrfr["masked_regions"]
    assert "labels" not in mrfr and (masked.sum(1) >= 1).all() and not (masked & (mrfr["region_mask"] == 0)).any()
    assert (mrfr["region_features"][masked] == 0).all()
    assert torch.equal(mrfr["region_targets"], plain["region_features"])
    assert torch.equal(mrfr["region_features"][~masked], plain["region_features"][~masked])
    assert mrfr["region_features"].dtype == torch.float16
    mrc = VLCollator(text, force_task="mrc")(items)
    torch.testing.assert_close(mrc["region_labels"][mrc["masked_regions"]].float().sum(-1),
                               torch.ones(int(mrc["masked_regions"].sum())), atol=1e-2, rtol=0)
    labels = []
    for start in range(0, len(data.train) - 8, 8):
        batch_items = [data.train[i] for i in range(start, start + 8)]
        itm = VLCollator(text, force_task="itm")(batch_items)
        for row, item in enumerate(batch_items):
            own = itm["input_ids"][row, : len(item["input_ids"])].tolist() == item["input_ids"]
            assert own == bool(itm["itm_label"][row])  # label 1 exactly when the caption is the image's own
        labels += itm["itm_label"].tolist()
    assert 0.25 < sum(labels) / len(labels) < 0.75


def test_vl_run_end_to_end(cache_dir, tmp_path):
    out = tmp_path / "vl"
    config = {
        "modality": "vl",
        "tokenizer": "minilm",
        "model": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
        "detector": {"input_size": 96},
        "data": {"max_images": N_IMAGES, "cache_dir": str(cache_dir), "eval_fraction": 0.25},
        "training": {"output_dir": str(out), "max_steps": 16, "batch_size": 8, "learning_rate": 1e-3,
                     "warmup_steps": 2, "log_every": 1, "progress_bar": False},
    }
    metrics = run_vl_pretraining(config)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    seen = {k for r in log if r["split"] == "train" for k in ("mlm", "mrfr", "mrc", "itm") if k in r}
    assert seen == {"mlm", "mrfr", "mrc", "itm"}
    for key in ("eval_mlm_accuracy", "eval_mrfr_loss", "eval_mrc_loss", "eval_itm_accuracy",
                "eval_color_shape_mlm_accuracy_with_regions", "eval_color_shape_mlm_accuracy_without_regions"):
        assert key in metrics
    model = VLBertForPreTraining.from_pretrained(out)
    assert model.loading_info.missing_keys == [] and model.config.region_feature_dim == 1320
