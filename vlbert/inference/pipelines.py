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

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
import torch
from safetensors.torch import load_file

from detectors.images import load_image, to_rgb_array
from detectors.regions import Regions
from detectors.shards import write_shards
from detectors.store import RegionStore
from vlbert.analysis.fill_mask import fill_mask
from vlbert.checkpoint import write_safetensors
from vlbert.evaluation.retrieval import rerank_shortlist
from vlbert.inference.run import ImageInput, RunInputs, read_inference_info
from vlbert.models.referring import VLBertForReferringExpressions
from vlbert.models.retrieval import VLBertForImageTextRetrieval
from vlbert.models.vl import VLBertForPreTraining
from vlbert.models.vl_classification import (VLBertForImagePairClassification, VLBertForSequenceClassification,
                                             VLBertForVisualReasoning)
from vlbert.models.vqa import VLBertForMaskedTokenVQA, VLBertForVQA
from vlbert_base.files import write_text_atomically


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


INDEX_FILE = "index.json"
EMBEDDINGS_FILE = "embeddings.safetensors"


@dataclass
class ImageIndex:
    """A folder of images made searchable: their ids, regions and unit-length shortlist embeddings.

    Attributes:
        image_ids: one name per image (the file's path relative to the folder, or given).
        regions: image id -> :class:`Regions` (a dict, or a :class:`RegionStore` once saved and loaded).
        embeddings: float32 [N, P], :meth:`VLBertForImageTextRetrieval.embed_image` of each image, in order.
    """

    image_ids: list[str]
    regions: Any
    embeddings: torch.Tensor

    def save(self, directory: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write ``regions/*.tar`` shards, ``embeddings.safetensors`` and, last, ``index.json`` (so a directory
        without it is an unfinished index). Raises FileExistsError where ``directory`` holds files, unless
        ``overwrite``."""
        directory = Path(directory).expanduser()
        if directory.exists() and any(directory.iterdir()):
            if not overwrite:
                raise FileExistsError(f"{directory} is not empty: choose a new directory for the index, or pass "
                                      "overwrite=True to replace it")
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        write_shards((self.regions[i] for i in self.image_ids), directory / "regions")
        write_safetensors({"embeddings": self.embeddings}, directory / EMBEDDINGS_FILE)
        write_text_atomically(directory / INDEX_FILE, json.dumps({"format_version": 1, "image_ids": self.image_ids}))
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "ImageIndex":
        """An index written by :meth:`save` (regions read from disk per lookup). Raises FileNotFoundError for a
        directory without ``index.json`` (not an index, or an unfinished one: build it again)."""
        directory = Path(directory).expanduser()
        if not (directory / INDEX_FILE).is_file():
            raise FileNotFoundError(f"{directory / INDEX_FILE} does not exist: {directory} is not a finished image "
                                    "index; build it again with RetrievalPipeline.index_images(...).save(...)")
        ids = json.loads((directory / INDEX_FILE).read_text(encoding="utf-8"))["image_ids"]
        return cls(ids, RegionStore(directory / "regions"), load_file(str(directory / EMBEDDINGS_FILE))["embeddings"])


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


class RetrievalPipeline(Pipeline):
    """Image-text retrieval with the evaluation's two stages (:func:`vlbert.evaluation.retrieval.rerank_shortlist`):
    unit-length embeddings pick a shortlist (``inference.json``'s ``shortlist``), the cross-encoder re-ranks it.

    ``index = retrieval.index_images("photos/")`` (once; ``index.save(dir)``, ``ImageIndex.load(dir)``), then
    ``retrieval.search("a red circle", index, top_k=5)`` -> ``[{"image_id", "score"}, ...]`` and
    ``retrieval.captions(image, ["a red circle", ...], top_k=5)`` -> ``[{"caption", "index", "score"}, ...]``.
    Scores: the cross-encoder's ITM logit margin inside the shortlist; outside it, the embedding similarity - 1e4.
    """

    tasks = ("retrieval",)
    model_class = VLBertForImageTextRetrieval

    @property
    def shortlist(self) -> int:
        return int(self.inputs.info.get("shortlist", 16))

    @torch.no_grad()
    def index_images(self, images: str | os.PathLike | Sequence[ImageInput],
                     image_ids: Sequence[str] | None = None) -> ImageIndex:
        """Regions and embeddings of ``images``: a folder (its image files, recursively, sorted) or a list.

        Raises:
            ValueError: an empty folder or list; ``image_ids`` of another length or with repeats.
        """
        if isinstance(images, (str, os.PathLike)) and Path(images).is_dir():
            folder = Path(images)
            files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
            images, image_ids = files, image_ids or [p.relative_to(folder).as_posix() for p in files]
        images = list(images)
        if not images:
            raise ValueError("no images to index: pass a folder with image files or a non-empty list")
        ids = list(image_ids) if image_ids is not None else [
            x.image_id if isinstance(x, Regions) else str(x) if isinstance(x, (str, os.PathLike)) else f"image-{k}"
            for k, x in enumerate(images)]
        if len(ids) != len(images) or len(set(ids)) != len(ids):
            raise ValueError(f"{len(ids)} image ids ({len(set(ids))} distinct) for {len(images)} images: pass one "
                             "distinct id per image")
        regions, embeddings = {}, []
        for start in range(0, len(images), self.batch_size):
            chunk = self.regions(images[start:start + self.batch_size])
            for image_id, r in zip(ids[start:start + self.batch_size], chunk):
                regions[image_id] = Regions(image_id, r.height, r.width, r.boxes, r.features, r.scores,
                                            r.class_probs, r.detector, r.attribute_probs)
            embeddings.append(self._embed_images(chunk))
        return ImageIndex(ids, regions, torch.cat(embeddings))

    def _embed_images(self, regions: Sequence[Regions]) -> torch.Tensor:
        cls_sep = (self.tokenizer.cls_token_id, self.tokenizer.sep_token_id)
        return self.model.embed_image(**self.inputs.region_batch(regions, self.device), cls_sep=cls_sep).float().cpu()

    @torch.no_grad()
    def _embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        chunks = (texts[s:s + self.batch_size] for s in range(0, len(texts), self.batch_size))
        return torch.cat([self.model.embed_text(**self.inputs.text_batch(chunk, self.device)).float().cpu()
                          for chunk in chunks])

    def _cross_scores(self, regions: Sequence[Regions], texts: Sequence[str]):
        def scores(image_rows: list[int], text_rows: list[int]) -> torch.Tensor:
            batch = self.inputs.batch([texts[i] for i in text_rows], [regions[i] for i in image_rows], self.device)
            return self.model.match_scores(**batch).float().cpu()
        return scores

    @torch.no_grad()
    def search(self, text: str | Sequence[str], index: ImageIndex, top_k: int = 5):
        """text -> the ``top_k`` images of ``index``, best first: ``[{"image_id", "score"}]`` (a list of them for a
        list of texts)."""
        single = isinstance(text, str)
        texts = _as_list(text, single)
        scores = self._embed_texts(texts) @ index.embeddings.T  # [texts, images]
        lazy = _LazyRegions(index)
        final, _ = rerank_shortlist(scores, self.shortlist, lambda q, n: (n, q), self._cross_scores(lazy, texts),
                                    self.batch_size)
        out = [_top(row, top_k, lambda n, s: {"image_id": index.image_ids[n], "score": s}) for row in final]
        return out[0] if single else out

    @torch.no_grad()
    def captions(self, image, captions: Sequence[str], top_k: int = 5):
        """image -> the ``top_k`` of ``captions``, best first: ``[{"caption", "index", "score"}]`` (a list of them
        for a list of images)."""
        single = _is_single(image)
        regions = self.regions(_as_list(image, single))
        captions = list(captions)
        scores = torch.cat([self._embed_images(regions[s:s + self.batch_size])
                            for s in range(0, len(regions), self.batch_size)]) @ self._embed_texts(captions).T
        final, _ = rerank_shortlist(scores, self.shortlist, lambda q, n: (q, n),
                                    self._cross_scores(regions, captions), self.batch_size)
        out = [_top(row, top_k, lambda n, s: {"caption": captions[n], "index": n, "score": s}) for row in final]
        return out[0] if single else out


class _LazyRegions:
    """index row -> Regions, read from the index's store on demand (only the shortlist's images are read)."""

    def __init__(self, index: ImageIndex):
        self.index = index

    def __getitem__(self, row: int) -> Regions:
        return self.index.regions[self.index.image_ids[row]]


def _top(row: torch.Tensor, k: int, make) -> list[dict]:
    scores, ids = row.topk(min(k, row.shape[0]))
    return [make(n, s) for n, s in zip(ids.tolist(), scores.tolist())]


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
