"""One object per task that answers about raw images (or texts) with a trained run: ``pipeline(run_dir)(image,
text)``.

The shape is transformers' ``pipeline(...)``: built from a directory, called on images and text, batching
internally, returning plain dicts; each task is a :class:`~vlbert.inference.base.Pipeline` that declares its
inputs and implements ``postprocess`` (and ``preprocess`` / ``_forward`` where it reads more than one image and
one text). A region-based model also needs the detector that made its training regions: each pipeline rebuilds it
from the run's saved processor and refuses another one (:class:`vlbert.processing.VLProcessor`). Inputs are prepared exactly
as the task's dataset prepares them (same tokenizer, truncation, ``region_item`` and padding), so on the same
regions a pipeline gives the recipe's evaluation outputs (tests/inference/test_inference.py checks every task).

Images: a file path, a PIL image, a uint8 array [H, W, 3] (RGB) or the image's :class:`~vlbert.detectors.regions.Regions`.
A new task's pipeline is a Pipeline subclass and one line in :data:`PIPELINES`, named by its task's entry in
:data:`vlbert.recipes.TASKS` (docs/extending.md).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from vlbert.detectors.images import read_pil_image
from vlbert.detectors.regions import Regions
from vlbert.evaluation.vqa import gqa_predictions_json, vqa_results_json
from vlbert.inference.base import Pipeline, label_result, label_row
from vlbert.inference.fill_mask import FillMaskPipeline, TextFillMaskPipeline
from vlbert.inference.matching import ImageTextMatchingPipeline
from vlbert.inference.retrieval import RetrievalPipeline
from vlbert.inference.text import TextClassificationPipeline
from vlbert.models.referring import VLBertForReferringExpressions
from vlbert.models.uniter_heads import VLBertForNLVR2Paired, VLBertForNLVR2PairedAttention, VLBertForVisualEntailment
from vlbert.models.vl_classification import (
    VLBertForImagePairClassification,
    VLBertForSequenceClassification,
    VLBertForVisualReasoning,
)
from vlbert.models.vqa import VLBertForMaskedTokenVQA, VLBertForVQA
from vlbert.processing import load_processor_record, record_pipeline


def _require_ids(rows: list[dict], key: str, fmt: str) -> None:
    """Raise ValueError naming the first row (1-based) without ``key``, which format ``fmt`` needs on every row."""
    missing = [k for k, r in enumerate(rows, 1) if key not in r]
    if missing:
        raise ValueError(f"--format {fmt} needs a {key} on every example; example {missing[0]} has none")


def _vqa_v2_results(rows: list[dict]) -> str:
    """The VQA v2 evaluation server's results JSON: ``[{"question_id", "answer"}]`` (VQA.loadRes;
    :func:`~vlbert.evaluation.vqa.vqa_results_json`, the file the VQA recipe writes)."""
    _require_ids(rows, "question_id", "vqa-v2")
    return vqa_results_json(rows)


def _gqa_results(rows: list[dict]) -> str:
    """The GQA challenge's submission JSON: ``[{"questionId": str, "prediction": str}]``
    (:func:`~vlbert.evaluation.vqa.gqa_predictions_json`, the file the VQA recipe writes for GQA)."""
    _require_ids(rows, "question_id", "gqa")
    return gqa_predictions_json(rows)


class VQAPipeline(Pipeline):
    """(image, question) -> the top-k answers with their scores (sigmoid of the answer logit: the models are trained
    with binary cross-entropy on soft VQA scores, as UNITER/LXMERT, so scores do not sum to 1).

    ``vqa(image, "what color is the shape?", top_k=3)`` -> ``[{"answer": "red", "score": 0.97}, ...]``; lists of
    images and questions -> one such list per question.
    """

    name = "visual-question-answering"
    model_class = VLBertForVQA
    model_classes = (VLBertForMaskedTokenVQA,)
    input_fields = {"image": ("image",), "text": ("text", "question")}
    id_field = "question_id"
    parameters = {"top_k": 1}
    formats = {"vqa-v2": _vqa_v2_results, "gqa": _gqa_results}

    def postprocess(self, outputs, examples, top_k: int = 1) -> list[list[dict]]:
        logits = outputs["logits"]
        scores, ids = logits.sigmoid().topk(min(top_k, logits.shape[1]), dim=-1)
        names = self.label_names(logits.shape[1])
        return [
            [{"answer": names[i], "score": s} for s, i in zip(row_s, row_i, strict=True)]
            for row_s, row_i in zip(scores.tolist(), ids.tolist(), strict=True)
        ]

    def row(self, result: list[dict]) -> dict:
        return {"answer": result[0]["answer"], "score": result[0]["score"], "answers": result}


class EntailmentPipeline(Pipeline):
    """(image, hypothesis) -> ``{"label": "entailment" | "neutral" | "contradiction", "score", "scores"}`` (softmax
    probabilities of the three SNLI-VE labels); lists -> a list of them. SNLI-VE defines no results format: jsonl
    rows carry the ``pairID`` and ``prediction``."""

    name = "visual-entailment"
    model_class = VLBertForSequenceClassification
    model_classes = (VLBertForVisualEntailment,)
    input_fields = {"image": ("image",), "text": ("text", "hypothesis", "sentence2")}
    id_field = "pairID"

    def postprocess(self, outputs, examples) -> list[dict]:
        logits = outputs["logits"]
        return [label_result(row, self.label_names(logits.shape[1])) for row in logits.softmax(-1)]

    row = staticmethod(label_row)


def _nlvr2_results(rows: list[dict]) -> str:
    """The NLVR2 evaluation script's CSV: ``identifier,True|False`` per line (lil-lab/nlvr ``nlvr2/eval``)."""
    _require_ids(rows, "identifier", "nlvr2")
    return "".join(f"{r['identifier']},{r['prediction']}\n" for r in rows)


class ImagePairPipeline(Pipeline):
    """NLVR2: (left image, right image, statement) -> ``{"label": "True" | "False", "score": its probability,
    "scores"}``; lists -> a list of them. The pair is encoded as the task's collator does (regions [B, 2, R, ...],
    left first)."""

    name = "visual-reasoning"
    model_class = VLBertForImagePairClassification
    model_classes = (VLBertForVisualReasoning, VLBertForNLVR2Paired, VLBertForNLVR2PairedAttention)
    input_fields = {"left": ("left", "image"), "right": ("right", "image2"), "text": ("text", "sentence", "statement")}
    image_fields = ("left", "right")
    id_field = "identifier"
    formats = {"nlvr2": _nlvr2_results}

    def preprocess(self, examples, **parameters) -> dict[str, Any]:
        regions = self.regions([ex[side] for ex in examples for side in ("left", "right")])
        pairs = {
            k: v.view(len(examples), 2, *v.shape[1:])
            for k, v in self.processor.region_batch(regions, self.device).items()
        }
        return {"batch": {**self.processor.text_batch([ex["text"] for ex in examples], self.device), **pairs}}

    def postprocess(self, outputs, examples) -> list[dict]:
        logits = outputs["logits"]
        return [label_result(row, self.label_names(logits.shape[1])) for row in logits.softmax(-1)]

    row = staticmethod(label_row)


class ReferringPipeline(Pipeline):
    """(image, expression) -> ``{"box": [x1, y1, x2, y2] in pixels, "score": the region's softmax probability,
    "region": its index}``: the region the expression refers to, among the image's regions.

    Runs trained on given candidate boxes (its processor record: ``"boxes": "given"``, e.g. the easy-VQA composites'
    tiles) need them at inference too: ``boxes=`` float [N, 4] pixel boxes per image (a list of them for a list of
    images; a JSONL record's ``boxes`` field). :meth:`draw` returns the image with the box drawn; vlbert predict's
    ``--draw FILE`` saves it.
    """

    name = "referring-expression-comprehension"
    model_class = VLBertForReferringExpressions
    input_fields = {"image": ("image",), "text": ("text", "expression"), "boxes": ("boxes",)}
    optional_fields = ("boxes",)
    id_field = "ref_id"
    tool_options = ("draw",)

    def __call__(self, image, expression, boxes=None):
        examples, single = self.examples(image, expression, boxes)
        results = self.run(examples)
        return results[0] if single else results

    def examples(self, image, expression, boxes=None) -> tuple[list[dict], bool]:
        """As :meth:`Pipeline.examples`; ``boxes`` go with the image (one image's boxes for a single image)."""
        examples, single = super().examples(image, expression)
        if boxes is not None:
            per_image = [boxes] * len(examples) if self._single("image", image) else list(boxes)
            if len(per_image) != len(examples):
                raise ValueError(f"{len(per_image)} boxes lists for {len(examples)} images: pass one per image")
            for example, given in zip(examples, per_image, strict=True):
                example["boxes"] = given
        return examples, single

    def preprocess(self, examples, **parameters) -> dict[str, Any]:
        if self.processor.info.get("boxes") == "given" and any(
            ex["boxes"] is None and not isinstance(ex["image"], Regions) for ex in examples
        ):
            raise ValueError(
                "this run was trained on given candidate boxes, not the detector's: pass boxes=[[x1, y1, "
                'x2, y2], ...] (pixels) for each image (vlbert predict: a "boxes" field per line)'
            )
        return super().preprocess(examples, **parameters)

    def postprocess(self, outputs, examples) -> list[dict]:
        out = []
        for row, r in zip(outputs["logits"].softmax(-1), outputs["regions"], strict=True):
            k = int(row.argmax())
            out.append({"box": [float(v) for v in r.boxes[k]], "score": float(row[k]), "region": k})
        return out

    def predict_records(self, records: list[dict], draw: str | None = None, **options) -> list[dict]:
        """As :meth:`Pipeline.predict_records`; ``draw``: save the one record's image with its box to this file.

        Raises:
            ValueError: ``draw`` with more than one record.
        """
        if draw and len(records) != 1:
            raise ValueError("--draw takes one example (--image/--text); leave it out with --input")
        rows = super().predict_records(records, **options)
        if draw:
            self.draw(records[0]["image"], rows[0]).save(draw)
        return rows

    @staticmethod
    def draw(image, result: dict, color: str = "red", width: int = 3):
        """A copy of ``image`` (path, PIL image or uint8 array) as a PIL RGB image with ``result["box"]`` drawn."""
        from PIL import ImageDraw

        picture = read_pil_image(image)  # as the regions were found on it (EXIF orientation applied)
        ImageDraw.Draw(picture).rectangle(result["box"], outline=color, width=width)
        return picture


#: pipeline name -> its class, named by what it does as transformers names its pipelines (``fill-mask``,
#: ``visual-question-answering``, ``text-classification``). A task's entry in the task table names its pipeline
#: class (:attr:`vlbert.recipes.Task.pipeline`, which must be here), and the run's saved processor records the
#: class's name (a record on disk with an earlier name is read with today's:
#: :func:`vlbert.run_files.read_processor_record`). The catalogue that ``vlbert.inference`` reads a run with, without
#: the recipes: a new pipeline is a :class:`Pipeline` subclass and one line here.
PIPELINES: dict[str, type[Pipeline]] = {
    cls.name: cls
    for cls in (
        VQAPipeline,
        RetrievalPipeline,
        ImagePairPipeline,
        EntailmentPipeline,
        ReferringPipeline,
        FillMaskPipeline,
        TextClassificationPipeline,
        TextFillMaskPipeline,
        ImageTextMatchingPipeline,
    )
}


def _known() -> str:
    return ", ".join(sorted(PIPELINES))


def _named(task: str) -> type[Pipeline]:
    """``PIPELINES[task]``; raises ValueError naming the pipelines that exist."""
    if task not in PIPELINES:
        raise ValueError(f"no pipeline for task {task!r}; pipelines exist for {_known()}")
    return PIPELINES[task]


def pipeline_class(run_dir: str | os.PathLike, task: str | None = None) -> type[Pipeline]:
    """The pipeline class of ``task`` (a key of :data:`PIPELINES`), by default the one the run names
    (its saved processor: :func:`~vlbert.processing.record_pipeline`), without loading the model.

    Raises:
        FileNotFoundError, ValueError: as :func:`~vlbert.processing.load_processor_record`; a run whose task has
            no pipeline (the pipelines named); a ``task`` whose pipeline does not take the run's kind (the kinds it
            takes named).
    """
    info = load_processor_record(run_dir)
    run_task, own = info["task"], record_pipeline(info)
    if task is None:
        if own not in PIPELINES:
            raise ValueError(f"{run_dir} is a {run_task!r} run, which has no pipeline; pipelines exist for {_known()}")
        return PIPELINES[own]
    cls = _named(task)
    if not cls.takes(info):
        raise ValueError(
            f"{run_dir} is a {run_task!r} run, but {task} takes {cls.accepted_runs()}; leave the task out to use "
            f"the run's own ({own})"
        )
    return cls


def _class_for_model(model: torch.nn.Module, task: str | None) -> type[Pipeline]:
    """The pipeline of ``task``, or of the model's class when ``task`` is None (the one pipeline that runs it).

    Raises:
        ValueError: an unknown ``task``; no pipeline, or several, for the model's class (those named).
    """
    if task is not None:
        return _named(task)
    fits = [cls for cls in PIPELINES.values() if type(model) in (cls.model_class, *cls.model_classes)]
    if len(fits) != 1:
        raise ValueError(
            f"{len(fits) or 'no'} pipelines run a {type(model).__name__}"
            f"{' (' + ', '.join(c.name for c in fits) + ')' if fits else ''}: name the task, "
            f"pipeline(task, model=model, tokenizer=tokenizer); pipelines exist for {_known()}"
        )
    return fits[0]


def pipeline(
    task: str | None = None,
    model: str | os.PathLike | torch.nn.Module | None = None,
    tokenizer=None,
    detector=None,
    **kwargs,
) -> Pipeline:
    """The pipeline of ``task`` over ``model``, transformers' ``pipeline(task, model=..., tokenizer=...)``.

    ``model`` is a run directory or hub id (its task's pipeline by default, from its saved processor; ``task``
    ``"image-text-matching"`` scores (image, caption) pairs with a VL pretraining or retrieval run), or a model in
    memory (then ``tokenizer`` is required; ``detector`` is the :class:`~vlbert.detectors.config.DetectorConfig` its
    regions came from, else the pipeline takes :class:`~vlbert.detectors.regions.Regions` only; by default the one pipeline
    that runs the model's class). As a shorthand, a first argument that names no pipeline is the model:
    ``pipeline("runs/vqa")``. ``kwargs`` as :class:`Pipeline` (device, batch_size, labels, ...).

    Raises:
        TypeError: no model given.
        FileNotFoundError, ValueError: as :class:`Pipeline` and :func:`pipeline_class`; a model in memory that no
            pipeline (or more than one) runs, without ``task``.
    """
    if model is None and task is not None and task not in PIPELINES:
        task, model = None, task
    if model is None:
        raise TypeError(
            "pipeline() needs a model: a run directory, a hub id or a model in memory "
            '(pipeline("runs/vqa") or pipeline(task, model=model, tokenizer=tokenizer))'
        )
    if isinstance(model, torch.nn.Module):
        return _class_for_model(model, task)(model, tokenizer=tokenizer, detector=detector, **kwargs)
    if tokenizer is not None:
        raise ValueError("a run directory holds its own tokenizer: leave tokenizer out (it is for a model in memory)")
    return pipeline_class(model, task)(model, detector=detector, **kwargs)


__all__ = [
    "VQAPipeline",
    "EntailmentPipeline",
    "ImagePairPipeline",
    "ReferringPipeline",
    "PIPELINES",
    "pipeline",
    "pipeline_class",
]
