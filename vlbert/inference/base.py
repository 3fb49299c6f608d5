"""The base of the inference pipelines: a run's model and processor (tokenizer, detector, limits); how a call's images and texts pair
up (one image broadcast over several texts, as transformers' VQA pipeline does); batching."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch

from vlbert.common.user_files import read_json
from vlbert.detectors.regions import Regions
from vlbert.models.vqa import VLBertForVQA
from vlbert.processing import ImageInput, VLProcessor, record_pipeline
from vlbert.processing.detection import Detection


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _as_list(value, single: bool) -> list:
    return [value] if single else list(value)


def _is_single(image) -> bool:
    """Whether ``image`` is one image (not a list of them)."""
    return isinstance(image, (str, os.PathLike, Regions, np.ndarray)) or hasattr(image, "mode")


class Pipeline:
    """Base class: a run's model (eval mode, on ``device``) and :class:`~vlbert.processing.VLProcessor`, and the
    call every task shares, in transformers' pipeline shape: ``pipe(*inputs, **parameters)`` turns the inputs into
    examples (one per row; one image, or one text, broadcast over a list of the other, as transformers' VQA
    pipeline does), cuts them into ``batch_size`` chunks and runs :meth:`preprocess` -> :meth:`_forward` (no
    gradients; bf16 autocast on a CUDA device, the outputs read back in float32) -> :meth:`postprocess` on each;
    one input of each kind gives one result, lists give a list.

    A task sets :attr:`name` (its :data:`~vlbert.inference.pipelines.PIPELINES` key, which a run's processor
    records; :attr:`run_tasks` where it answers runs of other tasks too), :attr:`model_class`,
    :attr:`input_fields` (its inputs in call order, each with the names a JSONL record may give it under),
    :attr:`image_fields`, :attr:`optional_fields`, :attr:`id_field`,
    :attr:`parameters` and :attr:`formats`, and implements :meth:`postprocess` (and :meth:`preprocess` /
    :meth:`_forward` where the default, one image and one text per example through the model's logits, does not
    fit). ``vlbert predict`` reads only these: it knows no task by name.

    Args:
        model: a run's output directory (``config.json``, ``model.safetensors``, tokenizer, ``processor.json``) or a
            hub id, or a model in memory (an instance of :attr:`model_class` or :attr:`model_classes`; then
            ``tokenizer`` is required, and ``detector`` is the detector its regions came from; a model with a
            ``visual_backbone`` reads each image's pixels through its backbone kind's preprocessing,
            :data:`vlbert.processing.images.DEFAULT_PREPROCESSING`: a run directory records its own).
        device: "cpu", "cuda", ... (default: CUDA when available; a model in memory stays where it is unless
            ``device`` is given).
        detector: a :class:`~vlbert.detectors.config.DetectorConfig` to extract with instead of the run's own (refused
            unless it has the run's fingerprint or ``allow_other_detector``); for a model in memory, its own (None:
            the pipeline takes :class:`~vlbert.detectors.regions.Regions` only).
        allow_other_detector: accept another detector's regions, at the cost of silently worse predictions.
        batch_size: examples per forward pass (and images per detector call).
        detector_weights: the run's detector's weights file where you keep it (a converted UNITER's
            ``faster_rcnn_from_caffe_attr.pkl``), checked against the recorded sha256 (else its file name).
        tokenizer: a model in memory's tokenizer (a run directory's is read from it).
        labels: a model in memory's label names, in logit order (default: its ``config.id2label``).
        max_text_length, max_regions: a model in memory's limits (default: the tokenizer's ``model_max_length``
            within the model's positions; 36 regions, the BUTD features' count).
    Raises:
        FileNotFoundError: ``model`` is a path without a saved processor or without a model.
        ValueError: the run is of another task than the pipeline's, or another detector (both named); a model in
            memory of another class than the pipeline's, or without a tokenizer.
    """

    #: the pipeline's name: its key in :data:`~vlbert.inference.pipelines.PIPELINES`, what the runs of a task whose
    #: entry in the task table names this class (:attr:`vlbert.recipes.Task.pipeline`) record in their processor.
    name: ClassVar[str] = ""
    #: the run tasks (the processor record's ``task``) the pipeline loads besides those whose entry names it (a task
    #: that every run of some kinds answers, e.g. image-text matching from pretraining and retrieval runs).
    run_tasks: ClassVar[tuple[str, ...]] = ()
    model_class: ClassVar[type] = VLBertForVQA
    #: other model classes a run of the task may hold (config.json's ``architectures`` decides).
    model_classes: ClassVar[tuple[type, ...]] = ()
    #: the call's inputs in order: name -> the names a JSONL record may give it under (vlbert predict).
    input_fields: ClassVar[dict[str, tuple[str, ...]]] = {"image": ("image",), "text": ("text",)}
    #: inputs that are images (file paths in records are read relative to the record's file).
    image_fields: ClassVar[tuple[str, ...]] = ("image",)
    #: inputs an example may leave out (None).
    optional_fields: ClassVar[tuple[str, ...]] = ()
    #: the record field that identifies an example in the task's benchmark (written with its prediction).
    id_field: ClassVar[str] = "id"
    #: call parameters and their defaults (e.g. ``{"top_k": 1}``).
    parameters: ClassVar[dict[str, Any]] = {}
    #: output formats besides ``jsonl``: name -> (rows -> the file's text), each row ``{id_field, ...,
    #: prediction fields}``; raises ValueError for a row the format cannot write.
    formats: ClassVar[dict[str, Callable[[list[dict]], str]]] = {}
    #: vlbert predict flags besides the parameters that this task reads in :meth:`predict_records` (e.g. ``draw``).
    tool_options: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module,
        device: str | None = None,
        detector=None,
        allow_other_detector: bool = False,
        batch_size: int = 16,
        detector_weights=None,
        tokenizer=None,
        labels: Sequence[str] | None = None,
        max_text_length: int | None = None,
        max_regions: int | None = None,
    ):
        self.batch_size = batch_size
        if isinstance(model, torch.nn.Module):
            self._from_model(model, device, detector, tokenizer, labels, max_text_length, max_regions)
            return
        self.device = torch.device(device or _default_device())
        self.processor = VLProcessor.from_pretrained(model)
        self.processor.use_detector(detector, allow_other_detector, detector_weights, str(self.device))
        if not self.takes(self.processor.info):
            raise ValueError(
                f"{model} is a {self.processor.task!r} run; {type(self).__name__} takes "
                f"{self.accepted_runs()}: use vlbert.inference.pipeline({str(model)!r}), which picks the run's own"
            )
        self.processor.max_text_length = max_text_length or self.processor.max_text_length
        self.processor.max_regions = max_regions or self.processor.max_regions
        self.run_dir = self.processor.name_or_path
        self.model = self.architecture().from_pretrained(self.run_dir).to(self.device).eval()
        self.labels: list[str] | None = labels or self.processor.labels

    def _from_model(self, model, device, detector, tokenizer, labels, max_text_length, max_regions) -> None:
        """Set up over a model in memory (see the class docstring)."""
        classes = (self.model_class, *self.model_classes)
        if not isinstance(model, classes):
            raise ValueError(
                f"{type(self).__name__} runs {' or '.join(c.__name__ for c in classes)}, not "
                f"{type(model).__name__}: pass the task that fits the model (vlbert.inference.PIPELINES)"
            )
        if tokenizer is None:
            raise ValueError("a model in memory needs its tokenizer: pipeline(model=model, tokenizer=tokenizer)")
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.processor = VLProcessor.for_model(
            model.config, tokenizer, self.name, labels, max_text_length, max_regions, detector
        )
        self.processor.detection = Detection(detector, str(self.device))
        self.run_dir = None
        self.model = model.to(self.device).eval()
        self.labels = self.processor.labels

    @classmethod
    def takes(cls, record: dict[str, Any]) -> bool:
        """Whether this pipeline loads the run of processor ``record``: the record names it as its pipeline
        (:func:`~vlbert.processing.record_pipeline`), or the run's ``task`` is one of :attr:`run_tasks`."""
        return record_pipeline(record) == cls.name or record.get("task") in cls.run_tasks

    @classmethod
    def accepted_runs(cls) -> str:
        """The runs :meth:`takes` accepts, in words for messages: ``"vl-pretraining or retrieval runs"`` (its
        :attr:`run_tasks`), else ``"runs whose pipeline is visual-question-answering"``."""
        if cls.run_tasks:
            return f"{' or '.join(cls.run_tasks)} runs"
        return f"runs whose pipeline is {cls.name}"

    def architecture(self) -> type:
        """The model class to load: the one config.json names when it is among :attr:`model_classes` (a converted
        VisualBERT's VQA or NLVR2 head), else :attr:`model_class`."""
        path = self.run_dir / "config.json"
        saved = (read_json(path, "model config").get("architectures") or []) if path.is_file() else []
        return next((c for c in self.model_classes if c.__name__ in saved), self.model_class)

    def label_names(self, count: int) -> list[str]:
        """The names of the ``count`` logits: the run's (or given) labels, else their indices as strings."""
        return list(self.labels) if self.labels else [str(k) for k in range(count)]

    @property
    def tokenizer(self):
        """The processor's tokenizer."""
        return self.processor.tokenizer

    def regions(self, images: Sequence[ImageInput], boxes=None) -> list[Regions]:
        """Each image's regions (extracted with the run's detector, or checked): :meth:`VLProcessor.regions`."""
        return self.processor.regions(images, boxes, self.batch_size)

    def __call__(self, *inputs, **parameters):
        """Results for ``inputs`` (in :attr:`input_fields` order): one result for single inputs, else a list.

        Raises:
            TypeError: more inputs than the task has, or a parameter it does not take (the known ones named).
            ValueError: lists of different lengths; a bad parameter value; errors of the detector and model.
        """
        examples, single = self.examples(*inputs)
        results = self.run(examples, **parameters)
        return results[0] if single else results

    def examples(self, *inputs) -> tuple[list[dict], bool]:
        """(one dict per example keyed by :attr:`input_fields`, whether every input was single): lists pair up
        by position; a single input goes with every element of the others.

        Raises:
            TypeError: more inputs than :attr:`input_fields`.
            ValueError: lists of different lengths.
        """
        names = list(self.input_fields)
        if len(inputs) > len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
        values = dict(zip(names, inputs, strict=False))  # fewer inputs than fields: the last fields not given
        single = {k: self._single(k, v) for k, v in values.items()}
        lengths = {len(v) for k, v in values.items() if not single[k]}
        if len(lengths) > 1:
            raise ValueError(
                f"{' and '.join(f'{len(v)} {k}s' for k, v in values.items() if not single[k])}: pass "
                "one of each per example, or one for all"
            )
        n = lengths.pop() if lengths else 1
        examples = [{k: (v if single[k] else v[i]) for k, v in values.items()} for i in range(n)]
        return [{k: ex.get(k) for k in names} for ex in examples], all(single.values())

    def _single(self, name: str, value) -> bool:
        if value is None or isinstance(value, str):
            return True
        return _is_single(value) if name in self.image_fields else False

    def run(self, examples: list[dict], **parameters) -> list:
        """The result of every example (dicts keyed by :attr:`input_fields`), ``batch_size`` at a time.

        Raises:
            TypeError: a parameter the task does not take.
        """
        unknown = sorted(set(parameters) - set(self.parameters))
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unknown parameter(s) {unknown}; it takes "
                f"{sorted(self.parameters) or 'none'}"
            )
        params = {**self.parameters, **parameters}
        self.check_parameters(**params)
        out: list = []
        for start in range(0, len(examples), self.batch_size):
            chunk = examples[start : start + self.batch_size]
            model_inputs = self.preprocess(chunk, **params)
            with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=self.device.type == "cuda"):
                outputs = self._forward(model_inputs)
            out += self.postprocess(outputs, chunk, **params)
        return out

    def check_parameters(self, **parameters) -> None:
        """Raise ValueError for a bad parameter value (``top_k`` below 1)."""
        if "top_k" in parameters and parameters["top_k"] < 1:
            raise ValueError(f"top_k must be at least 1, got {parameters['top_k']}")

    def preprocess(self, examples: list[dict], **parameters) -> dict[str, Any]:
        """Model inputs of a chunk: ``{"batch": text + regions on the device (as the task's dataset pads them),
        "regions": each example's Regions}``; examples with ``image`` and ``text`` (and ``boxes``, where given)."""
        boxes = [ex.get("boxes") for ex in examples]
        regions = self.regions([ex["image"] for ex in examples], boxes if any(b is not None for b in boxes) else None)
        suffix = getattr(self.model, "question_suffix", "")  # VisualBERT's VQA reads a [MASK] at the end
        return {
            "batch": self.processor(text=[ex["text"] + suffix for ex in examples], regions=regions, device=self.device),
            "regions": regions,
        }

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, Any]:
        """The model on ``model_inputs["batch"]``: adds ``logits`` (float32, CPU)."""
        return {**model_inputs, "logits": self.model(**model_inputs["batch"]).logits.float().cpu()}

    def postprocess(self, outputs: dict[str, Any], examples: list[dict], **parameters) -> list:
        """One result per example of the chunk, from :meth:`_forward`'s outputs."""
        raise NotImplementedError

    def predict_records(self, records: list[dict], **options) -> list[dict]:
        """vlbert predict's call: one prediction dict per record (records keyed by :attr:`input_fields`), each
        made flat for a JSONL row by :meth:`row`; ``options`` are the tool's flags (``top_k``, ...), of which the
        task's :attr:`parameters` are passed on (and the :attr:`tool_options` a task reads itself)."""
        params = {k: v for k, v in options.items() if k in self.parameters}
        return [self.row(r) for r in self.run(records, **params)]

    def row(self, result) -> dict:
        """A result as the fields of an output row (default: the result dict itself)."""
        return result

    @classmethod
    def read_record(cls, record: dict, where: str, base: str | os.PathLike = ".") -> dict:
        """A JSONL record (or the command line's fields) as an example: each input under its name in
        :attr:`input_fields` (the first alias present), image paths resolved against ``base``, the id kept.

        Raises:
            ValueError: a required input missing (named, with the flag that gives it, and ``where``).
        """
        example = {
            name: next((record[a] for a in aliases if record.get(a) is not None), None)
            for name, aliases in cls.input_fields.items()
        }
        missing = [n for n, v in example.items() if v is None and n not in cls.optional_fields]
        if missing:
            task = cls.name or cls.__name__
            raise ValueError(
                f"{where}: a {task} example needs {', '.join(missing)} (flags: "
                f"{', '.join(_flag(cls, m) for m in missing)})"
            )
        for name in cls.image_fields:
            if isinstance(example.get(name), str):
                path = Path(example[name]).expanduser()
                example[name] = str(path if path.is_absolute() else Path(base) / path)
        for key in (cls.id_field, "id"):
            if key in record:
                example.setdefault(key, record[key])
        return example


def _flag(cls, name: str) -> str:
    """The predict tool's flag of an input: --text, --image, --image2 for the second image input."""
    if name in cls.image_fields:
        return "--image" if cls.image_fields.index(name) == 0 else "--image2"
    return "--text" if name == "text" else f'a "{name}" field'


def read_captions(path: str) -> list[str]:
    """The non-empty lines of a text file of candidate captions (vlbert predict's ``--captions``), stripped.

    Raises:
        FileNotFoundError: no such file. ValueError: a file without captions.
    """
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path} holds no captions")
    return lines


def label_result(probabilities: torch.Tensor, labels: Sequence[str]) -> dict[str, Any]:
    """``{"label", "score", "scores"}`` of one example's class probabilities float [C]."""
    k = int(probabilities.argmax())
    return {
        "label": labels[k],
        "score": float(probabilities[k]),
        "scores": {name: float(p) for name, p in zip(labels, probabilities, strict=True)},
    }


def label_row(result: dict) -> dict:
    """A classification result as an output row: ``prediction``, ``score``, ``scores``."""
    return {"prediction": result["label"], "score": result["score"], "scores": result["scores"]}


__all__ = ["Pipeline", "label_result", "label_row", "read_captions"]
