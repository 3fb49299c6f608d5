"""Does adding ITC to VL pretraining raise zero-shot image-text retrieval over ITM alone at the same steps?

    python -m benchmarks itc-vs-itm                                  # 3 seeds x 2 arms at the default size
    python -m benchmarks itc-vs-itm --steps 200 --images 300 --seeds 0 1 2 --json
    python tools/benchmark_itc_vs_itm.py --eval-images 150

For each seed, two VL pretraining runs of ``configs/vl/default.yaml`` (the packaged MiniLM, easy-VQA training images
with their derived captions, regions of the shared easy-VQA detector) that differ only in ``data.objectives``:
``{itm: 1}`` and ``{itc: 1, itm: 1}`` (one objective drawn per step, so the second arm spends about half its steps
on ITC), the same ``--steps``, ``--images``, batch and seed. Every run reads ONE region cache (``--cache-dir``).

Then each run is loaded as a :class:`~vlbert.models.retrieval.VLBertForImageTextRetrieval` (its ITM head; the ITC
arm's ``itc.*`` head becomes the shortlist's projections) and evaluated zero-shot on the first ``--eval-images``
easy-VQA *test* images, one templated caption each (:func:`~vlbert.data.retrieval.easy_vqa_captioned`): no run has
seen them. easy-VQA captions repeat ("a blue circle" fits every blue circle), so a caption's positives are the images
of its content (colour, shape) and an image's positives every caption of that content: the ``_group`` recalls of
:func:`~vlbert.evaluation.retrieval.retrieval_recalls` (strict R@1 would pick among identical captions by chance).
Both arms: the ITM cross-encoder re-ranks every pair (``shortlist`` 0, UNITER's full re-rank). The ITC arm also: the
R@1 of its ITC similarities alone (the shortlist's stage one, no re-rank), and the run's end-of-run held-out
``itc_accuracy`` (top-1 both ways within a batch) beside ``itc_accuracy_chance``. Printed: one table, per arm the
R@1 text -> image and image -> text of each seed, mean +- std (sample std over the seeds), and chance.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

import torch

from vlbert.commands import flag_types as flags

#: arm name -> its ``data.objectives``
ARMS = {"itm": {"itm": 1.0}, "itc+itm": {"itc": 1.0, "itm": 1.0}}


def arm_config(
    objectives: dict, seed: int, steps: int, images: int, batch_size: int, cache_dir: str, output_dir: str, extra=()
) -> dict:
    """``configs/vl/default.yaml`` with ``objectives``, ``seed``, ``steps``, the first ``images`` training images,
    ``batch_size``, the region cache ``cache_dir``, ``output_dir``, no progress bar, evaluation at the end only;
    ``extra``: further ``key=value`` overrides (as ``--set``)."""
    from vlbert.training.run_config import load_run_config

    values = [
        ("data.objectives", dict(objectives)),
        ("data.max_images", images),
        ("data.cache_dir", cache_dir),
        ("training.seed", seed),
        ("training.max_steps", steps),
        ("training.batch_size", batch_size),
        ("training.warmup_steps", max(1, steps // 10)),
        ("training.eval_every", steps),
        ("training.output_dir", output_dir),
        ("training.progress_bar", False),
    ]
    return load_run_config("vl/default", list(extra), values)


def evaluation_set(config: dict, count: int):
    """The first ``count`` easy-VQA test images with one derived caption each (grouped by content) and their
    regions, extracted with ``config``'s detector into its ``data.cache_dir``. Returns (images, regions)."""
    from vlbert.data.retrieval import easy_vqa_captioned
    from vlbert.recipes import RECIPES
    from vlbert.recipes.config_reading import read_run_config
    from vlbert.recipes.regions import region_store

    images = easy_vqa_captioned("test")[:count]
    _, data, detector = read_run_config(RECIPES["vl-pretraining"], config)
    regions = region_store("", "easy-vqa", data.cache_dir, detector, [im.image_id for im in images])
    return images, regions


def evaluate_run(run_dir: str, images, regions, batch_size: int = 128) -> dict:
    """Zero-shot retrieval of the pretraining run ``run_dir`` on ``images``: ``full_*`` the recalls of the ITM
    re-rank of every pair, ``itc_*`` those of the ITC similarities alone (meaningful only where the run trained
    ITC), both as :func:`~vlbert.evaluation.retrieval.retrieval_recalls`; ``chance_i2t`` / ``chance_t2i``: a
    uniform guess's R@1 by content; ``image_ids`` and ``captions``: what was ranked."""
    from vlbert.evaluation.retrieval import (
        RetrievalCandidates,
        embed_candidates,
        positive_pairs,
        rerank_candidates,
        retrieval_recalls,
    )
    from vlbert.models.retrieval import VLBertForImageTextRetrieval
    from vlbert.processing import VLProcessor

    model = VLBertForImageTextRetrieval.from_pretrained(run_dir).eval()
    processor = VLProcessor.from_pretrained(run_dir)
    captions = [(k, c) for k, im in enumerate(images) for c in im.captions]
    items = [processor.region_item(regions[im.image_id]) for im in images]
    candidates = RetrievalCandidates.build(processor.text_ids([c for _, c in captions]), items, processor.tokenizer)
    own, group = positive_pairs([im.group for im in images], [k for k, _ in captions])
    with torch.no_grad():
        image_emb, text_emb = embed_candidates(model, candidates, batch_size)
        similarity = image_emb @ text_emb.T
        i2t, t2i, _ = rerank_candidates(model, candidates, similarity, 0, batch_size)
    out = {f"full_{k}": v for k, v in retrieval_recalls(i2t, t2i, own, group).items()}
    out.update({f"itc_{k}": v for k, v in retrieval_recalls(similarity, similarity.T, own, group).items()})
    out["chance_i2t"] = float(group.float().mean(1).mean())
    out["chance_t2i"] = float(group.T.float().mean(1).mean())
    out["image_ids"] = [im.image_id for im in images]
    out["captions"] = [c for _, c in captions]
    return out


def compare(args, extra=()) -> list[dict]:
    """Every (seed, arm) run and its evaluation: one dict each with ``arm``, ``seed``, the run's final ``eval_*``
    metrics and :func:`evaluate_run`'s figures. ``args``: the parsed flags; ``extra``: overrides of every run."""
    from vlbert.recipes import RECIPES, run

    root = Path(args.output_dir)
    cache_dir = str(args.cache_dir or root / "region-cache")
    images = regions = None
    rows = []
    for seed in args.seeds:
        for arm, objectives in ARMS.items():
            out = str(root / f"{arm}-seed{seed}")
            config = arm_config(objectives, seed, args.steps, args.images, args.batch_size, cache_dir, out, extra)
            if images is None:
                images, regions = evaluation_set(config, args.eval_images)
            metrics = run(RECIPES["vl-pretraining"], config, overwrite=True)
            row = {"arm": arm, "seed": seed, **{k: v for k, v in metrics.items() if k.startswith("eval_")}}
            row.update(evaluate_run(out, images, regions))
            rows.append(row)
            print(
                f"{arm} seed {seed}: R@1 t2i {row['full_t2i_r1_group']:.3f} i2t {row['full_i2t_r1_group']:.3f}",
                file=sys.stderr,
            )
    return rows


def spread(values: list[float]) -> str:
    """``mean +- std`` in percent (sample std; 0 for one value)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):5.1f} +- {100 * std:4.1f}"


def table(rows: list[dict]) -> str:
    """The printed table: per arm (and the ITC arm's ITC-only ranking) the R@1 by content text -> image and
    image -> text of each seed, their mean +- std, chance; then the ITC arm's held-out ITC accuracy beside chance."""
    seeds = sorted({r["seed"] for r in rows})
    lines = [f"{'arm':<26}{'R@1':<5}" + "".join(f"{'seed ' + str(s):>9}" for s in seeds) + f"{'mean +- std':>16}"]
    ranked = [(f"{arm} (ITM re-rank all)", arm, "full") for arm in ARMS] + [("itc+itm (ITC only)", "itc+itm", "itc")]
    for label, arm, method in ranked:
        for direction in ("t2i", "i2t"):
            values = [
                r[f"{method}_{direction}_r1_group"] for s in seeds for r in rows if (r["arm"], r["seed"]) == (arm, s)
            ]
            lines.append(
                f"{label:<26}{direction:<5}" + "".join(f"{100 * v:9.1f}" for v in values) + f"{spread(values):>16}"
            )
    first = rows[0]
    lines.append(f"{'chance (by content)':<26}t2i {100 * first['chance_t2i']:.1f}  i2t {100 * first['chance_i2t']:.1f}")
    itc = [r for r in rows if r["arm"] == "itc+itm" and "eval_itc_accuracy" in r]
    if itc:
        acc = [r["eval_itc_accuracy"] for r in itc]
        chance = [r["eval_itc_accuracy_chance"] for r in itc]
        lines.append(
            f"itc+itm held-out itc_accuracy (both ways) {'/'.join(f'{100 * a:.1f}' for a in acc)} "
            f"(chance {'/'.join(f'{100 * c:.1f}' for c in chance)})"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=flags.count, default=200)
    p.add_argument("--images", type=flags.count, default=300, help="easy-VQA training images pretrained on")
    p.add_argument("--eval-images", type=flags.count, default=150, help="easy-VQA test images ranked")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--batch-size", type=flags.count, default=32)
    p.add_argument("--output-dir", default="runs/itc-vs-itm")
    p.add_argument("--cache-dir", default="", help="the region cache of every run (default: under --output-dir)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override of every run")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    log = logging.getLogger("vlbert")
    level = log.level
    log.setLevel(logging.ERROR)  # the runs' own lines, for the table's sake; restored for a caller in this process
    try:
        rows = compare(args, args.set)
    finally:
        log.setLevel(level)
    if args.json:
        for row in rows:
            print(json.dumps({k: v for k, v in row.items() if k not in ("image_ids", "captions")}))
    print(table(rows))
    return 0
