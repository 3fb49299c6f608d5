"""The README's quick start (issue 54): the VL default and the easy-VQA fine-tuning default read one set of images,
so their regions are extracted once and shared; an extraction says what it costs before it runs; the full-size
configs are named beside the quick-start ones."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
from vlbert.detectors.config import DetectorConfig
from vlbert.detectors.regions import Regions
from vlbert.detectors.store import MergedRegions, RegionStore

from vlbert.training.run_config import load_run_config

TINY_DETECTOR = DetectorConfig(options={"input_size": 64, "max_proposals": 4})
COST = re.compile(
    r"extracting regions of (\d+) images, (under a minute|about a minute|about \d+ minutes), once "
    r"\(cached in (\S+)\)"
)


class CountingExtractor:
    """A stand-in for the detector (building and running the real one is tested in test_extraction.py): one
    whole-image region per image, 4-d features; counts the images it was given."""

    name = "counting"

    def __init__(self):
        self.seen: list[str] = []

    def extract_batch(self, arrays, ids):
        self.seen += ids
        return [
            Regions(
                i,
                a.shape[0],
                a.shape[1],
                np.array([[0, 0, a.shape[1], a.shape[0]]], np.float32),
                np.full((1, 4), len(self.seen), np.float16),
                np.ones(1, np.float32),
                None,
                self.name,
            )
            for a, i in zip(arrays, ids, strict=True)
        ]


@pytest.fixture
def three_images_a_split(monkeypatch):
    """The easy-VQA package seen as its first 3 training and 3 test images, extracted by a :class:`CountingExtractor`
    (the cache and the recipes' lookups are real). Returns the extractor."""
    from vlbert.data import easy_vqa

    real = easy_vqa.image_paths
    monkeypatch.setattr(easy_vqa, "image_paths", lambda split: dict(list(real(split).items())[:3]))
    extractor = CountingExtractor()
    monkeypatch.setattr(DetectorConfig, "build", lambda self: extractor)
    return extractor


def _cost_lines(caplog) -> list[re.Match]:
    return [m for r in caplog.records if (m := COST.fullmatch(r.getMessage()))]


def test_vqa_reuses_the_vl_runs_regions_and_extraction_says_its_cost_once(
    three_images_a_split, tmp_path, caplog, tokenizer
):
    """VL pretraining with data.max_images N and VQA with data.max_train_images N (the recipes' own region
    lookups): VQA extracts only the test split, the training images' cache is the VL run's; each extraction logs
    one cost line naming its image count and cache directory, and a cached lookup logs none."""
    from vlbert.recipes.vl_pretraining import CaptionSource, VLDataConfig, VLPretrainingData
    from vlbert.recipes.vqa import VQAData, VQADataConfig

    vl = VLPretrainingData.__new__(VLPretrainingData)
    vl.seed, vl.skipped = 0, {}
    vl_ctx = SimpleNamespace(
        data=VLDataConfig(max_images=2, cache_dir=str(tmp_path)), tokenizer=tokenizer, detector=TINY_DETECTOR
    )
    with caplog.at_level("INFO", logger="vlbert.detectors.cache"):
        pairs, vl_store = vl._load_source(vl_ctx, CaptionSource("easy-vqa", "easy-vqa"))
    assert isinstance(vl_store, RegionStore) and sorted(vl_store) == ["train/0", "train/1"]
    assert three_images_a_split.seen == ["train/0", "train/1"]
    assert {p.image_id for p in pairs} == {"train/0", "train/1"}
    [line] = _cost_lines(caplog)
    assert line[1] == "2" and line[2] == "under a minute" and line[3] == str(vl_store.directory)

    caplog.clear()
    vqa_ctx = SimpleNamespace(data=VQADataConfig(max_train_images=2, cache_dir=str(tmp_path)), detector=TINY_DETECTOR)
    with caplog.at_level("INFO", logger="vlbert.detectors.cache"):
        store = VQAData.load_regions(None, vqa_ctx)
    assert isinstance(store, MergedRegions)
    assert sorted(store) == ["test/0", "test/1", "test/2", "train/0", "train/1"]
    train_store, test_store = store.stores.values()
    assert train_store.directory == vl_store.directory  # the VL run's cache, not extracted again
    assert three_images_a_split.seen == ["train/0", "train/1", "test/0", "test/1", "test/2"]
    [line] = _cost_lines(caplog)
    assert line[1] == "3" and line[3] == str(test_store.directory)
    assert store["test/2"].features[0, 0] == 5 and store["train/1"].features[0, 0] == 2  # what was extracted
    assert store.num_regions("test/0") == 1 and "train/2" not in store and len(store) == 5

    caplog.clear()
    with caplog.at_level("INFO", logger="vlbert.detectors.cache"):
        VQAData.load_regions(None, vqa_ctx)
    assert _cost_lines(caplog) == [] and len(three_images_a_split.seen) == 5  # cached: said once, extracted once


def test_the_cost_line_rounds_to_whole_minutes():
    from vlbert.detectors.cache import cost_line

    assert cost_line(1000, 0.15, "/c") == "extracting regions of 1,000 images, about 2 minutes, once (cached in /c)"
    assert cost_line(400, 0.14, "/c").endswith("under a minute, once (cached in /c)")  # 56 s
    assert "about a minute" in cost_line(500, 0.14, "/c")  # 70 s
    assert "about 17 minutes" in cost_line(5000, 0.2, "/c")


def test_quick_start_configs_share_their_images_and_name_the_full_ones():
    """vl/default pretrains on the images finetune/vqa-easy-vqa trains on (one region cache); the full configs
    keep the sizes the quick start had before (every image, 2,400 VQA steps) and chain to each other."""
    vl, vqa = load_run_config("vl/default"), load_run_config("finetune/vqa-easy-vqa")
    assert vl["data"]["max_images"] == vqa["data"]["max_train_images"] > 0
    assert vqa["init_from"] == vl["training"]["output_dir"] == "runs/vl-default"
    assert "max_eval_examples" not in vqa["data"]  # the evaluation: every test question
    assert vl["detector"] == vqa["detector"]
    vl_full, vqa_full = load_run_config("vl/easy-vqa-full"), load_run_config("finetune/vqa-easy-vqa-full")
    assert vl_full["data"]["max_images"] == 0 and vqa_full["data"]["max_train_images"] == 0
    assert vqa_full["training"]["max_steps"] == 2400 and vqa_full["init_from"] == vl_full["training"]["output_dir"]
    assert vl_full["detector"] == vqa_full["detector"] == vl["detector"]
