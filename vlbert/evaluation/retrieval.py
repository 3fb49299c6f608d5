"""Image-text retrieval metrics (Karpathy & Fei-Fei 2015; UNITER section 4): Recall@K in both directions, their
mean (UNITER's ``r_mean``), and the two-stage evaluation of a retrieval model (contrastive shortlist, cross-encoder
re-rank)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import torch

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


def rerank_shortlist(
    scores: torch.Tensor,
    shortlist: int,
    image_and_caption: Callable[[int, int], tuple[int, int]],
    cross_scores: Callable[[list[int], list[int]], torch.Tensor],
    batch_size: int = 128,
) -> tuple[torch.Tensor, int]:
    """The second stage of retrieval (UNITER/ViLT evaluation): each query's ``shortlist`` best candidates by the
    contrastive ``scores`` are re-scored by the cross-encoder; the rest rank after them in contrastive order.

    Args:
        scores: float [Q, N] contrastive scores (queries x candidates), on the CPU.
        shortlist: candidates re-scored per query.
        image_and_caption: (query, candidate) -> (image row, caption row) for ``cross_scores``.
        cross_scores: (image rows, caption rows) -> float [P] cross-encoder scores of those pairs.
        batch_size: pairs per ``cross_scores`` call.
    Returns:
        (final scores float [Q, N], number of cross-encoder pairs). A shortlisted candidate's score is its
        cross-encoder score; every other candidate scores below the query's lowest re-ranked score by 1 plus its
        contrastive gap to the query's best unlisted candidate, so the contrastive order among them survives in
        float32 (a constant offset such as -1e4 rounds gaps below 1e-3 away and ties them). Used by
        :func:`evaluate_retrieval` and by :class:`vlbert.inference.RetrievalPipeline`, so a search ranks exactly as
        the evaluation does.
    """
    top = scores.topk(min(shortlist, scores.shape[1]), dim=1).indices
    pairs = [(q, n) for q in range(scores.shape[0]) for n in top[q].tolist()]
    final = scores.clone()
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        image_rows, caption_rows = zip(*(image_and_caption(q, n) for q, n in chunk), strict=True)
        for (q, n), value in zip(chunk, cross_scores(list(image_rows), list(caption_rows)).tolist(), strict=True):
            final[q, n] = value
    listed = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, top, True)
    if not listed.all():  # everything outside the shortlist ranks after it, in contrastive order
        low = final.masked_fill(~listed, float("inf")).amin(1, keepdim=True)
        best = scores.masked_fill(listed, float("-inf")).amax(1, keepdim=True)
        low = torch.where(torch.isfinite(low), low, best + 1)  # an empty shortlist: the contrastive scores
        final = torch.where(listed, final, low - 1 - (best - scores))
    return final, len(pairs)


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
    """Recall@K for image->text and text->image: contrastive scores over all pairs pick a ``shortlist`` per
    query, which the cross-encoder re-ranks; items outside the shortlist rank after it in contrastive order.

    Cross-encoder passes: (#images + #captions) x shortlist, instead of #images x #captions.
    Returns ``i2t_r1``... and ``t2i_r1``... (strict: only the image's own captions count), ``r_mean`` (their mean
    over both directions and every K: with the default ``ks``, UNITER's ``r_mean`` of ChenRocks/UNITER@1dbfa62
    ``utils/itm_eval.py``, whose ``txt_r{K}`` is ``i2t_r{K}`` here and ``img_r{K}`` is ``t2i_r{K}``), the same with
    ``_group`` (any caption/image of the same group counts), and ``cross_encoder_pairs``. With
    ``return_scores``, also the final (image x caption) and (caption x image) score matrices. Captions and regions
    are items of the run's ``processor`` (:meth:`~vlbert.processing.VLProcessor.text_ids`,
    :meth:`~vlbert.processing.VLProcessor.region_item`: its truncation and region limit).

    ``image_reader`` (a model with a visual backbone; :func:`vlbert.recipes.regions.attach_images`): each image's
    pixels under its regions' boxes; the backbone computes each image's region features once
    (:func:`backbone_regions`), and every embedding and cross-encoder pass of that image reads them.
    """
    device = next(model.parameters()).device
    captions = [(k, c) for k, im in enumerate(images) for c in im.captions]
    ids = processor.text_ids([c for _, c in captions])
    items = [processor.region_item(regions[im.image_id]) for im in images]
    tokenizer = processor.tokenizer
    feature_dtype = torch.float16
    if image_reader is not None:
        items = backbone_regions(model, items, [im.image_id for im in images], image_reader, batch_size)
        feature_dtype = torch.float32  # the backbone's features, kept as computed

    def text_batch(rows):
        return {
            k: v.to(device) for k, v in pad_text([{"input_ids": ids[i]} for i in rows], tokenizer.pad_token_id).items()
        }

    def image_batch(rows):
        return {k: v.to(device) for k, v in pad_regions([items[i] for i in rows], feature_dtype).items()}

    t_emb = torch.cat(
        [
            model.embed_text(**text_batch(range(s, min(s + batch_size, len(ids)))))
            for s in range(0, len(ids), batch_size)
        ]
    )
    cls_sep = (tokenizer.cls_token_id, tokenizer.sep_token_id)
    v_emb = torch.cat(
        [
            model.embed_image(**image_batch(range(s, min(s + batch_size, len(items)))), cls_sep=cls_sep)
            for s in range(0, len(items), batch_size)
        ]
    )
    sim = (v_emb @ t_emb.T).cpu()  # [images, captions]

    def cross_scores(image_rows, caption_rows) -> torch.Tensor:
        return model.match_scores(**text_batch(caption_rows), **image_batch(image_rows)).cpu()

    i2t, n1 = rerank_shortlist(sim, shortlist, lambda q, n: (q, n), cross_scores, batch_size)
    t2i, n2 = rerank_shortlist(sim.T.contiguous(), shortlist, lambda q, n: (n, q), cross_scores, batch_size)
    own, group = positive_pairs([im.group for im in images], [img for img, _ in captions])
    out = {"cross_encoder_pairs": n1 + n2, "all_pairs": len(images) * len(captions)}
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


__all__ = ["recall_at_k", "mean_recall", "evaluate_retrieval", "rerank_shortlist", "positive_pairs", "backbone_regions"]
