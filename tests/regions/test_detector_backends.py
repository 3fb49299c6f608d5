"""Detector backends are a table (detectors/backends.py): another timm architecture extracts through
tools/extract_regions.py with no library edit; a new backend, one module and one table line, gets its flags and
its --backend choice in the tool; the tool refuses bad backend flags in one line (docs/bad-input.md 92-95)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from helpers.builders import tool
from PIL import Image
from vlbert.detectors.backends import DETECTOR_BACKENDS, DetectorBackend
from vlbert.detectors.config import DetectorConfig
from vlbert.detectors.regions import Regions
from vlbert.detectors.shards import read_shards, shard_paths

from vlbert.commands import run_tool

ARCHITECTURE = "mobilenetv3_small_050"  # 1.6 M parameters: timm builds it in milliseconds


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Three small photos (two sizes), as a user's image folder."""
    import skimage.data

    folder = tmp_path_factory.mktemp("photos")
    for name, image in (
        ("astronaut", skimage.data.astronaut()),
        ("coffee", skimage.data.coffee()),
        ("chelsea", skimage.data.chelsea()),
    ):
        Image.fromarray(image).resize((96, 72)).save(folder / f"{name}.png")
    return folder


@pytest.fixture(scope="module")
def mobilenet_weights(tmp_path_factory):
    """Random timm weights of ARCHITECTURE as the hub ships them (a safetensors state dict in timm's names)."""
    import timm
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("weights") / "model.safetensors"
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in timm.create_model(ARCHITECTURE).state_dict().items()}, str(path))
    return path


def test_another_timm_architecture_extracts_through_the_tool(tmp_path, photos, mobilenet_weights):
    import timm

    out = tmp_path / "regions"
    argv = [
        "--images",
        str(photos),
        "--architecture",
        ARCHITECTURE,
        "--weights",
        str(mobilenet_weights),
        "--input-size",
        "64",
        "--max-proposals",
        "4",
        "--output-dir",
        str(out),
        "--draw",
        str(tmp_path / "b.png"),
    ]
    assert run_tool(tool("extract_regions"), argv) == 0
    assert Image.open(tmp_path / "b.png").width > 0  # boxes drawn with the classifier's ImageNet names
    regions = list(read_shards(shard_paths(out)))
    channels = timm.create_model(ARCHITECTURE, features_only=True).feature_info.channels()  # what timm says
    assert len(regions) == 3 and {r.features.shape[1] for r in regions} == {channels[-1] + channels[2]}
    assert all(r.class_probs.shape[1] == 1000 and np.isfinite(r.features.astype(np.float32)).all() for r in regions)
    info = json.loads((out / "detector.json").read_text())
    config = DetectorConfig.from_record(info["config"])
    assert config.options.architecture == ARCHITECTURE and ARCHITECTURE in info["detector"]
    assert (
        info["fingerprint"]
        == config.fingerprint()
        != config.with_options(architecture="efficientnet_lite0").fingerprint()
    )  # the architecture names the features
    assert config.weights_sha256 and config.weights_identity() == "sha256:" + config.weights_sha256


@dataclass
class TilesOptions:
    """A toy backend's options: the image cut into cells x cells boxes."""

    cells: int = field(default=2, metadata={"help": "boxes per side"})

    def validate(self, weights: str) -> None:
        if self.cells < 1:
            raise ValueError(f"detector.options.cells must be >= 1, got {self.cells}")


class TilesExtractor:
    """Each cell's mean colour (0..1) as its feature: a detector with no model at all."""

    feature_dim = 3

    def __init__(self, options: TilesOptions):
        self.cells, self.name = options.cells, f"tiles{options.cells}"

    def extract_batch(self, images, image_ids, boxes=None):
        out = []
        for image, image_id in zip(images, image_ids, strict=True):
            a = np.asarray(image.convert("RGB") if hasattr(image, "convert") else image, dtype=np.float32) / 255
            h, w, n = a.shape[0], a.shape[1], self.cells
            cells = [(x * w // n, y * h // n, (x + 1) * w // n, (y + 1) * h // n) for y in range(n) for x in range(n)]
            features = np.stack([a[y1:y2, x1:x2].mean((0, 1)) for x1, y1, x2, y2 in cells])
            out.append(
                Regions(image_id, h, w, np.array(cells, np.float32), features, np.ones(len(cells)), detector=self.name)
            )
        return out


def test_a_new_backend_is_one_module_and_one_table_line(tmp_path, photos, monkeypatch, capsys):
    monkeypatch.setitem(
        DETECTOR_BACKENDS,
        "tiles",
        DetectorBackend(
            TilesOptions, lambda options, weights, device: TilesExtractor(options), ("cells",), "a grid of boxes"
        ),
    )
    with pytest.raises(SystemExit):
        tool("extract_regions")(["--help"])
    text = capsys.readouterr().out
    assert "tiles: a grid of boxes" in text and "--cells CELLS" in text and "tiles: boxes per side" in text
    out = tmp_path / "tiles"
    argv = ["--images", str(photos), "--backend", "tiles", "--cells", "3", "--output-dir", str(out)]
    assert run_tool(tool("extract_regions"), argv) == 0
    regions = {r.image_id: r for r in read_shards(shard_paths(out))}
    photo = np.asarray(Image.open(photos / "coffee.png"), dtype=np.float32) / 255  # 96 x 72: cells of 32 x 24
    np.testing.assert_allclose(
        regions["coffee"].features[4].astype(np.float32), photo[24:48, 32:64].mean((0, 1)), atol=1e-3
    )
    info = json.loads((out / "detector.json").read_text())
    assert info["config"] == {"backend": "tiles", "weights": "", "weights_sha256": "", "options": {"cells": 3}}
    assert info["fingerprint"] == DetectorConfig.from_record(info["config"]).fingerprint()


def test_bad_backend_flags_are_refused_in_one_line(tmp_path, photos, mobilenet_weights, capsys):
    base = ["--images", str(photos), "--input-size", "64", "--max-proposals", "4"]
    cases = {
        "'mobilenetv3_small050' is no timm architecture \\(close: mobilenetv3_small_050": [
            "--architecture",
            "mobilenetv3_small050",
            "--weights",
            str(mobilenet_weights),
        ],
        "the timm architecture resnet18 has no packaged weights: pass its weights file": ["--architecture", "resnet18"],
        "does not fit timm's mobilenetv3_small_075: .* in the file, .* in the model; pass the weights of mobilenetv3": [
            "--architecture",
            "mobilenetv3_small_075",
            "--weights",
            str(mobilenet_weights),
        ],
        "--min-boxes is an option of the torchvision, butd and detectron2 backends, not of timm; drop it": [
            "--min-boxes",
            "5",
        ],
        "low_level_stage 7 is no feature level of mobilenetv3_small_050 \\(levels: channels 0: 16,": [
            "--architecture",
            ARCHITECTURE,
            "--weights",
            str(mobilenet_weights),
            "--low-level-stage",
            "7",
        ],
    }
    for message, argv in cases.items():
        capsys.readouterr()
        out = tmp_path / "out"
        assert run_tool(tool("extract_regions"), [*base, *argv, "--output-dir", str(out)]) == 2, message
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and re.search(message, errors[0]), (message, errors)
        assert not out.exists() or not list(out.glob("*.tar"))  # nothing that looks finished


def test_a_transformer_backbone_is_refused_by_name():
    """A ViT gives tokens [N, L, C], not a feature map to RoI-align on."""
    import timm
    from vlbert.detectors.backbone import BackboneRegionExtractor

    extractor = BackboneRegionExtractor(timm.create_model("test_vit"), input_size=160, low_level_stage=None)
    with pytest.raises(ValueError, match="gives features of shape .* not a feature map .*pass a convolutional timm"):
        extractor.extract_batch([np.zeros((40, 50, 3), np.uint8)], ["x"])
