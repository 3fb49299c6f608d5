"""Images for a model with a visual backbone (``config.visual_backbone``): where each image's file is, how its pixels
are preprocessed as the backbone was trained (:data:`PREPROCESSING`, a table of named recipes), and how a batch of
images of different sizes is padded into ``images`` [B, 3, H, W] + ``image_sizes`` [B, 2] (height, width). The
boxes stay those of the region shards (the run's detector), normalised by the image's own size, so resizing the
image keeps them valid.

Sources: VL-BERT (jackroos/VL-BERT at 4373674, ``vqa/data/transforms/build.py`` ``build_transforms``,
``vqa/data/transforms/transforms.py`` ``Resize.get_size`` and ``Normalize(to_bgr255=True)``, ``cfgs/vqa/
base_4x16G_fp32.yaml`` ``SCALES: [600, 1000]``, ``PIXEL_MEANS: [102.9801, 115.9465, 122.7717]``, ``PIXEL_STDS: 1``);
ImageNet's RGB mean/std as torchvision and timm normalise (``timm.data.IMAGENET_DEFAULT_MEAN`` / ``_STD``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
from PIL import Image

from vlbert.detectors.images import IMAGE_SUFFIXES, is_image_file, read_pil_image
from vlbert.detectors.regions import Regions


@dataclass(frozen=True)
class ImagePreprocessing:
    """How an image file becomes the backbone's input.

    Attributes:
        name: the entry of :data:`PREPROCESSING` it came from.
        bgr: channels in BGR order (Caffe / Detectron / VL-BERT) instead of RGB.
        scale: the 0..255 pixel values are multiplied by it first (1/255: [0, 1]; 1: 0..255).
        mean, std: per channel (in the channel order above), subtracted then divided, after ``scale``.
        short_side: the image is resized (bilinear) so its shorter side has this many pixels (0 = not resized) ...
        max_side: ... unless its longer side would then exceed this (0 = no limit): then the longer side is
            ``max_side`` (VL-BERT's ``Resize.get_size``: the short side int(max_side * short / long)).
    """

    name: str
    bgr: bool
    scale: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    short_side: int = 0
    max_side: int = 0

    def size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after resizing a ``width`` x ``height`` image (pixels), as VL-BERT's ``get_size``:
        integer sizes, the short side first, the long side from the aspect ratio (truncated)."""
        if not self.short_side:
            return width, height
        short, long = min(width, height), max(width, height)
        side = self.short_side
        if self.max_side and long / short * side > self.max_side:
            side = int(self.max_side * short / long)
        if short == side:
            return width, height
        return (side, int(side * height / width)) if width < height else (int(side * width / height), side)

    def __call__(self, image) -> torch.Tensor:
        """float32 [3, h, w]: ``image`` (a file path, PIL image or uint8 array, read by
        :func:`vlbert.detectors.images.read_image`, the reader extraction uses: EXIF orientation applied, 16-bit scaled)
        resized (:meth:`size`), in the channel order, scaled and normalised.

        Raises:
            FileNotFoundError, vlbert.detectors.images.ImageDecodeError: a file that is missing or cannot be decoded.
            ValueError: an array or image mode it cannot convert.
        """
        image = read_pil_image(image)
        w, h = self.size(*image.size)
        if (w, h) != image.size:
            image = image.resize((w, h), Image.BILINEAR)
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32).copy()).permute(2, 0, 1)
        if self.bgr:
            pixels = pixels.flip(0)
        mean = torch.tensor(self.mean).view(3, 1, 1)
        std = torch.tensor(self.std).view(3, 1, 1)
        return (pixels * self.scale - mean) / std

    def read(self, image) -> torch.Tensor:
        """:meth:`__call__` of an image given as a pipeline takes it: a file path, a PIL image, or a uint8 array
        [H, W, 3] RGB (any mode :func:`vlbert.detectors.images.to_rgb_array` converts).

        Raises:
            FileNotFoundError, vlbert.detectors.images.ImageDecodeError: a file that is missing or cannot be decoded.
            ValueError: an array or image mode it cannot convert.
        """
        return self(image)

    def record(self) -> dict:
        """The fields, JSON-ready: what a run's processor saves (``processor.json``'s ``image_preprocessing``)."""
        return {**asdict(self), "mean": list(self.mean), "std": list(self.std)}

    @classmethod
    def from_record(cls, record: Mapping | str) -> "ImagePreprocessing":
        """The inverse of :meth:`record`; a name alone is that entry of :data:`PREPROCESSING` (what a converted
        checkpoint records, e.g. "vl-bert"). Raises ValueError for a record with other fields or an unknown name."""
        if isinstance(record, str):
            return image_preprocessing(record)
        try:
            return cls(**{**record, "mean": tuple(record["mean"]), "std": tuple(record["std"])})
        except (TypeError, KeyError) as e:
            raise ValueError(
                f"an image_preprocessing record must have the fields {list(cls.__dataclass_fields__)}, "
                f"got {sorted(record)}"
            ) from e


#: name -> how its backbones were trained: "imagenet" (torchvision / timm ImageNet models: RGB in [0, 1], ImageNet
#: mean and std; short side 224) and "vl-bert" (VL-BERT's Caffe ResNet: BGR 0..255, the Detectron means
#: subtracted, short side 600, long side <= 1000).
PREPROCESSING = {
    "imagenet": ImagePreprocessing("imagenet", False, 1 / 255, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 224),
    "vl-bert": ImagePreprocessing("vl-bert", True, 1.0, (102.9801, 115.9465, 122.7717), (1.0, 1.0, 1.0), 600, 1000),
}
#: the default entry by ``visual_backbone.kind`` (VL-BERT's ResNet was trained on its own preprocessing).
DEFAULT_PREPROCESSING = {"caffe-resnet": "vl-bert", "torchvision-resnet": "imagenet", "timm": "imagenet"}


def image_preprocessing(name: str, short_side: int = 0, max_side: int = 0) -> ImagePreprocessing:
    """``PREPROCESSING[name]``, its ``short_side`` / ``max_side`` replaced where given (> 0; -1: not resized /
    no limit).

    Raises:
        ValueError: an unknown name (the known ones named).
    """
    if name not in PREPROCESSING:
        raise ValueError(
            f"data.image_preprocessing must be one of {', '.join(repr(k) for k in PREPROCESSING)}, got {name!r}"
        )
    chosen = PREPROCESSING[name]
    changes = {k: max(v, 0) for k, v in (("short_side", short_side), ("max_side", max_side)) if v}
    return replace(chosen, **changes)


def backbone_preprocessing(
    backbone: Mapping, name: str = "", short_side: int = 0, max_side: int = 0
) -> ImagePreprocessing:
    """The preprocessing of the images of a model whose ``visual_backbone`` section is ``backbone``: the entry
    ``name`` (a :data:`PREPROCESSING` key; "" = the backbone kind's, :data:`DEFAULT_PREPROCESSING`; an unknown kind:
    "imagenet"), its sides replaced as :func:`image_preprocessing` replaces them.

    Raises:
        ValueError: an unknown name (the known ones named).
    """
    name = name or DEFAULT_PREPROCESSING.get(backbone.get("kind", "caffe-resnet"), "imagenet")
    return image_preprocessing(name, short_side, max_side)


def _image_files_in(folder: Path) -> dict[str, Path]:
    """name without its ending -> file, for the image files directly in ``folder`` (:func:`vlbert.detectors.images.
    is_image_file`; the first in sorted order where two share a name), {} for a folder that does not exist."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    files: dict[str, Path] = {}
    for entry in entries:
        if is_image_file(entry.name) and entry.is_file():
            files.setdefault(Path(entry.name).stem, Path(entry.path))
    return files


def image_files(image_ids: Sequence[str], directory: str | os.PathLike) -> dict[str, Path]:
    """image id -> its file under ``directory``, by extraction's rule (``vlbert extract --images
    DIRECTORY`` names each image by its path under the directory without its ending): ``<directory>/<id>`` itself
    when that is a file, else ``<directory>/<id><ending>`` for an ending of :data:`vlbert.detectors.images.IMAGE_SUFFIXES`
    in any case (``.webp``, ``.JPG``, ...). So ``data.image_dir`` set to the folder the regions were extracted from
    finds every image. Each folder is listed once.

    Raises:
        FileNotFoundError: the directory does not exist, or an image has no file (the first missing one named,
            with the count and the fix).
    """
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"data.image_dir {root} is not a directory; set it to the directory of the images "
            "whose regions the shards hold"
        )
    found, missing, listed = {}, [], {}
    for image_id in dict.fromkeys(image_ids):
        path = root / image_id
        if not path.is_file():
            if path.parent not in listed:
                listed[path.parent] = _image_files_in(path.parent)
            path = listed[path.parent].get(path.name)
        if path is None:
            missing.append(image_id)
        else:
            found[image_id] = path
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} image(s) have regions but no file under data.image_dir {root}, e.g. "
            f"{missing[0]!r} (looked for {missing[0]}{{,{','.join(IMAGE_SUFFIXES)}}} in any "
            "case); copy them there or point data.image_dir at them"
        )
    return found


class ImageReader:
    """image id -> its preprocessed pixels (float32 [3, h, w]), read from its file each time (memory does not grow
    with the number of images).

    Args:
        files: image id -> path (:func:`image_files`, or a dataset's own list such as easy-VQA's).
        preprocessing: an :class:`ImagePreprocessing`.
    Raises (on call):
        KeyError: an image id without a file (named).
    """

    def __init__(self, files: Mapping[str, Path], preprocessing: ImagePreprocessing):
        self.files, self.preprocessing = dict(files), preprocessing

    def __call__(self, image_id: str) -> torch.Tensor:
        path = self.files.get(image_id)
        if path is None:
            raise KeyError(f"image {image_id!r} has regions but no image file; the visual backbone reads its pixels")
        return self.preprocessing.read(path)


@dataclass
class ImageRegions(Regions):
    """An image's :class:`~vlbert.detectors.regions.Regions` with its preprocessed ``pixels`` (float32 [3, h, w]): what a
    pipeline over a model with a visual backbone builds per image, so the boxes (the run's detector's) and the pixels
    (the run's preprocessing) travel together into :func:`vlbert.processing.regions.region_item`."""

    pixels: torch.Tensor | None = None


def with_image(regions: Regions, pixels: torch.Tensor) -> ImageRegions:
    """``regions`` as :class:`ImageRegions` carrying ``pixels`` (float32 [3, h, w])."""
    return ImageRegions(**{f.name: getattr(regions, f.name) for f in fields(Regions)}, pixels=pixels)


def pad_images(pixels: Sequence[torch.Tensor], multiple: int = 1) -> dict[str, torch.Tensor]:
    """Pad images of different sizes into one batch, each at the top left, zeros elsewhere (after normalisation:
    the mean colour), as VL-BERT's ``vqa/data/collate_batch.py`` ``BatchCollator`` pads them
    (``clip_pad_images(..., pad=0)``).

    Args:
        pixels: float [3, h_i, w_i] each.
        multiple: round H and W up to a multiple of this (the backbone's stride, 1 = off).
    Returns:
        ``images`` float32 [B, 3, H, W] and ``image_sizes`` int64 [B, 2] (h_i, w_i).
    Raises:
        ValueError: no images.
    """
    if not pixels:
        raise ValueError("cannot pad an empty list of images")
    sizes = torch.tensor([tuple(p.shape[-2:]) for p in pixels], dtype=torch.long)
    h, w = (-(-sizes.max(0).values // multiple) * multiple).tolist()
    images = torch.zeros(len(pixels), 3, h, w, dtype=torch.float32)
    for i, p in enumerate(pixels):
        images[i, :, : p.shape[1], : p.shape[2]] = p
    return {"images": images, "image_sizes": sizes}


__all__ = [
    "ImagePreprocessing",
    "PREPROCESSING",
    "DEFAULT_PREPROCESSING",
    "image_preprocessing",
    "backbone_preprocessing",
    "image_files",
    "ImageReader",
    "pad_images",
    "ImageRegions",
    "with_image",
]
