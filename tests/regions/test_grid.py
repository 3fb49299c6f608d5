"""The grid backend (detectors/grid.py; Jiang et al. 2020): cells that tile the original image, each cell's feature
the mean of the feature-map positions under it, batched extraction equal to one image at a time, its own
fingerprint, and shards written by tools/extract_regions.py --backend grid."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch
from helpers.builders import tool
from PIL import Image
from vlbert.detectors.config import DetectorConfig
from vlbert.detectors.grid import GRID_BACKBONES, GridExtractor, GridOptions, TimmGridBackbone, cell_boxes
from vlbert.detectors.shards import read_shards, shard_paths

from vlbert.commands import run_tool

INPUT = 128  # EfficientNet-Lite0 at 128 pixels: a 4 x 4 final map (stride 32), 16 x 16 at stage 2 (stride 8)


@pytest.fixture(scope="module")
def backbone():
    """The packaged EfficientNet-Lite0 as a grid backbone at 128 pixels (loaded once for the module)."""
    return TimmGridBackbone(GridOptions(input_size=INPUT), "", "cpu")


def photo(height: int, width: int, index: int = 0) -> np.ndarray:
    """A real photo (scikit-image's), resized to height x width: uint8 [H, W, 3]."""
    import skimage.data

    image = (skimage.data.astronaut, skimage.data.coffee, skimage.data.chelsea)[index % 3]()
    return np.asarray(Image.fromarray(image).resize((width, height)))


def assert_tiles(regions_or_boxes, height: int, width: int) -> None:
    """The boxes lie inside the image, have positive area, overlap nowhere and their areas sum to the image's:
    together, they cover it exactly."""
    boxes = np.asarray(regions_or_boxes, dtype=np.float64)
    assert (boxes[:, 0] >= 0).all() and (boxes[:, 1] >= 0).all()
    assert (boxes[:, 2] <= width).all() and (boxes[:, 3] <= height).all()
    assert ((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).all()
    ix = np.clip(
        np.minimum(boxes[:, None, 2], boxes[None, :, 2]) - np.maximum(boxes[:, None, 0], boxes[None, :, 0]), 0, None
    )
    iy = np.clip(
        np.minimum(boxes[:, None, 3], boxes[None, :, 3]) - np.maximum(boxes[:, None, 1], boxes[None, :, 1]), 0, None
    )
    overlap = ix * iy
    np.fill_diagonal(overlap, 0)
    assert overlap.max() == 0, "cells overlap"
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).sum()
    assert area == pytest.approx(height * width, rel=1e-6)


@pytest.mark.parametrize("height,width,grid", [(97, 130, 6), (50, 121, 7), (64, 64, 1), (33, 200, 5), (7, 9, 4)])
def test_cells_tile_the_image_exactly(height, width, grid):
    boxes = cell_boxes(height, width, grid)
    assert boxes.dtype == np.float32 and boxes.shape == (grid * grid, 4)
    assert_tiles(boxes, height, width)
    rows = boxes.reshape(grid, grid, 4)  # row-major: row r, column c
    assert (rows[:, :-1, 2] == rows[:, 1:, 0]).all() and (rows[:-1, :, 3] == rows[1:, :, 1]).all()  # shared edges
    assert rows[0, 0, :2].tolist() == [0, 0] and rows[-1, -1, 2:].tolist() == [width, height]


def test_regions_are_cells_of_the_original_image(backbone):
    image = photo(75, 130)  # not square, neither side divisible by the grid
    regions = GridExtractor(backbone, 4)(image, "a")
    assert (regions.height, regions.width, regions.num_regions) == (75, 130, 16)
    assert_tiles(regions.boxes, 75, 130)  # in the original's pixels, not the backbone's 128 x 128 input
    np.testing.assert_array_equal(regions.boxes, cell_boxes(75, 130, 4))
    assert regions.feature_dim == backbone.feature_dim == 1280 + 40
    assert regions.detector == "grid4x4:timm:efficientnet_lite0@128+stage2(weights=efficientnet-lite0-57934424.pth)"


def close(a, b):
    """Equal up to float16 storage (a relative 1e-3)."""
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-3, atol=2e-3)


def test_a_cell_is_the_mean_of_the_map_positions_it_covers(backbone):
    image = photo(96, 144)
    (final, low), sizes = backbone.forward([image])
    assert sizes == [(INPUT, INPUT)] and final.shape == (1, 1280, 4, 4) and low.shape == (1, 40, 16, 16)
    final, low = final[0].numpy(), low[0].numpy()
    # a grid as fine as the final map: each cell is one position of it (and a 4 x 4 block of the stride-8 map)
    cells = GridExtractor(backbone, 4)(image, "a")
    for k in range(16):
        r, c = divmod(k, 4)
        close(cells.features[k, :1280], final[:, r, c])
        close(cells.features[k, 1280:], low[:, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4].mean((1, 2)))
    # a 2 x 2 grid: each cell the mean of a 2 x 2 block of positions
    quarters = GridExtractor(backbone, 2)(image, "a")
    close(quarters.features[3, :1280], final[:, 2:, 2:].mean((1, 2)))  # bottom right
    close(quarters.features[1, 1280:], low[:, :8, 8:].mean((1, 2)))  # top right
    # one cell: the global mean, and its class distribution is the classifier's on the whole image
    whole = GridExtractor(backbone, 1)(image, "a")
    close(whole.features[0], np.concatenate([final.mean((1, 2)), low.mean((1, 2))]))
    head = backbone.model.forward_head(torch.from_numpy(final)[None]).softmax(-1)[0].detach().numpy()
    np.testing.assert_allclose(whole.class_probs[0].astype(np.float32), head, atol=1e-3)
    assert whole.scores[0] == pytest.approx(head.max(), abs=1e-3)
    np.testing.assert_allclose(cells.scores, cells.class_probs.astype(np.float32).max(1), atol=1e-3)
    with pytest.raises(ValueError, match="grid_size 5 exceeds the backbone's 4x4 feature map.*input_size"):
        GridExtractor(backbone, 5)(image, "a")


def test_batched_extraction_equals_one_image_at_a_time(backbone):
    images = [photo(*size, index=i) for i, size in enumerate([(64, 64), (96, 64), (64, 64), (50, 120), (41, 77)])]
    ids = [f"im{i}" for i in range(len(images))]
    extractor = GridExtractor(backbone, 3)
    alone = [extractor(image, image_id) for image, image_id in zip(images, ids, strict=True)]
    for batch_size in (None, 2):
        together = extractor.extract_batch(images, ids, batch_size=batch_size)
        assert [r.image_id for r in together] == ids
        for a, b in zip(together, alone, strict=True):
            assert (a.height, a.width) == (b.height, b.width)
            np.testing.assert_array_equal(a.boxes, b.boxes)
            x, y = a.features.astype(np.float32), b.features.astype(np.float32)
            assert (np.linalg.norm(x - y, axis=1) / np.linalg.norm(y, axis=1)).max() < 1e-2  # batched conv rounding
            np.testing.assert_allclose(a.class_probs.astype(np.float32), b.class_probs.astype(np.float32), atol=1e-3)


class PixelBackbone:
    """A backbone that reads each image at its own size and returns its pixels (0..1) as the feature map: a cell's
    feature is then the mean colour inside its box. No classifier. Records the input shapes of each forward."""

    name, feature_dim, num_classes, classifier = "pixels", 3, 0, None

    def __init__(self):
        self.batches = []

    def input_shape(self, height, width):
        return height, width

    def forward(self, images):
        self.batches.append({a.shape for a in images})
        maps = torch.stack([torch.tensor(a).permute(2, 0, 1).float() / 255 for a in images])
        return [maps], [a.shape[:2] for a in images]


def test_a_backbone_that_reads_each_size_gets_batches_of_one_size_and_cells_align_with_boxes(monkeypatch):
    pixels = PixelBackbone()
    images = [photo(*size, index=i) for i, size in enumerate([(60, 90), (30, 45), (60, 90), (30, 45)])]
    extractor = GridExtractor(pixels, 3)
    regions = extractor.extract_batch(images, ["a", "b", "c", "d"])
    assert all(len(shapes) == 1 for shapes in pixels.batches) and len(pixels.batches) == 2  # never mixed sizes
    for image, r in zip(images, regions, strict=True):
        assert r.class_probs is None and (r.scores == 1).all()
        for box, feature in zip(r.boxes.astype(int), r.features, strict=True):
            x1, y1, x2, y2 = box
            close(feature, image[y1:y2, x1:x2].reshape(-1, 3).mean(0) / 255)  # the pixels under the box
    # a new backbone is one line of GRID_BACKBONES
    monkeypatch.setitem(GRID_BACKBONES, "pixels", lambda options, weights, device: pixels)
    built = DetectorConfig(backend="grid", options=GridOptions(backbone="pixels", grid_size=2)).build()
    assert built.name == "grid2x2:pixels" and built(images[0], "a").num_regions == 4


def test_fingerprint_is_the_grids_own_and_bad_options_are_refused():
    grid = DetectorConfig(backend="grid")
    assert grid.fingerprint() != DetectorConfig(backend="timm").fingerprint()  # same backbone and weights
    assert grid.fingerprint() == DetectorConfig.from_record(asdict(grid)).fingerprint()
    changed = {
        grid.with_options(**{name: value}).fingerprint()
        for name, value in (("grid_size", 4), ("input_size", 160), ("low_level_stage", -1))
    }
    assert len(changed | {grid.fingerprint()}) == 4
    assert grid.difference(grid.with_options(grid_size=4)) == "grid_size 6 vs 4"
    section = DetectorConfig.from_section({"backend": "grid", "options": {"grid_size": 4, "input_size": 160}})
    assert section.options == GridOptions(grid_size=4, input_size=160)  # a run config's detector section
    refusals = {
        "detector.options.grid_size must be >= 1": {"grid_size": 0},
        "detector.options.input_size must be >= 1": {"input_size": 0},
        "detector.options.backbone must be one of timm": {"backbone": "resnet"},
        "detector.options.low_level_stage must be": {"low_level_stage": -2},
        "resnet50 has no packaged weights: pass its weights": {"architecture": "resnet50"},
    }
    for message, options in refusals.items():
        with pytest.raises(ValueError, match=message):
            DetectorConfig.from_section({"backend": "grid", "options": options})


def test_the_tool_writes_readable_grid_shards(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    sizes = {"astronaut": (72, 96), "coffee": (50, 81), "chelsea": (72, 96)}
    for i, (name, (h, w)) in enumerate(sizes.items()):
        Image.fromarray(photo(h, w, index=i)).save(images / f"{name}.png")
    out = tmp_path / "grid"
    argv = ["--images", str(images), "--backend", "grid", "--input-size", "64", "--grid-size", "2"]
    assert run_tool(tool("extract_regions"), [*argv, "--output-dir", str(out)]) == 0
    regions = {r.image_id: r for r in read_shards(shard_paths(out))}
    assert sorted(regions) == sorted(sizes)
    for name, (h, w) in sizes.items():
        r = regions[name]
        assert (r.height, r.width, r.num_regions, r.feature_dim) == (h, w, 4, 1320)
        assert_tiles(r.boxes, h, w)
        assert r.class_probs.shape == (4, 1000) and np.isfinite(r.features.astype(np.float32)).all()
    info = json.loads((out / "detector.json").read_text())
    config = DetectorConfig.from_record(info["config"])
    assert config.backend == "grid" and config.options == GridOptions(input_size=64, grid_size=2)
    assert info["fingerprint"] == config.fingerprint() != DetectorConfig(backend="timm").fingerprint()
    assert info["detector"].startswith("grid2x2:timm:efficientnet_lite0@64") and len(info["class_names"]) == 1000
