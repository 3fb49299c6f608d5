"""The base of the inference pipelines: a run's model, tokenizer and detector; how a call's images and texts pair
up (one image broadcast over several texts, as transformers' VQA pipeline does); batching."""

from __future__ import annotations

import json
import os
from typing import ClassVar, Sequence

import numpy as np
import torch

from detectors.regions import Regions
from vlbert.inference.run import ImageInput, RunInputs
from vlbert.models.vqa import VLBertForVQA


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _as_list(value, single: bool) -> list:
    return [value] if single else list(value)


def _is_single(image) -> bool:
    """Whether ``image`` is one image (not a list of them)."""
    return isinstance(image, (str, os.PathLike, Regions, np.ndarray)) or hasattr(image, "mode")


def _examples(image, text) -> tuple[list, list[str], bool]:
    """(images, texts, single) of a call: one image and one text -> one example (``single``: return one result);
    one image and a list of texts -> the image with each text (as transformers' VQA pipeline broadcasts it), and
    a list of images with one text -> that text with each image; two lists pair up.

    Raises:
        ValueError: two lists of different lengths.
    """
    single_image, single_text = _is_single(image), isinstance(text, str)
    if single_image and single_text:
        return [image], [text], True
    images = [image] * len(text) if single_image else list(image)
    texts = [text] * len(images) if single_text else list(text)
    if len(images) != len(texts):
        raise ValueError(f"{len(images)} images but {len(texts)} texts: pass one text per image, or one image "
                         "(or one text) for all")
    return images, texts, False


class Pipeline:
    """Base class: a run's model (eval mode, on ``device``) and :class:`~vlbert.inference.run.RunInputs`.

    Args:
        run_dir: a run's output directory (``config.json``, ``model.safetensors``, tokenizer, ``inference.json``).
        device: "cpu", "cuda", ... (default: CUDA when available).
        detector: a :class:`~detectors.config.DetectorConfig` to extract with instead of the run's own (refused
            unless it has the run's fingerprint or ``allow_other_detector``).
        allow_other_detector: accept another detector's regions, at the cost of silently worse predictions.
        batch_size: examples per forward pass (and images per detector call).
    Raises:
        FileNotFoundError: ``run_dir`` has no inference.json or no model.
        ValueError: the run is of another task than the pipeline's, or another detector (both named).
    """

    tasks: ClassVar[tuple[str, ...]] = ()
    model_class: ClassVar[type] = VLBertForVQA
    #: other model classes a run of the task may hold (config.json's ``architectures`` decides).
    model_classes: ClassVar[tuple[type, ...]] = ()

    def __init__(self, run_dir: str | os.PathLike, device: str | None = None, detector=None,
                 allow_other_detector: bool = False, batch_size: int = 16):
        self.device = torch.device(device or _default_device())
        self.inputs = RunInputs(run_dir, detector, allow_other_detector, str(self.device))
        task = self.inputs.info["task"]
        if task not in self.tasks:
            raise ValueError(f"{run_dir} is a {task!r} run; {type(self).__name__} takes {' or '.join(self.tasks)} "
                             f"runs: use vlbert.inference.pipeline({str(run_dir)!r}), which picks the task's own")
        self.model = self.architecture().from_pretrained(self.inputs.run_dir).to(self.device).eval()
        self.labels: list[str] | None = self.inputs.info.get("labels")
        self.batch_size = batch_size

    def architecture(self) -> type:
        """The model class to load: the one config.json names when it is among :attr:`model_classes` (a converted
        VisualBERT's VQA or NLVR2 head), else :attr:`model_class`."""
        path = self.inputs.run_dir / "config.json"
        saved = json.loads(path.read_text(encoding="utf-8")).get("architectures") or [] if path.is_file() else []
        return next((c for c in self.model_classes if c.__name__ in saved), self.model_class)

    @property
    def tokenizer(self):
        return self.inputs.tokenizer

    def regions(self, images: Sequence[ImageInput], boxes=None) -> list[Regions]:
        """Each image's regions (extracted with the run's detector, or checked): :meth:`RunInputs.regions`."""
        return self.inputs.regions(images, boxes, self.batch_size)

    @torch.no_grad()
    def logits(self, images: Sequence[ImageInput], texts: Sequence[str], boxes=None) -> tuple[torch.Tensor, list]:
        """The model's logits (float32, CPU) for each (image, text), in ``batch_size`` chunks, and the regions."""
        if len(images) != len(texts):
            raise ValueError(f"{len(images)} images but {len(texts)} texts: pass one text per image")
        out, all_regions = [], []
        for start in range(0, len(texts), self.batch_size):
            chunk = slice(start, start + self.batch_size)
            regions = self.regions(images[chunk], None if boxes is None else boxes[chunk])
            suffix = getattr(self.model, "question_suffix", "")  # VisualBERT's VQA reads a [MASK] at the end
            batch = self.inputs.batch([t + suffix for t in texts[chunk]], regions, self.device)
            out.append(self.model(**batch).logits.float().cpu())
            all_regions += regions
        return torch.cat(out), all_regions


__all__ = ["Pipeline"]
