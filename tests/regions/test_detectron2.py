"""The detectron2 backend with randomly initialised Faster R-CNNs (FPN, C4, and the BUTD attribute model): weights
read without unpickling code, batched extraction equal to one image at a time, shards with class and attribute
names, VL pretraining on them, and its bad inputs. Skipped without detectron2 (CI installs it from
../shared/third_party when that folder is present)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("detectron2", reason="detectron2 is not installed (see docs/regions.md: the detectron2 backend)")

from helpers.builders import tool  # noqa: E402
from helpers.detectron2 import SMALL, random_weights
from vlbert.detectors.config import DetectorConfig  # noqa: E402
from vlbert.detectors.detectron2_detector import Detectron2RegionDetector, read_checkpoint  # noqa: E402

from vlbert.commands import run_tool  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# Small inputs and few proposals keep a CPU forward of a ResNet-50 detector well under a second.
FPN = "COCO-Detection/faster_rcnn_R_50_FPN_1x.yaml"
C4 = "COCO-Detection/faster_rcnn_R_50_C4_1x.yaml"


def assert_same_regions(together, alone):
    """Equal up to float32 rounding: a batched convolution sums in another order, which moves boxes by ~1e-3
    pixels; a thin box's RoI-pooled feature then moves by a few parts per thousand of its norm."""
    assert together.num_regions == alone.num_regions
    np.testing.assert_allclose(together.boxes, alone.boxes, atol=1e-2)  # pixels
    a, b = together.features.astype(np.float32), alone.features.astype(np.float32)
    error = np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-6)
    assert error.max() < 1e-2, error
    if alone.class_probs is not None:
        np.testing.assert_allclose(
            together.class_probs.astype(np.float32), alone.class_probs.astype(np.float32), atol=1e-3
        )


def sample_images():
    """uint8 RGB arrays of several sizes, two of them sharing a size: real easy-VQA images, resized."""
    from PIL import Image

    from vlbert.data.easy_vqa import image_paths

    paths = list(image_paths("train").items())[:6]
    sizes = [(64, 64), (96, 64), (64, 64), (50, 120), (96, 64), (200, 150)]
    return [
        (image_id, np.asarray(Image.open(p).convert("RGB").resize(size)))
        for (image_id, p), size in zip(paths, sizes, strict=True)
    ]


@pytest.mark.parametrize("config_file,layout", [(FPN, "d2-pkl"), (C4, "pth")])
def test_batched_extraction_equals_one_image_at_a_time(tmp_path, config_file, layout):
    weights = random_weights(config_file, SMALL, tmp_path / f"w.{'pkl' if layout.endswith('pkl') else layout}", layout)
    detector = Detectron2RegionDetector(config_file, weights, overrides=SMALL, min_boxes=4, max_boxes=12)
    saved, _ = read_checkpoint(weights)  # built without initial draws: every tensor is the file's
    assert all(torch.equal(value, saved[name]) for name, value in detector.model.state_dict().items())
    images = sample_images()
    ids = [i for i, _ in images]
    batched = detector.extract_batch([a for _, a in images], ids, batch_size=8)
    assert [r.image_id for r in batched] == ids
    for (image_id, array), together in zip(images, batched, strict=True):
        alone = detector(array, image_id)
        assert alone.num_regions >= 4
        assert_same_regions(together, alone)
        assert (together.height, together.width) == array.shape[:2]
    expected_dim = 2048 if config_file == C4 else 1024
    assert batched[0].features.shape[1] == expected_dim == detector.feature_dim
    assert batched[0].class_probs.shape[1] == 80  # COCO classes, background dropped
    assert detector.class_names[0] == "person"  # detectron2's COCO metadata travels with the shards


def test_torchvision_batched_extraction_equals_one_image_at_a_time():
    from vlbert.detectors.torchvision_detector import TorchvisionRegionDetector

    torch.manual_seed(0)
    detector = TorchvisionRegionDetector(weights=None, min_boxes=3, max_boxes=8)
    detector.model.transform.min_size, detector.model.transform.max_size = (96,), 160
    detector.model.rpn._post_nms_top_n["testing"] = 100  # of 1000: random weights propose boxes everywhere
    images = sample_images()
    ids = [i for i, _ in images]
    batched = detector.extract_batch([a for _, a in images], ids)
    for (image_id, array), together in zip(images, batched, strict=True):
        alone = detector(array, image_id)
        np.testing.assert_allclose(together.boxes, alone.boxes, atol=1e-2)  # pixels; float rounding
        np.testing.assert_allclose(
            together.features.astype(np.float32), alone.features.astype(np.float32), rtol=1e-2, atol=1e-3
        )


def test_butd_attribute_model_extracts_shards_with_names_and_vl_pretraining_runs_on_them(tmp_path):
    from vlbert.detectors.detectron2_butd import BUTD_VG_CONFIG
    from vlbert.detectors.shards import read_detector_info, read_shards, shard_paths

    from vlbert.recipes import RECIPES, run

    overrides = {**SMALL, "MODEL.RESNETS.DEPTH": 50}

    def none_half(state):  # attribute scores: "no attribute" (last) as likely as all 400 attributes together
        state["roi_heads.attribute_predictor.attr_linear2.weight"].zero_()
        state["roi_heads.attribute_predictor.attr_linear2.bias"].zero_()
        state["roi_heads.attribute_predictor.attr_linear2.bias"][-1] = np.log(400.0)

    weights = random_weights(
        "butd-vg", overrides, tmp_path / "faster_rcnn_from_caffe_attr.pkl", "butd-pkl", edit=none_half
    )
    (tmp_path / "objects_vocab.txt").write_text("".join(f"object{i},synonym\n" for i in range(1600)))
    (tmp_path / "attributes_vocab.txt").write_text("".join(f"attribute{i}\n" for i in range(400)))
    images = tmp_path / "images"
    images.mkdir()
    from PIL import Image

    from vlbert.data.easy_vqa import color_and_shape, image_paths

    paths = image_paths("train")
    for image_id in list(color_and_shape("train"))[:12]:  # ids "train/<n>", as the captions'
        (images / image_id).parent.mkdir(exist_ok=True)
        Image.open(paths[image_id]).save(images / f"{image_id}.png")
    opts = [w for k, v in overrides.items() for w in (k, str(v))]
    args = [
        "--images",
        str(images),
        "--backend",
        "detectron2",
        "--config-file",
        str(BUTD_VG_CONFIG),
        "--weights",
        str(weights),
        "--class-names",
        str(tmp_path / "objects_vocab.txt"),
        "--attribute-names",
        str(tmp_path / "attributes_vocab.txt"),
        "--min-boxes",
        "6",
        "--max-boxes",
        "6",
        "--batch-size",
        "4",
        "--output-dir",
        str(tmp_path / "shards"),
        "--opts",
        *opts,
    ]
    assert run_tool(tool("extract_regions"), args) == 0
    regions = list(read_shards(shard_paths(tmp_path / "shards")))
    assert len(regions) == 12 and all(r.num_regions == 6 for r in regions)
    r = regions[0]
    assert r.features.shape == (6, 2048) and r.class_probs.shape == (6, 1600) and r.attribute_probs.shape == (6, 400)
    np.testing.assert_allclose(r.class_probs.astype(np.float32).sum(-1), 1.0, atol=1e-2)
    # The "no attribute" column is the one left out, and the rest is not renormalised.
    np.testing.assert_allclose(r.attribute_probs.astype(np.float32).sum(-1), 0.5, atol=1e-2)
    info = read_detector_info(tmp_path / "shards")
    assert info["class_names"][:2] == ["object0", "object1"] and info["attribute_names"][-1] == "attribute399"
    assert info["feature_dim"] == 2048

    # The shards' image ids are the paths under --images ("train/<n>"): pretrain on them with easy-VQA captions.
    config = {
        "modality": "vl",
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "region_feature_dim": 2048,
        },
        "data": {
            "shards": str(tmp_path / "shards"),
            "max_images": 12,
            "eval_fraction": 0.0,
            "objectives": {"mlm": 1, "mrfr": 1, "mrc": 1, "itm": 1},
        },
        "training": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 4,
            "batch_size": 4,
            "learning_rate": 1e-3,
            "warmup_steps": 1,
            "log_every": 1,
            "progress_bar": False,
        },
    }
    run(RECIPES["vl-pretraining"], config)
    steps = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if s["split"] == "train"] == [1, 2, 3, 4]
    assert all(np.isfinite(s["loss"]) for s in steps if s["split"] == "train")


def test_weights_that_would_run_code_are_refused(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned > /tmp/vlbert-d2-pwned",))

    (tmp_path / "evil.pkl").write_bytes(pickle.dumps({"model": {"w": Payload()}, "__author__": "x"}))
    with pytest.raises(ValueError, match="asks for (posix|os).system"):
        Detectron2RegionDetector(FPN, tmp_path / "evil.pkl", overrides=SMALL)
    assert not os.path.exists("/tmp/vlbert-d2-pwned")


def test_bad_detectron2_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="weights file .*missing.pkl does not exist"):
        Detectron2RegionDetector(FPN, tmp_path / "missing.pkl", overrides=SMALL)
    with pytest.raises(ValueError, match="not a Faster R-CNN .*RetinaNet"):
        Detectron2RegionDetector("COCO-Detection/retinanet_R_50_FPN_1x.yaml", tmp_path / "w.pkl")
    with pytest.raises(FileNotFoundError, match="neither a file, 'butd-vg', nor a model-zoo name"):
        Detectron2RegionDetector("nonsense.yaml", tmp_path / "w.pkl")
    # Weights of the 80-class COCO FPN model into a 1600-class config: named parameter, both shapes.
    weights = random_weights(FPN, SMALL, tmp_path / "coco.pkl")
    with pytest.raises(ValueError, match=r"do not fit .*cls_score.weight: file \(81, 1024\), config \(1601, 1024\)"):
        Detectron2RegionDetector(FPN, weights, overrides={**SMALL, "MODEL.ROI_HEADS.NUM_CLASSES": 1600})
    # FPN weights into the C4 config: parameters missing from the file.
    with pytest.raises(ValueError, match="missing from the file"):
        Detectron2RegionDetector(C4, weights, overrides=SMALL)
    with pytest.raises(ValueError, match="the detectron2 backend needs a config file and weights"):
        DetectorConfig(backend="detectron2")
