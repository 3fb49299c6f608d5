"""Image-text matching: does a caption describe an image? The ITM head of a VL pretraining run or a converted
checkpoint (UNITER's ``itm_output``, VisualBERT's sentence-image head, the re-ranker of a retrieval run) scores
each (image, caption) pair, as transformers' pipelines score theirs: ``pipeline("image-text-matching", run)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlbert.inference.base import Pipeline, read_captions
from vlbert.models.retrieval import VLBertForImageTextRetrieval
from vlbert.models.vl import VLBertForPreTraining


class ImageTextMatchingPipeline(Pipeline):
    """(image, caption) -> ``{"text", "score", "match", "index"}``: ``score`` is the probability that the caption
    matches the image (softmax of the two ITM logits, UNITER section 3.2: the pooled [CLS] of the joint pass ->
    Linear(H, 2), column 1 = match), ``match`` whether it exceeds 0.5 (the head's own decision), ``index`` the
    pair's position in the call; ``image`` (the path) where the image was given as a file.

    One image and several captions -> one result per caption; several images and one caption -> one per image;
    lists of both pair up by position. ``top_k=k`` returns the k best pairs, best first (default: every pair, in
    input order). Takes VL pretraining runs and converted pretraining checkpoints (``task`` "vl-pretraining") and
    retrieval runs (their ITM re-ranker); a run's own task stays :func:`~vlbert.inference.pipeline`'s default, so
    ask for this one by name. Inputs are prepared as :class:`~vlbert.processing.VLProcessor` prepares every task's.
    """

    name = "image-text-matching"
    run_tasks = ("vl-pretraining", "retrieval")
    model_class = VLBertForPreTraining
    model_classes = (VLBertForImageTextRetrieval,)
    input_fields = {"image": ("image",), "text": ("text", "caption")}
    optional_fields = ("text",)
    parameters = {"top_k": None}
    tool_options = ("captions",)

    def check_parameters(self, top_k: int | None = None) -> None:
        """Raise ValueError for a ``top_k`` below 1 (None: every pair)."""
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")

    def run(self, examples: list[dict], **parameters) -> list[dict]:
        """Every example's result (see the class docstring); with ``top_k``, the best ``top_k`` of them.

        Raises:
            ValueError: an example without text (with the fix); a bad ``top_k``.
            TypeError: an unknown parameter.
        """
        missing = next((k for k, ex in enumerate(examples) if ex.get("text") is None), None)
        if missing is not None:
            raise ValueError(
                f"image-text matching scores (image, text) pairs; example {missing + 1} has no text "
                "(pass a caption, or a list of them)"
            )
        results = super().run(examples, **parameters)
        for k, result in enumerate(results):
            result["index"] = k
        top_k = parameters.get("top_k")
        return results if top_k is None else sorted(results, key=lambda r: -r["score"])[:top_k]

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, Any]:
        """The ITM logits [B, 2] (float32, CPU) of each pair: the model's ``itm`` head on the pooled joint pass
        (the pretraining model's ``seq_relationship_logits``; the retrieval model's re-ranker)."""
        pooled = self.model.bert(**model_inputs["batch"]).pooler_output
        return {**model_inputs, "logits": self.model.itm(pooled).float().cpu()}

    def postprocess(self, outputs, examples, top_k: int | None = None) -> list[dict]:
        out = []
        for example, probabilities in zip(examples, outputs["logits"].softmax(-1), strict=True):
            score = float(probabilities[1])
            result = {"text": example["text"], "score": score, "match": score > 0.5}
            if isinstance(example["image"], (str, Path)):
                result["image"] = str(example["image"])
            out.append(result)
        return out

    def predict_records(
        self, records: list[dict], top_k: int | None = None, captions: str | None = None, **options
    ) -> list[dict]:
        """vlbert predict's call: a record with ``text`` -> its pair's ``score`` and ``match``; a record without,
        given ``captions`` (a file of candidate captions, one per line) -> ``{"captions": [...]}``, the ``top_k``
        best of them (default all), best first.

        Raises:
            ValueError: a record without text and no ``captions``; ``top_k`` without ``captions`` (it ranks them).
        """
        if top_k is not None and not captions:
            raise ValueError(
                "--top-k ranks the --captions FILE's captions for an image; leave it out to score (image, text) pairs"
            )
        if captions is None and any(r.get("text") is None for r in records):
            raise ValueError(
                'an image-text-matching example needs a caption: --text, a "text" field, or '
                "--captions FILE (candidate captions, one per line)"
            )
        candidates = read_captions(captions) if captions else []
        pairs = iter(self.run([r for r in records if r.get("text") is not None]))  # one batched pass
        rows = []
        for record in records:
            if record.get("text") is not None:
                rows.append({k: v for k, v in next(pairs).items() if k in ("score", "match")})
                continue
            ranked = self.run([{"image": record["image"], "text": c} for c in candidates], top_k=top_k)
            rows.append(
                {"captions": [{"caption": r["text"], "index": r["index"], "score": r["score"]} for r in ranked]}
            )
        return rows


__all__ = ["ImageTextMatchingPipeline"]
