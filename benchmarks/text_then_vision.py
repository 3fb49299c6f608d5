"""Text, then vision: what each pretraining stage gives easy-VQA fine-tuning at a small budget (docs/experiments.md).

    python -m benchmarks text-then-vision --cache-dir runs/text-then-vision          # the documented experiment
    python -m benchmarks text-then-vision --text-steps 600 --seeds 0 --budgets 100   # a part of it
    python tools/benchmark_text_then_vision.py --json

VQA fine-tuning on easy-VQA (``configs/finetune/vqa-easy-vqa.yaml``) started from six encoders: (a) the packaged
MiniLM; (c) MiniLM after VL pretraining; for each ``--text-steps`` S, (b) a text run of S steps (``configs/text/
default.yaml``: BERT L4 H256, MLM + NSP on BBC News) and (d) that run after VL pretraining. VL pretraining is
``configs/vl/default.yaml`` for ``--vl-steps`` on the captions of the first ``--train-images`` easy-VQA training
images (``data.max_images``: the first N images, those with a caption). Fine-tuning trains on the questions of the
same images (``data.max_train_images``) for each of ``--budgets`` steps (10% warmup, linear decay) and each of
``--seeds``, and is evaluated on every question of the first ``--test-images`` test images (their questions come
first in the test split: ``data.max_eval_examples``), by the recipe's ``vqa_accuracy``; the majority row is the
recipe's ``vqa_accuracy_majority_baseline`` (always the most frequent training answer). Every run reads one region
directory, extracted once by ``tools/extract_regions.py`` (the shared easy-VQA detector: EfficientNet-Lite0 at 160
pixels, 16 regions) from links to the images used, so every detector check stays on.

Every stage goes through the tools' own code (:func:`vlbert.commands.scripts.script_main`: ``extract_regions``,
``pretrain``, ``finetune_vqa``) with the command line :func:`commands` returns, and is cached under
``--cache-dir``: the regions (the extraction tool skips what it holds), each pretraining run (its ``metrics.json``)
and each fine-tuning run's result (``results/<encoder>-<steps>-s<seed>.json``), so that an interrupted experiment
resumes where it stopped and a finished one prints its table without training. ``--set STAGE:KEY=VALUE`` (STAGE
text, vl or vqa) overrides a config entry of every run of that stage (a small test's sizes).

Printed: per encoder and budget each seed's test accuracy and mean +- sample std over the seeds (percent), and the
majority row; with ``--json`` first one JSON object per pretraining run and per fine-tuning run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from vlbert.commands import flag_types as flags
from vlbert.commands.scripts import script_main
from vlbert.data.easy_vqa import first_images, image_paths
from vlbert.data.vqa import easy_vqa_examples

#: the shared easy-VQA detector (configs/detectors/easy-vqa.yaml) as extraction flags
DETECTOR = ["--backend", "timm", "--architecture", "efficientnet_lite0", "--input-size", "160", "--max-proposals", "16"]
STAGES = ("text", "vl", "vqa")


def encoders(text_steps: list[int]) -> list[tuple[str, str, str]]:
    """(key, label, pretraining run it starts from: "minilm" or a run key) in the table's order: a, c, then b and d
    of each text run length."""
    rows = [("a", "(a) MiniLM", "minilm"), ("c", "(c) MiniLM + VL", "vl-minilm")]
    for steps in text_steps:
        rows += [(f"b{steps}", f"(b) text run {steps} steps", f"text-{steps}")]
        rows += [(f"d{steps}", f"(d) text run {steps} steps + VL", f"vl-text-{steps}")]
    return rows


def eval_questions(test_images: int) -> int:
    """How many test questions the first ``test_images`` test images have: they are the split's first questions.

    Raises:
        ValueError: the test split's questions are not grouped by image in numeric order (the cut would differ).
    """
    ids = [ex.image_id for ex in easy_vqa_examples("test")]
    first = set(first_images("test", test_images))
    count = sum(i in first for i in ids)
    if set(ids[:count]) != first:
        raise ValueError("the easy-VQA test questions of the first images are not the split's first questions")
    return count


def link_images(root: Path, train_images: int, test_images: int) -> Path:
    """A directory ``root/images`` of links ``train/<n>.png`` and ``test/<n>.png`` to the package's images of the
    first ``train_images`` / ``test_images`` of each split (their ids are the paths under it)."""
    folder = root / "images"
    for split, count in (("train", train_images), ("test", test_images)):
        paths = image_paths(split)
        for image_id in first_images(split, count):
            link = folder / f"{image_id}.png"
            if not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(paths[image_id])
    return folder


def commands(args) -> dict[str, tuple[str, list[str]]]:
    """Run key -> (tool, its arguments) of every pretraining run and every fine-tuning run (``vqa-<encoder>-
    <steps>-s<seed>``), each writing into ``--cache-dir``."""
    root = Path(args.cache_dir)
    regions = ["--set", f"data.shards={root / 'regions'}"]
    sets = {
        stage: [w for s in args.set if s.startswith(stage + ":") for w in ("--set", s.split(":", 1)[1])]
        for stage in STAGES
    }
    out = {}
    for steps in args.text_steps:
        warmup = ["--set", f"training.warmup_steps={max(1, steps // 10)}"]
        out[f"text-{steps}"] = ("pretrain", ["--modality", "text", "--max-steps", str(steps), *warmup, *sets["text"]])
    vl = ["--modality", "vl", *regions, "--set", f"data.max_images={args.train_images}", "--max-steps"]
    vl += [str(args.vl_steps), "--set", f"training.warmup_steps={max(1, args.vl_steps // 10)}", *sets["vl"]]
    for init in ["minilm"] + [f"text-{s}" for s in args.text_steps]:
        start = init if init == "minilm" else str(root / "runs" / init)
        out[f"vl-{init}"] = ("pretrain", ["--init-from", start, *vl])
    vqa = ["--dataset", "easy-vqa", *regions, "--set", f"data.max_train_images={args.train_images}"]
    vqa += ["--set", f"data.max_eval_examples={eval_questions(args.test_images)}", "--set", "data.max_regions=16"]
    vqa += ["--set", "data.max_text_length=24"]
    for key, _, init in encoders(args.text_steps):
        start = init if init == "minilm" else str(root / "runs" / init)
        for steps in args.budgets:
            warmup = ["--set", f"training.warmup_steps={max(1, steps // 10)}"]
            for seed in args.seeds:
                argv = ["--init-from", start, "--max-steps", str(steps), "--seed", str(seed), *warmup, *vqa]
                out[f"vqa-{key}-{steps}-s{seed}"] = ("finetune_vqa", [*argv, *sets["vqa"]])
    for key, (_, argv) in out.items():
        argv += ["--output-dir", str(root / "runs" / key)]
    return out


def run_once(root: Path, key: str, tool: str, argv: list[str]) -> dict:
    """The run ``key``'s metrics, from its cached record (``root/results/<key>.json``) or by running ``tool`` with
    ``argv`` now (replacing an unfinished run in its directory) and recording them with the wall time."""
    record = root / "results" / f"{key}.json"
    if record.exists():
        return json.loads(record.read_text())
    out = root / "runs" / key
    start = time.time()
    script_main(tool)([*argv, *(["--overwrite"] if out.exists() else [])])
    metrics = json.loads((out / "metrics.json").read_text())
    result = {"run": key, "command": f"python tools/{tool}.py {' '.join(argv)}", "wall_s": time.time() - start}
    result.update(metrics)
    if (out / "predictions.jsonl").exists():  # what the model answered: the share of its most frequent answer
        answers = Counter(json.loads(line)["answer"] for line in (out / "predictions.jsonl").open())
        top, n = answers.most_common(1)[0]
        result.update(top_answer=top, top_answer_share=n / sum(answers.values()), distinct_answers=len(answers))
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(result, indent=1))
    print(f"[text-then-vision] {key}: {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    return result


def experiment(args) -> list[dict]:
    """Extract the regions, then every run of :func:`commands` in order (pretraining first, then the fine-tuning
    runs budget by budget, smallest first, and within a budget seed by seed: an experiment stopped early leaves the
    smaller budget's column complete with its spread), each cached. Returns every run's result (:func:`run_once`)."""
    root = Path(args.cache_dir)
    images = link_images(root, args.train_images, args.test_images)
    script_main("extract_regions")(["--images", str(images), "--output-dir", str(root / "regions"), *DETECTOR])
    runs = commands(args)
    order = [k for k in runs if not k.startswith("vqa-")]
    tuning = [k for k in runs if k.startswith("vqa-")]  # vqa-<encoder>-<steps>-s<seed>
    order += sorted(tuning, key=lambda k: (int(k.rsplit("-", 2)[1]), int(k.rsplit("-s", 1)[1])))
    return [run_once(root, key, *runs[key]) for key in order]


def spread(values: list[float]) -> str:
    """``mean +- std`` in percent (sample std over the values; 0 for one)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):5.1f} +- {100 * std:4.1f}"


def table(results: list[dict], text_steps: list[int], budgets: list[int], seeds: list[int]) -> str:
    """Per encoder and budget: each seed's ``vqa_accuracy`` and their mean +- std, in percent; the majority row
    first (the same in every run: one evaluation set, one training set). Missing runs print as ``-``."""
    by_run = {r["run"]: r for r in results}
    vqa = [r for r in results if r["run"].startswith("vqa-")]
    head = f"{'encoder':<34}{'steps':>6}" + "".join(f"{'seed ' + str(s):>9}" for s in seeds) + f"{'mean +- std':>15}"
    lines = [head]
    if vqa:
        majority = vqa[0]["vqa_accuracy_majority_baseline"]
        lines.append(f"{'always the most frequent answer':<34}{'':>6}{100 * majority:9.1f}")
    for key, label, _ in encoders(text_steps):
        for steps in budgets:
            values = [by_run.get(f"vqa-{key}-{steps}-s{s}", {}).get("vqa_accuracy") for s in seeds]
            cells = "".join(f"{100 * v:9.1f}" if v is not None else f"{'-':>9}" for v in values)
            done = [v for v in values if v is not None]
            lines.append(f"{label:<34}{steps:>6}{cells}{spread(done) if done else '':>15}")
    if vqa:
        lines.append(f"({vqa[0]['eval_questions']} test questions)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache-dir", default="runs/text-then-vision", help="every run, region and result")
    p.add_argument("--text-steps", type=flags.count, nargs="*", default=[150, 600], help="text run lengths")
    p.add_argument("--vl-steps", type=flags.count, default=100)
    p.add_argument("--budgets", type=flags.count, nargs="+", default=[100, 300], help="fine-tuning steps")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="fine-tuning seeds")
    p.add_argument("--train-images", type=flags.count, default=300, help="first training images (VL and VQA)")
    p.add_argument("--test-images", type=flags.count, default=250, help="first test images evaluated on")
    p.add_argument("--set", action="append", default=[], metavar="STAGE:KEY=VALUE", help="STAGE: text, vl or vqa")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    bad = [s for s in args.set if s.split(":", 1)[0] not in STAGES or "=" not in s]
    if bad:
        raise ValueError(f"--set {bad[0]!r}: give STAGE:KEY=VALUE with STAGE one of {', '.join(STAGES)}")
    results = experiment(args)
    if args.json:
        for result in results:
            print(json.dumps(result))
    print(table(results, args.text_steps, args.budgets, args.seeds))
    return 0


__all__ = ["encoders", "eval_questions", "link_images", "commands", "run_once", "experiment", "table", "main"]
