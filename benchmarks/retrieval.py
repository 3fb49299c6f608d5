"""Retrieval evaluation's two stages against UNITER's full re-rank: time and Recall@1/5/10 both ways.

    python -m benchmarks retrieval                                   # 1,000 and 5,000 images, shortlist 16
    python -m benchmarks retrieval --images 1000 --shortlist 32 --json
    vlbert benchmark retrieval --threads 2

For each gallery size, on synthetic region features and captions (random words of the tokenizer's vocabulary) and a
small random-init :class:`~vlbert.models.retrieval.VLBertForImageTextRetrieval`, the evaluation's own functions
(:mod:`vlbert.evaluation.retrieval`): every caption and image embedded once, then the cross-encoder re-ranks either
each query's ``--shortlist`` best candidates in both directions (each distinct pair once) or every pair (UNITER's
``evaluate_itm``; needs no embeddings). Prints, per size and method, the cross-encoder pairs, the seconds (embedding,
re-rank, total), R@1/5/10 image -> text and text -> image, the share of queries whose shortlist holds a positive,
and the recalls over those queries only (``held``); then how many times faster the shortlist was. A random-init model
ranks at chance: the times are the point, the recalls show that both methods read the same scores. With ``--json``,
one JSON object per (size, method).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

#: the columns of one printed row: (figure, header)
COLUMNS = (("images", "images"), ("method", "method"), ("cross_encoder_pairs", "pairs"), ("seconds", "s"))


def synthetic_gallery(n_images: int, captions_per_image: int, words: int, regions: int, dim: int, tokenizer, seed=0):
    """``n_images`` images of ``regions`` random regions (features float32 [regions, dim] ~ N(0, 1), boxes inside a
    100 x 100 image) and ``captions_per_image`` captions of ``words`` random whole words of ``tokenizer``'s
    vocabulary each. Returns (list of :class:`~vlbert.data.captions.CaptionedImage`, image id ->
    :class:`~vlbert.detectors.regions.Regions`)."""
    from vlbert.detectors.regions import Regions

    from vlbert.data.captions import CaptionedImage

    rng = np.random.default_rng(seed)
    vocab = sorted(w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and len(w) > 2)
    images, by_id = [], {}
    for i in range(n_images):
        image_id = f"synthetic-{i}"
        captions = tuple(" ".join(rng.choice(vocab, words)) for _ in range(captions_per_image))
        images.append(CaptionedImage(image_id, captions))
        xy = rng.uniform(0, 50, (regions, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(10, 50, (regions, 2))], 1)
        features = rng.standard_normal((regions, dim)).astype(np.float32)
        by_id[image_id] = Regions(image_id, 100, 100, boxes, features, np.ones(regions, np.float32))
    return images, by_id


def compare(model, images, regions, processor, shortlist: int, batch_size: int, ks=(1, 5, 10)) -> list[dict]:
    """The shortlist and the full re-rank of one gallery, each timed: two dicts (``method`` "shortlist" / "full")
    with ``cross_encoder_pairs``, ``embed_seconds`` (the shortlist's stage one; 0 for full), ``rerank_seconds``,
    ``seconds`` (their sum), the recalls of :func:`~vlbert.evaluation.retrieval.retrieval_recalls` (``i2t_r1``,
    ...), ``i2t_held`` / ``t2i_held`` (share of queries whose shortlist holds a positive) and ``i2t_r{K}_held`` /
    ``t2i_r{K}_held`` (the recall over those queries)."""
    from vlbert.evaluation.retrieval import (
        RetrievalCandidates,
        embed_candidates,
        positive_pairs,
        recall_at_k,
        rerank_candidates,
        retrieval_recalls,
        shortlist_indices,
    )

    captions = [(k, c) for k, im in enumerate(images) for c in im.captions]
    items = [processor.region_item(regions[im.image_id]) for im in images]
    candidates = RetrievalCandidates.build(processor.text_ids([c for _, c in captions]), items, processor.tokenizer)
    own, group = positive_pairs([im.group for im in images], [k for k, _ in captions])
    model.eval()
    rows = []
    with torch.no_grad():
        start = time.perf_counter()
        image_emb, text_emb = embed_candidates(model, candidates, batch_size)
        similarity = image_emb @ text_emb.T
        embed_seconds = time.perf_counter() - start
        held = {
            "i2t": own.gather(1, shortlist_indices(similarity, shortlist)).any(1),
            "t2i": own.T.gather(1, shortlist_indices(similarity.T, shortlist)).any(1),
        }
        for method, k, embedded in (("shortlist", shortlist, embed_seconds), ("full", 0, 0.0)):
            start = time.perf_counter()
            i2t, t2i, pairs = rerank_candidates(model, candidates, similarity, k, batch_size)
            seconds = time.perf_counter() - start
            row = {"images": len(images), "captions": len(captions), "method": method, "shortlist": k}
            row.update(cross_encoder_pairs=pairs, embed_seconds=embedded, rerank_seconds=seconds)
            row["seconds"] = embedded + seconds
            row.update(retrieval_recalls(i2t, t2i, own, group, ks))
            for name, scores, positives in (("i2t", i2t, own), ("t2i", t2i, own.T)):
                mask = held[name]
                row[f"{name}_held"] = int(mask.sum()) / len(mask)  # exact, as the recalls
                if mask.any():
                    for kk, value in recall_at_k(scores[mask], positives[mask], ks).items():
                        row[f"{name}_r{kk}_held"] = value
            rows.append(row)
    return rows


def build_model(tokenizer, hidden: int, layers: int, feature_dim: int, seed: int = 0):
    """A random-init retrieval model: ``layers`` layers of width ``hidden`` (2 heads, FFN 2 x hidden), regions of
    ``feature_dim``, projections of ``hidden`` / 2, dropout off; weights drawn from ``seed`` with std 0.3."""
    import vlbert

    torch.manual_seed(seed)
    config = vlbert.VLBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
        region_feature_dim=feature_dim,
        num_region_classes=0,
        projection_dim=max(hidden // 2, 1),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.3,  # wide: the scores of a random model spread instead of tying near a constant
    )
    return vlbert.VLBertForImageTextRetrieval(config).eval()


def format_row(row: dict, ks=(1, 5, 10)) -> str:
    """One printed line of :func:`compare`'s ``row``."""
    recalls = " ".join(
        f"{d} R@" + "/".join(str(k) for k in ks) + " " + "/".join(f"{100 * row[f'{d}_r{k}']:.1f}" for k in ks)
        for d in ("i2t", "t2i")
    )
    held = " ".join(
        f"{d} held {100 * row[f'{d}_held']:.1f}% R@1 there "
        + (f"{100 * row[f'{d}_r1_held']:.1f}" if f"{d}_r1_held" in row else "-")
        for d in ("i2t", "t2i")
    )
    return (
        f"{row['images']:>6} images {row['captions']:>6} captions  {row['method']:<9} "
        f"{row['cross_encoder_pairs']:>10} pairs  {row['seconds']:8.2f} s (embed {row['embed_seconds']:.2f}, "
        f"re-rank {row['rerank_seconds']:.2f})  {recalls}  {held}"
    )


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Raises ValueError for a gallery size or shortlist below 1 (one ``error:`` line under the tools'
    rule)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, nargs="+", default=[1000, 5000], help="gallery sizes (default 1000 5000)")
    p.add_argument("--captions-per-image", type=int, default=1)
    p.add_argument("--shortlist", type=int, default=16, help="candidates per query re-ranked (default 16)")
    p.add_argument("--batch-size", type=int, default=1024, help="pairs per cross-encoder forward")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--regions", type=int, default=4, help="regions per image")
    p.add_argument("--feature-dim", type=int, default=32)
    p.add_argument("--words", type=int, default=4, help="words per caption")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if min(args.images) < 1 or args.shortlist < 1 or args.captions_per_image < 1:
        raise ValueError("--images, --shortlist and --captions-per-image must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from vlbert.processing import VLProcessor
    from vlbert.tokenization import load_tokenizer

    tokenizer = load_tokenizer()
    processor = VLProcessor(tokenizer, max_regions=args.regions, max_text_length=args.words * 4 + 2)
    model = build_model(tokenizer, args.hidden, args.layers, args.feature_dim, args.seed)
    if not args.json:
        print(
            f"model: {args.layers} layer(s) x {args.hidden}, random init; {args.regions} regions of "
            f"{args.feature_dim}, {args.words}-word captions; shortlist {args.shortlist}; batch {args.batch_size}; "
            f"{torch.get_num_threads()} threads"
        )
    for n in args.images:
        images, regions = synthetic_gallery(
            n, args.captions_per_image, args.words, args.regions, args.feature_dim, tokenizer, args.seed
        )
        rows = compare(model, images, regions, processor, args.shortlist, args.batch_size)
        for row in rows:
            print(json.dumps(row) if args.json else format_row(row))
        if not args.json:
            short, full = rows
            print(
                f"{n:>6} images: the shortlist took {short['seconds'] / full['seconds']:.3f} of the full re-rank's time"
            )
    return 0
