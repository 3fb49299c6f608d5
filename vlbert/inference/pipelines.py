"""One object per task that answers about raw images with a trained run: ``pipeline(run_dir)(image, text)``.

The shape is transformers' ``pipeline("visual-question-answering")``: built from a directory, called on images and
text, batching internally, returning plain dicts. A region-based model also needs the detector that made its
training regions: each pipeline rebuilds it from the run's ``inference.json`` and refuses another one
(:mod:`vlbert.inference.run`). Inputs are prepared exactly as the task's dataset prepares them (same tokenizer,
truncation, ``region_item`` and padding), so on the same regions a pipeline gives the recipe's evaluation outputs
(tests/test_inference.py checks every task).

Images: a file path, a PIL image, a uint8 array [H, W, 3] (RGB) or the image's :class:`~detectors.regions.Regions`.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from detectors.images import load_image, to_rgb_array
from detectors.regions import Regions
from vlbert.analysis.fill_mask import fill_mask
from vlbert.inference.run import RunInputs, read_inference_info
from vlbert.models.referring import VLBertForReferringExpressions
from vlbert.models.vl import VLBertForPreTraining
from vlbert.models.vl_classification import (VLBertForImagePairClassification, VLBertForSequenceClassification,
                                             VLBertForVisualReasoning)
from vlbert.models.vqa import VLBertForMaskedTokenVQA, VLBertForVQA
from vlbert.inference.base import Pipeline, _as_list, _examples, _is_single
from vlbert.inference.retrieval import ImageIndex, RetrievalPipeline


class VQAPipeline(Pipeline):
    """(image, question) -> the top-k answers with their scores (sigmoid of the answer logit: the models are trained
    with binary cross-entropy on soft VQA scores, as UNITER/LXMERT, so scores do not sum to 1).

    ``vqa(image, "what color is the shape?", top_k=3)`` -> ``[{"answer": "red", "score": 0.97}, ...]``; lists of
    images and questions -> one such list per question.
    """

    tasks = ("vqa",)
    model_class = VLBertForVQA
    model_classes = (VLBertForMaskedTokenVQA,)

    def __call__(self, image, question, top_k: int = 1):
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        images, questions, single = _examples(image, question)
        logits, _ = self.logits(images, questions)
        scores, ids = logits.sigmoid().topk(min(top_k, logits.shape[1]), dim=-1)
        out = [[{"answer": self.labels[i], "score": s} for s, i in zip(row_s, row_i)]
               for row_s, row_i in zip(scores.tolist(), ids.tolist())]
        return out[0] if single else out


class EntailmentPipeline(Pipeline):
    """(image, hypothesis) -> ``{"label": "entailment" | "neutral" | "contradiction", "score", "scores"}`` (softmax
    probabilities of the three SNLI-VE labels); lists -> a list of them."""

    tasks = ("snli-ve",)
    model_class = VLBertForSequenceClassification

    def __call__(self, image, hypothesis):
        images, hypotheses, single = _examples(image, hypothesis)
        logits, _ = self.logits(images, hypotheses)
        out = [_label(row, self.labels) for row in logits.softmax(-1)]
        return out[0] if single else out


def _label(probabilities: torch.Tensor, labels: Sequence[str]) -> dict[str, Any]:
    k = int(probabilities.argmax())
    return {"label": labels[k], "score": float(probabilities[k]),
            "scores": {name: float(p) for name, p in zip(labels, probabilities)}}


class ImagePairPipeline(Pipeline):
    """NLVR2: (left image, right image, statement) -> ``{"label": "True" | "False", "score": its probability,
    "scores"}``; lists -> a list of them. The pair is encoded as the task's collator does (regions [B, 2, R, ...],
    left first)."""

    tasks = ("nlvr2",)
    model_class = VLBertForImagePairClassification
    model_classes = (VLBertForVisualReasoning,)

    @torch.no_grad()
    def __call__(self, left, right, statement):
        single = _is_single(left)
        lefts, rights, texts = _as_list(left, single), _as_list(right, single), _as_list(statement, single)
        if not len(lefts) == len(rights) == len(texts):
            raise ValueError(f"{len(lefts)} left images, {len(rights)} right images and {len(texts)} statements: "
                             "pass one of each per example")
        out = []
        for start in range(0, len(texts), self.batch_size):
            chunk = slice(start, start + self.batch_size)
            regions = self.regions([x for pair in zip(lefts[chunk], rights[chunk]) for x in pair])
            batch = _pair_batch(self.inputs, texts[chunk], regions, self.device)
            out += [_label(row, self.labels) for row in self.model(**batch).logits.float().softmax(-1).cpu()]
        return out[0] if single else out


def _pair_batch(inputs: RunInputs, texts: Sequence[str], regions: list[Regions], device) -> dict[str, torch.Tensor]:
    """Statements + image pairs (``regions`` ordered left, right, left, ...) as :class:`ImagePairCollator` pads
    them: region tensors [B, 2, R, ...]."""
    pairs = {k: v.view(len(texts), 2, *v.shape[1:]) for k, v in inputs.region_batch(regions, device).items()}
    return {**inputs.text_batch(texts, device), **pairs}


class ReferringPipeline(Pipeline):
    """(image, expression) -> ``{"box": [x1, y1, x2, y2] in pixels, "score": the region's softmax probability,
    "region": its index}``: the region the expression refers to, among the image's regions.

    Runs trained on given candidate boxes (``inference.json``: ``"boxes": "given"``, e.g. the easy-VQA composites'
    tiles) need them at inference too: ``boxes=`` float [N, 4] pixel boxes per image. :meth:`draw` returns the
    image with the box drawn.
    """

    tasks = ("refcoco",)
    model_class = VLBertForReferringExpressions

    def __call__(self, image, expression, boxes=None):
        images, expressions, single = _examples(image, expression)
        box_list = None if boxes is None else ([boxes] * len(images) if _is_single(image) else list(boxes))
        if self.inputs.info.get("boxes") == "given" and box_list is None and \
                not all(isinstance(x, Regions) for x in images):
            raise ValueError("this run was trained on given candidate boxes, not the detector's: pass boxes=[[x1, y1, "
                             "x2, y2], ...] (pixels) for each image (tools/predict.py: a \"boxes\" field per line)")
        logits, regions = self.logits(images, expressions, box_list)
        out = []
        for row, r in zip(logits.softmax(-1), regions):
            k = int(row.argmax())
            out.append({"box": [float(v) for v in r.boxes[k]], "score": float(row[k]), "region": k})
        return out[0] if single else out

    @staticmethod
    def draw(image, result: dict, color: str = "red", width: int = 3):
        """A copy of ``image`` (path, PIL image or uint8 array) as a PIL RGB image with ``result["box"]`` drawn."""
        from PIL import Image, ImageDraw

        if isinstance(image, (str, os.PathLike)):
            array = load_image(image)
        else:
            array = to_rgb_array(image)
        picture = Image.fromarray(array)
        ImageDraw.Draw(picture).rectangle(result["box"], outline=color, width=width)
        return picture


class FillMaskPipeline(Pipeline):
    """(image, text with [MASK]) -> per [MASK], the top-k fillers (:func:`vlbert.analysis.fill_mask.fill_mask`'s
    transformers-style dicts) given the image's regions; ``image=None`` reads the text alone."""

    tasks = ("vl-pretraining",)
    model_class = VLBertForPreTraining

    def __call__(self, image, text: str, top_k: int = 5):
        item = None if image is None else self.inputs.region_items(self.regions([image]))[0]
        return fill_mask(self.model, self.tokenizer, text, top_k, item)


#: task name (inference.json's ``task``, a recipe's name) -> its pipeline class.
PIPELINES: dict[str, type[Pipeline]] = {cls.tasks[0]: cls for cls in (
    VQAPipeline, RetrievalPipeline, ImagePairPipeline, EntailmentPipeline, ReferringPipeline, FillMaskPipeline)}


def pipeline(run_dir: str | os.PathLike, **kwargs) -> Pipeline:
    """The pipeline of the run's task (``inference.json``), loaded from ``run_dir``; ``kwargs`` as :class:`Pipeline`.

    Raises:
        FileNotFoundError, ValueError: as :class:`Pipeline`; a task without a pipeline (text-only runs: load the
            model with ``from_pretrained``).
    """
    task = read_inference_info(run_dir)["task"]
    if task not in PIPELINES:
        raise ValueError(f"{run_dir} is a {task!r} run, which has no pipeline; pipelines exist for "
                         f"{', '.join(sorted(PIPELINES))}")
    return PIPELINES[task](run_dir, **kwargs)


__all__ = ["Pipeline", "VQAPipeline", "EntailmentPipeline", "ImagePairPipeline", "ReferringPipeline",
           "FillMaskPipeline", "RetrievalPipeline", "ImageIndex", "PIPELINES", "pipeline"]
