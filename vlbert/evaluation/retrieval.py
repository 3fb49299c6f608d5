"""Image-text retrieval metrics (Karpathy & Fei-Fei 2015; UNITER section 4): Recall@K in both directions, their
mean (UNITER's ``r_mean``), and the two-stage evaluation of a retrieval model (contrastive shortlist, cross-encoder
re-rank)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from vlbert.evaluation.sharding import gather_shares, share
from vlbert.processing.padding import pad_text
from vlbert.processing.regions import pad_regions, with_pixels
from vlbert.utils import evaluation

if TYPE_CHECKING:
    from vlbert.data.captions import CaptionedImage
    from vlbert.detectors.regions import Regions
    from vlbert.processing import VLProcessor
    from vlbert.processing.images import ImageReader


def recall_at_k(
    scores: torch.Tensor, positives: Sequence[set[int]] | torch.Tensor, ks: Sequence[int] = (1, 5, 10)
) -> dict[int, float]:
    """Share of queries with at least one correct item among their top K.

    Args:
        scores: float [Q, N], higher = better match of query q with item n. Items not scored (outside a
            shortlist) should be -inf.
        positives: for each query, the set of correct item indices (or a bool [Q, N] matrix).
        ks: the K values.
    Returns:
        {K: recall in [0, 1]}: hits / Q as a Python float (UNITER's and the usual figure, exactly).
    Raises:
        ValueError: shapes disagree or a query has no positive.
    """
    q, n = scores.shape
    if isinstance(positives, torch.Tensor):
        truth = positives.bool()
    else:
        if len(positives) != q:
            raise ValueError(f"{len(positives)} positive sets for {q} queries")
        truth = torch.zeros(q, n, dtype=torch.bool)
        for i, items in enumerate(positives):
            truth[i, list(items)] = True
    if truth.shape != scores.shape:
        raise ValueError(f"positives {tuple(truth.shape)} and scores {tuple(scores.shape)} differ")
    if not truth.any(1).all():
        raise ValueError("every query needs at least one correct item")
    order = scores.argsort(dim=1, descending=True)
    hit_rank = truth.gather(1, order).float().argmax(1)  # rank of the first correct item
    return {k: int((hit_rank < k).sum()) / q for k in ks}  # exact count / Q (float32's mean rounds)


def shortlist_indices(scores: torch.Tensor, shortlist: int) -> torch.Tensor:
    """Each query's ``shortlist`` best candidates by ``scores`` (float [Q, N]), best first: int64 [Q, k], k =
    min(shortlist, N); ``shortlist`` 0 (or N and more) keeps every candidate (UNITER's full re-rank).

    Raises:
        ValueError: ``shortlist`` < 0."""
    if shortlist < 0:
        raise ValueError(f"shortlist must be >= 0 (0 = every candidate), got {shortlist}")
    n = scores.shape[1]
    k = n if shortlist == 0 else min(shortlist, n)
    return scores.topk(k, dim=1).indices


def place_reranked(scores: torch.Tensor, top: torch.Tensor, reranked: torch.Tensor) -> torch.Tensor:
    """The final scores of a two-stage ranking: the shortlisted candidates ``top`` (int64 [Q, k],
    :func:`shortlist_indices`) take their cross-encoder scores ``reranked`` (float [Q, k]); every other candidate
    scores below the query's lowest re-ranked score by 1 plus its contrastive gap to the query's best unlisted
    candidate, so the contrastive order among them survives in float32 (a constant offset such as -1e4 rounds gaps
    below 1e-3 away and ties them). Returns float [Q, N] (``scores``' shape: the contrastive scores, CPU)."""
    final = scores.clone().scatter_(1, top, reranked.to(scores.dtype))
    listed = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, top, True)
    if not listed.all():  # everything outside the shortlist ranks after it, in contrastive order
        low = final.masked_fill(~listed, float("inf")).amin(1, keepdim=True)
        best = scores.masked_fill(listed, float("-inf")).amax(1, keepdim=True)
        low = torch.where(torch.isfinite(low), low, best + 1)  # an empty shortlist: the contrastive scores
        final = torch.where(listed, final, low - 1 - (best - scores))
    return final


def rerank_shortlist(
    scores: torch.Tensor,
    shortlist: int,
    image_and_caption: Callable[[int, int], tuple[int, int]],
    cross_scores: Callable[[list[int], list[int]], torch.Tensor],
    batch_size: int = 128,
) -> tuple[torch.Tensor, int]:
    """The second stage of retrieval (UNITER/ViLT evaluation) for one direction, in this process: each query's
    ``shortlist`` best candidates by the contrastive ``scores`` are re-scored by the cross-encoder; the rest rank
    after them in contrastive order (:func:`place_reranked`).

    Args:
        scores: float [Q, N] contrastive scores (queries x candidates), on the CPU.
        shortlist: candidates re-scored per query (0: every candidate).
        image_and_caption: (query, candidate) -> (image row, caption row) for ``cross_scores``.
        cross_scores: (image rows, caption rows) -> float [P] cross-encoder scores of those pairs.
        batch_size: pairs per ``cross_scores`` call.
    Returns:
        (final scores float [Q, N], number of cross-encoder pairs). Used by
        :class:`vlbert.inference.RetrievalPipeline`, so a search ranks as :func:`evaluate_retrieval` does.
    """
    top = shortlist_indices(scores, shortlist)
    pairs = [(q, n) for q in range(scores.shape[0]) for n in top[q].tolist()]
    values = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        image_rows, caption_rows = zip(*(image_and_caption(q, n) for q, n in chunk), strict=True)
        values.append(cross_scores(list(image_rows), list(caption_rows)).float())
    reranked = torch.cat(values).view(top.shape) if values else torch.zeros(top.shape)
    return place_reranked(scores, top, reranked), len(pairs)


def positive_pairs(image_groups: Sequence[str], caption_images: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Which (image, caption) pairs are correct, as bool matrices [images, captions] (vectorised: the COCO 5k test
    split is 5,000 x 25,000 pairs).

    Args:
        image_groups: per image, its group ("" = none): images of one group are interchangeable (easy-VQA images of
            the same colour and shape), so each counts every caption of the group as correct.
        caption_images: per caption, the index of its image.
    Returns:
        (own: caption c belongs to image i; group: caption c belongs to an image of i's group, or to i itself when
        i has no group). Transposed, they are the positives of text-to-image retrieval.
    """
    names = {g: k for k, g in enumerate(dict.fromkeys(g for g in image_groups if g))}
    # An image without a group is a group of its own (a negative id no named group has).
    ids = torch.tensor([names[g] if g else -1 - i for i, g in enumerate(image_groups)], dtype=torch.long)
    caption_image = torch.as_tensor(list(caption_images), dtype=torch.long)
    own = caption_image[None, :] == torch.arange(len(image_groups))[:, None]
    group = ids[:, None] == ids[caption_image][None, :]
    return own, group


def backbone_regions(
    model, items: list[dict], image_ids: Sequence[str], image_reader: ImageReader, batch_size: int = 128
) -> list[dict]:
    """Each image's region features computed once by the model's visual backbone, for an evaluation that pairs
    every image with many captions (the backbone's features of an image do not depend on its caption).

    Args:
        model: a retrieval model whose ``bert`` has a visual backbone (:meth:`VLBertModel.extract_regions`), in
            eval mode (dropout off: the features are those each pair's own forward computes).
        items: per image, :func:`~vlbert.processing.regions.region_item` (its boxes; features unused).
        image_ids: per image, its id for ``image_reader`` (:class:`~vlbert.processing.images.ImageReader`: the pixels).
    Returns:
        per image ``{"region_features": float32 [R, D] on the CPU, "region_boxes": float32 [R, 4]}`` (R its kept
        regions), padded by :func:`~vlbert.processing.regions.pad_regions` with ``feature_dtype=torch.float32``.
    Raises:
        KeyError: an image without a file (from the reader).
    """
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(items), batch_size):
        rows = range(start, min(start + batch_size, len(items)))
        batch = pad_regions([with_pixels(items[i], image_ids[i], image_reader) for i in rows])
        batch = {k: v.to(device) for k, v in batch.items()}
        features = (
            model.bert.extract_regions(
                batch["images"], batch["region_boxes"], batch["region_mask"], batch["image_sizes"]
            )
            .float()
            .cpu()
        )
        for j, i in enumerate(rows):
            boxes = torch.as_tensor(items[i]["region_boxes"], dtype=torch.float32)
            out.append({"region_features": features[j, : len(boxes)], "region_boxes": boxes})
    return out


@dataclass
class RetrievalCandidates:
    """The captions and images of one evaluation, tokenised and padded once on the CPU; every embedding and
    cross-encoder batch indexes them (the batch cut to its longest caption and its largest region count).

    Attributes:
        input_ids: int64 [C, T], each caption's wordpiece ids with [CLS]/[SEP] (the processor's truncation), padded
            with [PAD]; text_lengths: int64 [C].
        region_features: [I, R, D] (float16 as the shards store them; float32 for a visual backbone's features);
            region_boxes: float32 [I, R, 4] normalised xyxy; region_counts: int64 [I] (the processor's limit).
        cls_sep: the tokenizer's ([CLS], [SEP]) ids (the image-alone pass's text).
    """

    input_ids: torch.Tensor
    text_lengths: torch.Tensor
    region_features: torch.Tensor
    region_boxes: torch.Tensor
    region_counts: torch.Tensor
    cls_sep: tuple[int, int]

    @classmethod
    def build(cls, token_ids: list[list[int]], items: list[dict], tokenizer, feature_dtype=torch.float16):
        """From each caption's ids (:meth:`~vlbert.processing.VLProcessor.text_ids`) and each image's region item
        (:meth:`~vlbert.processing.VLProcessor.region_item`, or :func:`backbone_regions`'). Raises ValueError: no
        captions or no images (from the padding)."""
        text = pad_text([{"input_ids": x} for x in token_ids], tokenizer.pad_token_id, pad_to_multiple_of=1)
        regions = pad_regions(items, feature_dtype)
        return cls(
            text["input_ids"],
            text["attention_mask"].sum(1),
            regions["region_features"],
            regions["region_boxes"],
            regions["region_mask"].sum(1),
            (tokenizer.cls_token_id, tokenizer.sep_token_id),
        )

    def texts(self, rows: torch.Tensor, device) -> dict[str, torch.Tensor]:
        """Captions ``rows`` (int64 [B]) as a text batch on ``device``: input_ids, token_type_ids, attention_mask
        int64 [B, T'], T' their longest rounded up to a multiple of 8 (as the collators pad)."""
        lengths = self.text_lengths[rows]
        t = min(-(-int(lengths.max()) // 8) * 8, self.input_ids.shape[1])
        ids = self.input_ids[rows, :t]
        mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
        return {
            "input_ids": ids.to(device),
            "token_type_ids": torch.zeros_like(ids).to(device),
            "attention_mask": mask.to(device),
        }

    def images(self, rows: torch.Tensor, device) -> dict[str, torch.Tensor]:
        """Images ``rows`` (int64 [B]) as a region batch on ``device``: region_features [B, R', D], region_boxes,
        region_mask int64 [B, R'], R' their largest region count."""
        counts = self.region_counts[rows]
        r = int(counts.max())
        return {
            "region_features": self.region_features[rows, :r].to(device),
            "region_boxes": self.region_boxes[rows, :r].to(device),
            "region_mask": (torch.arange(r)[None, :] < counts[:, None]).long().to(device),
        }


def embed_candidates(
    model, candidates: RetrievalCandidates, batch_size: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every image's and every caption's unimodal embedding, once (the shortlist's stage one), each process
    embedding its :func:`~vlbert.evaluation.sharding.share` of each and the shares gathered.

    Args:
        model: a :class:`~vlbert.models.retrieval.VLBertForImageTextRetrieval` (``embed_image``, ``embed_text``),
            in eval mode under no_grad (:func:`evaluate_retrieval` is).
    Returns:
        (images float32 [I, P], captions float32 [C, P]), unit length, on the CPU.
    """
    device = next(model.parameters()).device

    def embedded(n: int, embed) -> torch.Tensor:
        mine = share(n)
        parts = [
            embed(torch.arange(s, min(s + batch_size, mine.stop))).float()
            for s in range(mine.start, mine.stop, batch_size)
        ]
        part = torch.cat(parts) if parts else torch.zeros(0, model.config.projection_dim, device=device)
        return gather_shares(part, n).cpu()

    images = embedded(
        len(candidates.region_counts),
        lambda rows: model.embed_image(**candidates.images(rows, device), cls_sep=candidates.cls_sep),
    )
    captions = embedded(len(candidates.text_lengths), lambda rows: model.embed_text(**candidates.texts(rows, device)))
    return images, captions


def rerank_candidates(
    model, candidates: RetrievalCandidates, similarity: torch.Tensor, shortlist: int = 16, batch_size: int = 128
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Stage two in both directions: each image's ``shortlist`` best captions and each caption's ``shortlist`` best
    images by ``similarity`` re-scored by the model's cross-encoder (``match_scores``), each distinct (image,
    caption) pair once (a pair on both shortlists is scored for both), the pairs split across the processes
    (:func:`~vlbert.evaluation.sharding.share`; each scores its share, the scores are gathered); ``shortlist`` 0:
    every pair (UNITER's full re-rank, ChenRocks/UNITER@1dbfa62 ``evaluate_itm``'s scoring of all pairs).

    Args:
        similarity: float [I, C] contrastive scores (images x captions), CPU (:func:`embed_candidates`).
    Returns:
        (image -> text final scores float [I, C], text -> image float [C, I] (:func:`place_reranked`), the number
        of distinct pairs the cross-encoder scored over all processes).
    """
    device = next(model.parameters()).device
    n_img, n_cap = similarity.shape
    top_i2t = shortlist_indices(similarity, shortlist)  # [I, k] captions
    top_t2i = shortlist_indices(similarity.T, shortlist)  # [C, k] images
    i2t_codes = torch.arange(n_img)[:, None] * n_cap + top_i2t  # pair (image i, caption c) -> i * C + c
    t2i_codes = top_t2i * n_cap + torch.arange(n_cap)[:, None]
    if top_i2t.shape[1] == n_cap:  # every pair
        codes = torch.arange(n_img * n_cap)
    else:
        codes = torch.cat([i2t_codes.flatten(), t2i_codes.flatten()]).unique()  # sorted
    rows = share(len(codes))
    mine = codes[rows.start : rows.stop]
    parts = []
    for s in range(0, len(mine), batch_size):
        chunk = mine[s : s + batch_size]
        batch = {**candidates.texts(chunk % n_cap, device), **candidates.images(chunk // n_cap, device)}
        parts.append(model.match_scores(**batch).float())
    part = torch.cat(parts) if parts else torch.zeros(0, device=device)
    scores = gather_shares(part, len(codes)).cpu()
    i2t = place_reranked(similarity, top_i2t, scores[torch.searchsorted(codes, i2t_codes)])
    t2i = place_reranked(similarity.T.contiguous(), top_t2i, scores[torch.searchsorted(codes, t2i_codes)])
    return i2t, t2i, len(codes)


def retrieval_recalls(
    i2t: torch.Tensor, t2i: torch.Tensor, own: torch.Tensor, group: torch.Tensor, ks: Sequence[int] = (1, 5, 10)
) -> dict[str, float]:
    """``i2t_r{K}``, ``t2i_r{K}`` (strict: ``own``), their ``_group`` forms (``group``) and ``r_mean`` /
    ``r_mean_group`` (:func:`mean_recall`) of the final scores ``i2t`` [I, C] and ``t2i`` [C, I]; ``own`` and
    ``group``: bool [I, C] (:func:`positive_pairs`). Raises ValueError as :func:`recall_at_k`."""
    out = {}
    for name, scores, positives in (
        ("i2t", i2t, own),
        ("i2t_group", i2t, group),
        ("t2i", t2i, own.T),
        ("t2i_group", t2i, group.T),
    ):
        for kk, value in recall_at_k(scores, positives, ks).items():
            base, _, suffix = name.partition("_")
            out[f"{base}_r{kk}" + (f"_{suffix}" if suffix else "")] = value
    out.update(mean_recall(out, ks))
    return out


@evaluation
def evaluate_retrieval(
    model,
    images: Sequence[CaptionedImage],
    regions: dict[str, Regions],
    processor: VLProcessor,
    shortlist: int = 16,
    batch_size: int = 128,
    ks: Sequence[int] = (1, 5, 10),
    return_scores: bool = False,
    image_reader: ImageReader | None = None,
):
    """Recall@K for image->text and text->image in two stages: each image and each caption embedded once
    (:func:`embed_candidates`), contrastive scores over all pairs pick a ``shortlist`` per query, which the
    cross-encoder re-ranks (:func:`rerank_candidates`; ``shortlist`` 0: every pair, UNITER's full re-rank); items
    outside the shortlist rank after it in contrastive order. Under several processes (every rank calls this), each
    embeds and scores its share and all ranks return the same figures.

    Cross-encoder passes: the distinct pairs of the (#images + #captions) x shortlist shortlisted, instead of
    #images x #captions. Returns ``i2t_r1``... and ``t2i_r1``... (strict: only the image's own captions count),
    ``r_mean`` (their mean over both directions and every K: with the default ``ks``, UNITER's ``r_mean`` of
    ChenRocks/UNITER@1dbfa62 ``utils/itm_eval.py``, whose ``txt_r{K}`` is ``i2t_r{K}`` here and ``img_r{K}`` is
    ``t2i_r{K}``), the same with ``_group`` (any caption/image of the same group counts), ``cross_encoder_pairs``
    and ``all_pairs``. With ``return_scores``, also the final (image x caption) and (caption x image) score
    matrices. Captions and regions are items of the run's ``processor``
    (:meth:`~vlbert.processing.VLProcessor.text_ids`, :meth:`~vlbert.processing.VLProcessor.region_item`: its
    truncation and region limit).

    ``image_reader`` (a model with a visual backbone; :func:`vlbert.recipes.regions.attach_images`): each image's
    pixels under its regions' boxes; the backbone computes each image's region features once
    (:func:`backbone_regions`), and every embedding and cross-encoder pass of that image reads them.
    Raises ValueError: ``shortlist`` < 0; an image without captions.
    """
    captions = [(k, c) for k, im in enumerate(images) for c in im.captions]
    items = [processor.region_item(regions[im.image_id]) for im in images]
    feature_dtype = torch.float16
    if image_reader is not None:
        items = backbone_regions(model, items, [im.image_id for im in images], image_reader, batch_size)
        feature_dtype = torch.float32  # the backbone's features, kept as computed
    candidates = RetrievalCandidates.build(
        processor.text_ids([c for _, c in captions]), items, processor.tokenizer, feature_dtype
    )
    image_emb, text_emb = embed_candidates(model, candidates, batch_size)
    i2t, t2i, pairs = rerank_candidates(model, candidates, image_emb @ text_emb.T, shortlist, batch_size)
    own, group = positive_pairs([im.group for im in images], [img for img, _ in captions])
    out = {"cross_encoder_pairs": pairs, "all_pairs": len(images) * len(captions)}
    out.update(retrieval_recalls(i2t, t2i, own, group, ks))
    return (out, i2t, t2i) if return_scores else out


def mean_recall(recalls: dict[str, float], ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """``r_mean``: the mean of ``i2t_r{K}`` and ``t2i_r{K}`` over ``ks`` (UNITER's ``r_mean``,
    ChenRocks/UNITER@1dbfa62 ``utils/itm_eval.py``: (mean of txt_r1, r5, r10 + mean of img_r1, r5, r10) / 2, its
    txt retrieval being image -> text), and ``r_mean_group`` of the ``_group`` recalls where ``recalls`` has them.
    UNITER's ``itm_eval`` also counts a text's row index as a hit in ``img_r{K}`` (``(rank < K).sum()`` over
    ``nonzero()``'s pairs), up to K / #texts above the recall; this is the recall itself (docs/metrics.md).

    Args:
        recalls: :func:`evaluate_retrieval`'s figures (``i2t_r1``, ``t2i_r1_group``, ...), fractions.
    Raises:
        KeyError: a strict recall of ``ks`` is missing.
    """
    out = {"r_mean": sum(recalls[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in ks) / (2 * len(ks))}
    if all(f"{d}_r{k}_group" in recalls for d in ("i2t", "t2i") for k in ks):
        out["r_mean_group"] = sum(recalls[f"{d}_r{k}_group"] for d in ("i2t", "t2i") for k in ks) / (2 * len(ks))
    return out


__all__ = [
    "recall_at_k",
    "mean_recall",
    "evaluate_retrieval",
    "rerank_shortlist",
    "shortlist_indices",
    "place_reranked",
    "positive_pairs",
    "backbone_regions",
    "RetrievalCandidates",
    "embed_candidates",
    "rerank_candidates",
    "retrieval_recalls",
]
