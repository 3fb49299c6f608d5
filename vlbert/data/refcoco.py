"""Referring expressions (RefCOCO, RefCOCO+, RefCOCOg; Yu et al. 2016, Mao et al. 2016): which object of the
image does the expression name? Reads the annotation files users have and builds an offline demonstration from
composite images of easy-VQA shapes.

Public files: ``refs(<split_by>).p`` (a Python pickle: a list of refs with ``ref_id``, ``ann_id``, ``image_id``,
``split``, ``sentences`` [{``sent``, ...}]), or the same list as JSON, plus COCO's ``instances.json`` (``images``
with ``id``/``width``/``height``, ``annotations`` with ``id`` and ``bbox`` = [x, y, width, height] in pixels).
The pickle is read by :func:`load_plain_pickle`, which builds only plain containers, strings and numbers.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vlbert.common.user_files import expect, read_json
from vlbert.data.easy_vqa import color_and_shape, image_paths
from vlbert.data.grounded_text import GroundedTextDataset
from vlbert.detectors.safe_pickle import load_plain_pickle


@dataclass(frozen=True)
class ReferringExample:
    """One expression: ``ref_id``, ``image_id`` (as in the region shards), ``expression`` and the referred
    object's ``box`` (float32 [4], pixels, x1 y1 x2 y2)."""

    ref_id: str
    image_id: str
    expression: str
    box: tuple[float, float, float, float]


def load_refcoco(
    refs_file: str | os.PathLike, instances_file: str | os.PathLike, split: str, image_id_format: str = "{image_id}"
) -> list[ReferringExample]:
    """The expressions of ``split`` ("train", "val", "testA", ...) with their objects' boxes.

    Args:
        refs_file: ``refs(unc).p`` (read with :func:`load_plain_pickle`) or a JSON file holding the same list.
        instances_file: the COCO-format ``instances.json`` of the dataset.
        image_id_format: the shard image id from the COCO image id, e.g. ``"COCO_train2014_{image_id:012d}"``.
    Raises:
        FileNotFoundError: a file is missing. ValueError: refs that are not a list of refs, a ref whose ann_id is
            not in the instances, a bbox that is not [x, y, w, h] with w, h >= 0 or that lies outside its image
            (the instances' ``images`` sizes), or no expression in the split.
    """
    refs_path = Path(refs_file)
    refs = read_json(refs_path, "RefCOCO refs file") if refs_path.suffix == ".json" else load_plain_pickle(refs_path)
    if not isinstance(refs, list) or not all(
        isinstance(r, dict) and {"ann_id", "image_id", "split", "sentences"} <= set(r) for r in refs
    ):
        raise ValueError(f"{refs_file} must hold a list of refs with ann_id, image_id, split and sentences")
    instances = expect(
        read_json(instances_file, "COCO instances file"), dict, str(instances_file), "a COCO instances file"
    )
    boxes = {a["id"]: a["bbox"] for a in instances.get("annotations", [])}
    sizes = {im.get("id"): (im.get("width"), im.get("height")) for im in instances.get("images", [])}
    out = []
    for ref in refs:
        if ref["split"] != split:
            continue
        if ref["ann_id"] not in boxes:
            raise ValueError(
                f"ref {ref.get('ref_id')} names ann_id {ref['ann_id']}, which {instances_file} does not "
                "hold; pair the refs with the instances file of the same dataset"
            )
        x, y, w, h = boxes[ref["ann_id"]]
        if w < 0 or h < 0:
            raise ValueError(
                f"annotation {ref['ann_id']} has bbox {[x, y, w, h]}; COCO boxes are [x, y, width, height]"
            )
        _check_inside((x, y, w, h), sizes.get(ref["image_id"]), f"{instances_file}: annotation {ref['ann_id']}", ref)
        for k, sentence in enumerate(ref["sentences"]):
            out.append(
                ReferringExample(
                    f"{ref.get('ref_id', ref['ann_id'])}-{k}",
                    image_id_format.format(image_id=ref["image_id"]),
                    sentence["sent"],
                    (float(x), float(y), float(x + w), float(y + h)),
                )
            )
    if not out:
        raise ValueError(f"{refs_file} has no expression in split {split!r}")
    return out


def _check_inside(box: tuple, size: tuple | None, where: str, ref: dict) -> None:
    """Refuse a COCO box ``[x, y, w, h]`` that leaves its image of ``size`` (width, height; None: not listed) by
    more than a pixel, as the region readers refuse one (docs/bad-input.md row 12)."""
    if size is None or not all(isinstance(v, (int, float)) for v in size):
        return
    x, y, w, h = box
    if x < -1 or y < -1 or x + w > size[0] + 1 or y + h > size[1] + 1:
        raise ValueError(
            f"{where} (field 'bbox', referred to by ref {ref.get('ref_id')}) = {list(box)} lies outside its image "
            f"{ref['image_id']} ({size[0]}x{size[1]}); COCO boxes are [x, y, width, height] in the image's pixels: "
            "pair the refs with the instances file of the same dataset, or fix the box"
        )


TILE = 64  # easy-VQA images are 64 x 64 pixels


def easy_vqa_composites(
    split: str, count: int, directory: str | os.PathLike, seed: int = 0
) -> tuple[list[ReferringExample], dict[str, Path], dict[str, np.ndarray]]:
    """``count`` composite images of 2 to 4 easy-VQA images of ``split`` tiled in a 2 x 2 grid (128 x 128 pixels,
    empty cells white), written as PNG under ``directory`` (once), with one expression per tile whose colour and
    shape no other tile shares ("the blue triangle"), its box the tile.

    Returns:
        (examples, image id -> PNG path, image id -> float32 [n_tiles, 4] the tiles' boxes in pixels).
    """
    from PIL import Image

    truth, paths = color_and_shape(split), image_paths(split)
    ids = list(truth)
    rng = random.Random(f"refcoco-{seed}-{split}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    examples, files, tiles = [], {}, {}
    cells = [(0, 0), (TILE, 0), (0, TILE), (TILE, TILE)]
    for k in range(count):
        chosen = rng.sample(ids, rng.randint(2, 4))
        places = rng.sample(cells, len(chosen))
        image_id = f"{split}-composite-{k}"
        file = directory / f"{image_id}.png"
        if not file.is_file():
            canvas = Image.new("RGB", (2 * TILE, 2 * TILE), "white")
            for source, (x, y) in zip(chosen, places, strict=True):
                canvas.paste(Image.open(paths[source]).convert("RGB"), (x, y))
            tmp = file.with_suffix(".tmp.png")
            canvas.save(tmp)
            os.replace(tmp, file)
        files[image_id] = file
        tiles[image_id] = np.array([[x, y, x + TILE, y + TILE] for x, y in places], dtype=np.float32)
        names = [truth[s] for s in chosen]
        for (color, shape), (x, y) in zip(names, places, strict=True):
            if names.count((color, shape)) == 1:
                examples.append(
                    ReferringExample(
                        f"{image_id}-{x}-{y}",
                        image_id,
                        f"the {color} {shape}",
                        (float(x), float(y), float(x + TILE), float(y + TILE)),
                    )
                )
    return examples, files, tiles


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of boxes a [N, 4] with b [M, 4] (x1 y1 x2 y2, same units): float [N, M] (torchvision.ops.box_iou)."""
    from torchvision.ops import box_iou as iou

    return iou(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32)).numpy()


class ReferringDataset(GroundedTextDataset):
    """Expressions joined with their image's regions; the training target is the region whose box overlaps the
    referred object most (IoU).

    Items: input_ids, the region item, ``target_region`` (int), ``target_box`` (normalised xyxy) and ``index``.
    Raises:
        ValueError: an image without regions (the message names the expression and the fix).
    """

    kind, id_field, text_field = "expression", "ref_id", "expression"

    def targets(self, example, regions) -> dict:
        r = regions[0]
        scale = np.array([r.width, r.height, r.width, r.height], dtype=np.float32)
        target = int(box_iou(np.array([example.box]), r.boxes[: self.processor.max_regions]).argmax())
        return {"target_region": target, "target_box": np.array(example.box, dtype=np.float32) / scale}


__all__ = ["ReferringExample", "load_refcoco", "easy_vqa_composites", "box_iou", "ReferringDataset"]
