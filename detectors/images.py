"""Images in: the one reader of image files and images in memory (:func:`read_image`: upright, 8-bit RGB, the
file endings of :data:`IMAGE_SUFFIXES`, one error for a file it cannot decode), which extraction, a visual
backbone's preprocessing (``vlbert.processing.images``), the pipelines, the demo and ``vlbert explain`` all use, so the
pixels a model reads are the pixels its boxes were found on; and grouping images by shape so that a batch never
pads one image to another's size (padding changes convolution outputs near the border, and so the features).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Hashable, Sequence

import numpy as np

#: The file endings of image files (compared in lower case): what extraction takes from an ``--images`` folder, what
#: ``data.image_dir`` is searched for and what a retrieval index reads from a folder. Pillow decodes them all.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")


class ImageDecodeError(ValueError):
    """An image file that cannot be decoded; the message names the file."""


def is_image_file(path: str | os.PathLike) -> bool:
    """Whether ``path``'s ending is one of :data:`IMAGE_SUFFIXES` (any case: ``.JPG`` too)."""
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def to_rgb_array(image) -> np.ndarray:
    """uint8 [H, W, 3] RGB from a PIL image or array of any common mode.

    Conversions: greyscale (L, LA, 1) and palette (P) are replicated/expanded to RGB; alpha is dropped; CMYK and
    YCbCr go through Pillow's conversion; 16-bit and 32-bit integer images (I;16, I;16B, I, as PNG/TIFF scans are)
    are scaled by their type's maximum (65535 for 16-bit), not clipped at 255; float images (F) are taken as
    [0, 1]. Arrays: uint8 [H, W], [H, W, 3] or [H, W, 4]; uint16 arrays are scaled by 65535.

    Raises:
        ValueError: an array of another shape or dtype.
    """
    if isinstance(image, np.ndarray):
        array = image
        if array.dtype == np.uint16:
            array = (array.astype(np.float32) / 65535.0 * 255.0 + 0.5).astype(np.uint8)
        if array.dtype != np.uint8:
            raise ValueError(f"image array of dtype {array.dtype}; pass uint8 or uint16")
        if array.ndim == 2:
            array = np.repeat(array[:, :, None], 3, axis=2)
        if array.ndim != 3 or array.shape[2] not in (3, 4):
            raise ValueError(f"image array of shape {array.shape}; pass [H, W], [H, W, 3] or [H, W, 4]")
        return np.ascontiguousarray(array[:, :, :3])
    mode = image.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if mode.startswith("I;16") or values.max(initial=0) <= 65535 else 2.0**32 - 1
        grey = np.clip(values / top * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return np.ascontiguousarray(np.repeat(grey[:, :, None], 3, axis=2))
    if mode == "F":
        grey = np.clip(np.asarray(image, dtype=np.float32) * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return np.ascontiguousarray(np.repeat(grey[:, :, None], 3, axis=2))
    return np.ascontiguousarray(np.asarray(image.convert("RGB")))


def load_image(path: str | os.PathLike) -> np.ndarray:
    """uint8 [H, W, 3] RGB pixels of an image file, upright (EXIF orientation applied, as detectron2's
    ``read_image`` does), converted as :func:`to_rgb_array` says.

    Raises:
        FileNotFoundError: no such file.
        ImageDecodeError: Pillow cannot decode it (not an image, truncated), or it is far larger than a photo
            (Pillow's decompression-bomb limit, about 179 megapixels); the message names the file.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image {path} does not exist")
    try:
        with Image.open(path) as image:
            image.load()
            image = ImageOps.exif_transpose(image) or image
            return to_rgb_array(image)
    except Image.DecompressionBombError as e:
        raise ImageDecodeError(
            f"image {path} is far larger than a photo ({e}); resize it (detectors read images "
            "at a few hundred pixels a side) or remove it from the image list"
        ) from e
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ImageDecodeError(
            f"cannot decode image {path} ({type(e).__name__}: {e}); remove it from the image "
            "list or re-encode it as PNG/JPEG"
        ) from e


def read_image(image) -> np.ndarray:
    """uint8 [H, W, 3] RGB pixels of an image as users give one: a file path (:func:`load_image`: EXIF
    orientation applied, every mode converted as :func:`to_rgb_array` says), a PIL image (its EXIF orientation
    applied too, as an image opened with ``Image.open`` still carries it) or an array (:func:`to_rgb_array`).

    Raises:
        FileNotFoundError, ImageDecodeError: a file (see :func:`load_image`). ValueError: an array or mode that
            cannot be converted. TypeError: anything else.
    """
    if isinstance(image, (str, os.PathLike)):
        return load_image(image)
    if isinstance(image, np.ndarray):
        return to_rgb_array(image)
    from PIL import Image, ImageOps

    if isinstance(image, Image.Image):
        return to_rgb_array(ImageOps.exif_transpose(image) or image)
    raise TypeError(f"an image is a file path, a PIL image or a uint8 array, got {type(image).__name__}")


def read_pil_image(image):
    """:func:`read_image` as a PIL RGB image (for resizing and drawing)."""
    from PIL import Image

    return Image.fromarray(read_image(image))


def shape_groups(shapes: Sequence[Hashable], max_batch: int) -> list[list[int]]:
    """Indices of ``shapes`` grouped by equal shape, each group cut to at most ``max_batch``, in order of first
    appearance: the batches that need no padding between images.

    Raises:
        ValueError: ``max_batch`` < 1.
    """
    if max_batch < 1:
        raise ValueError(f"batch size must be >= 1, got {max_batch}")
    groups: dict[Hashable, list[int]] = {}
    for i, shape in enumerate(shapes):
        groups.setdefault(shape, []).append(i)
    return [g[s : s + max_batch] for g in groups.values() for s in range(0, len(g), max_batch)]


def run_in_shape_groups(shapes: Sequence[Hashable], max_batch: int | None, run: Callable[[list[int]], list]) -> list:
    """``run(indices)`` on each group of :func:`shape_groups` (``max_batch`` None: whole groups), its outputs put
    back in input order: one output per shape, as if each had been run alone."""
    out: list = [None] * len(shapes)
    for group in shape_groups(shapes, max_batch or max(1, len(shapes))):
        for i, result in zip(group, run(group), strict=True):
            out[i] = result
    return out


def boxes_to_pixels(boxes, resized_size: tuple[int, int], original_size: tuple[int, int]):
    """float tensor [R, 4] (x1, y1, x2, y2) in a resized image's pixels -> the original image's pixels, clipped
    to it. Sizes are (height, width)."""
    import torch

    (rh, rw), (h, w) = resized_size, original_size
    pixels = boxes * torch.tensor([w / rw, h / rh, w / rw, h / rh], device=boxes.device)
    pixels[:, 0::2] = pixels[:, 0::2].clamp(0, w)
    pixels[:, 1::2] = pixels[:, 1::2].clamp(0, h)
    return pixels


__all__ = [
    "IMAGE_SUFFIXES",
    "ImageDecodeError",
    "is_image_file",
    "to_rgb_array",
    "load_image",
    "read_image",
    "read_pil_image",
    "shape_groups",
    "run_in_shape_groups",
    "boxes_to_pixels",
]
