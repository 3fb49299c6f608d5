"""Image-text retrieval from raw images: an :class:`ImageIndex` of a gallery's regions and embeddings, written
once, and the :class:`RetrievalPipeline` that ranks it for a text (or texts for an image), reranked by ITM."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file

from vlbert.checkpoint import write_safetensors
from vlbert.common.files import write_text_atomically
from vlbert.common.user_files import expect, read_json
from vlbert.detectors.images import is_image_file
from vlbert.detectors.regions import Regions
from vlbert.detectors.shards import write_shards
from vlbert.detectors.store import RegionStore
from vlbert.evaluation.retrieval import rerank_shortlist
from vlbert.inference.base import Pipeline, _as_list, _is_single, read_captions
from vlbert.models.retrieval import VLBertForImageTextRetrieval
from vlbert.processing import ImageInput

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
                raise FileExistsError(
                    f"{directory} is not empty: choose a new directory for the index, or pass "
                    "overwrite=True to replace it"
                )
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
            raise FileNotFoundError(
                f"{directory / INDEX_FILE} does not exist: {directory} is not a finished image "
                "index; build it again with RetrievalPipeline.index_images(...).save(...)"
            )
        fix = "build the index again with RetrievalPipeline.index_images(...).save(...)"
        index = expect(
            read_json(directory / INDEX_FILE, "image index", fix), dict, str(directory / INDEX_FILE), "the index", fix
        )
        ids = expect(index.get("image_ids"), list, str(directory / INDEX_FILE), "image_ids", fix)
        return cls(ids, RegionStore(directory / "regions"), load_file(str(directory / EMBEDDINGS_FILE))["embeddings"])


class RetrievalPipeline(Pipeline):
    """Image-text retrieval with the evaluation's two stages (:func:`vlbert.evaluation.retrieval.rerank_shortlist`):
    unit-length embeddings pick a shortlist (the processor record's ``shortlist``), the cross-encoder re-ranks it.

    ``index = retrieval.index_images("photos/")`` (once; ``index.save(dir)``, ``ImageIndex.load(dir)``), then
    ``retrieval.search("a red circle", index, top_k=5)`` -> ``[{"image_id", "score"}, ...]`` and
    ``retrieval.captions(image, ["a red circle", ...], top_k=5)`` -> ``[{"caption", "index", "score"}, ...]``.
    Scores: the cross-encoder's ITM logit margin inside the shortlist; outside it, below the shortlist's lowest in
    embedding-similarity order (:func:`~vlbert.evaluation.retrieval.rerank_shortlist`).
    """

    name = "image-text-retrieval"
    model_class = VLBertForImageTextRetrieval
    input_fields = {"image": ("image",), "text": ("text", "query", "caption")}
    optional_fields = ("image", "text")
    parameters = {"top_k": 5}
    tool_options = ("images", "index", "captions")

    def __call__(self, *inputs, **parameters):
        """Refused: retrieval ranks a gallery. Raises TypeError naming :meth:`search` and :meth:`captions`."""
        raise TypeError(
            "RetrievalPipeline ranks a gallery: use .search(text, index, top_k=5) for text -> images "
            "or .captions(image, captions, top_k=5) for image -> text"
        )

    def predict_records(
        self,
        records: list[dict],
        top_k: int = 5,
        images: str | None = None,
        index: str | None = None,
        captions: str | None = None,
        **options,
    ) -> list[dict]:
        """vlbert predict's call: a record with ``text`` (and no image) -> ``{"images": [...]}`` from the index
        (``index``: a saved index directory, else built from the ``images`` folder and saved there when
        ``index`` is given); a record with ``image`` -> ``{"captions": [...]}`` ranked among the lines of the
        ``captions`` file.

        Raises:
            ValueError: a record with neither; text -> images without ``images`` or ``index``; image -> text
                without ``captions``, or a captions file without captions.
        """
        built: dict[str, ImageIndex] = {}
        rows = []
        for record in records:
            if record.get("image") is None and record.get("text") is None:
                raise ValueError("a retrieval example needs image or text (flags: --image or --text)")
            if record.get("image") is None:
                rows.append({"images": self.search(record["text"], self._index(images, index, built), top_k)})
                continue
            if not captions:
                raise ValueError("image -> text needs --captions FILE (candidate captions, one per line)")
            rows.append({"captions": self.captions(record["image"], read_captions(captions), top_k)})
        return rows

    def _index(self, images: str | None, index: str | None, built: dict) -> ImageIndex:
        if "index" not in built:
            if index and Path(index, INDEX_FILE).is_file():
                built["index"] = ImageIndex.load(index)
            elif images:
                built["index"] = self.index_images(images)
                if index:
                    built["index"].save(index)
            else:
                raise ValueError(
                    "text -> images needs --images FOLDER (indexed on the fly) or --index DIR (an "
                    "index saved before, or where to save the one built from --images)"
                )
        return built["index"]

    @property
    def shortlist(self) -> int:
        return int(self.processor.info.get("shortlist", 16))

    @torch.no_grad()
    def index_images(
        self, images: str | os.PathLike | Sequence[ImageInput], image_ids: Sequence[str] | None = None
    ) -> ImageIndex:
        """Regions and embeddings of ``images``: a folder (its image files, recursively, sorted) or a list. For a
        run whose model has a visual backbone, the index holds the backbone's region features of each image
        (:meth:`_backbone_regions`), so a search reads no image again.

        Raises:
            ValueError: an empty folder or list; ``image_ids`` of another length or with repeats.
        """
        if isinstance(images, (str, os.PathLike)) and Path(images).is_dir():
            folder = Path(images)
            files = sorted(p for p in folder.rglob("*") if is_image_file(p))
            images, image_ids = files, image_ids or [p.relative_to(folder).as_posix() for p in files]
        images = list(images)
        if not images:
            raise ValueError("no images to index: pass a folder with image files or a non-empty list")
        ids = (
            list(image_ids)
            if image_ids is not None
            else [
                x.image_id if isinstance(x, Regions) else str(x) if isinstance(x, (str, os.PathLike)) else f"image-{k}"
                for k, x in enumerate(images)
            ]
        )
        if len(ids) != len(images) or len(set(ids)) != len(ids):
            raise ValueError(
                f"{len(ids)} image ids ({len(set(ids))} distinct) for {len(images)} images: pass one "
                "distinct id per image"
            )
        regions, embeddings = {}, []
        for start in range(0, len(images), self.batch_size):
            chunk = self.regions(images[start : start + self.batch_size])
            if self.processor.preprocessing is not None:  # a visual backbone: the index keeps its features
                chunk = self._backbone_regions(chunk)
            for image_id, r in zip(ids[start : start + self.batch_size], chunk, strict=True):
                regions[image_id] = Regions(
                    image_id,
                    r.height,
                    r.width,
                    r.boxes,
                    r.features,
                    r.scores,
                    r.class_probs,
                    r.detector,
                    r.attribute_probs,
                )
            embeddings.append(self._embed_images(chunk))
        return ImageIndex(ids, regions, torch.cat(embeddings))

    def _backbone_regions(self, regions: Sequence[Regions]) -> list[Regions]:
        """Each image's first ``max_regions`` regions with the model's visual backbone's features in place of the
        detector's (float16, as shards store features: a search scores them as the evaluation's cached features,
        :func:`vlbert.evaluation.retrieval.backbone_regions`, up to that rounding), from its pixels
        (:class:`~vlbert.processing.images.ImageRegions`)."""
        batch = self.processor.region_batch(regions, self.device)
        features = (
            self.model.bert.extract_regions(
                batch["images"], batch["region_boxes"], batch["region_mask"], batch["image_sizes"]
            )
            .float()
            .cpu()
            .numpy()
        )
        out = []
        for r, f in zip(regions, features, strict=True):
            n = self.processor.kept_regions(r.num_regions)
            cut = [None if x is None else x[:n] for x in (r.class_probs, r.attribute_probs)]
            out.append(
                Regions(r.image_id, r.height, r.width, r.boxes[:n], f[:n], r.scores[:n], cut[0], r.detector, cut[1])
            )
        return out

    def _embed_images(self, regions: Sequence[Regions]) -> torch.Tensor:
        cls_sep = (self.tokenizer.cls_token_id, self.tokenizer.sep_token_id)
        return (
            self.model.embed_image(**self.processor.region_batch(regions, self.device), cls_sep=cls_sep).float().cpu()
        )

    @torch.no_grad()
    def _embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        chunks = (texts[s : s + self.batch_size] for s in range(0, len(texts), self.batch_size))
        return torch.cat(
            [self.model.embed_text(**self.processor.text_batch(chunk, self.device)).float().cpu() for chunk in chunks]
        )

    def _cross_scores(self, regions: Sequence[Regions], texts: Sequence[str]):
        def scores(image_rows: list[int], text_rows: list[int]) -> torch.Tensor:
            batch = self.processor.batch([texts[i] for i in text_rows], [regions[i] for i in image_rows], self.device)
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
        final, _ = rerank_shortlist(
            scores, self.shortlist, lambda q, n: (n, q), self._cross_scores(lazy, texts), self.batch_size
        )
        out = [_top(row, top_k, lambda n, s: {"image_id": index.image_ids[n], "score": s}) for row in final]
        return out[0] if single else out

    @torch.no_grad()
    def captions(self, image, captions: Sequence[str], top_k: int = 5):
        """image -> the ``top_k`` of ``captions``, best first: ``[{"caption", "index", "score"}]`` (a list of them
        for a list of images)."""
        single = _is_single(image)
        regions = self.regions(_as_list(image, single))
        captions = list(captions)
        scores = (
            torch.cat(
                [self._embed_images(regions[s : s + self.batch_size]) for s in range(0, len(regions), self.batch_size)]
            )
            @ self._embed_texts(captions).T
        )
        final, _ = rerank_shortlist(
            scores, self.shortlist, lambda q, n: (q, n), self._cross_scores(regions, captions), self.batch_size
        )
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
    return [make(n, s) for n, s in zip(ids.tolist(), scores.tolist(), strict=True)]


__all__ = ["ImageIndex", "RetrievalPipeline", "INDEX_FILE", "EMBEDDINGS_FILE"]
