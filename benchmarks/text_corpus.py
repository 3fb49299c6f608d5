"""Text pretraining at two corpus sizes: peak memory, tokens/s, preparation throughput, and seconds from launch to
the first step.

    python tools/benchmark_text_corpus.py --copies 2 200 --steps 30 --num-proc 2

The corpora are the embedded BBC News articles (about 5 MB) written ``copies`` times as JSON lines under new
document ids (2 copies: about 10 MB; 200: about 1 GB). Each is prepared with ``tools/prepare_corpus.py`` (timed:
MB of text per second), then ``tools/pretrain.py --modality text`` runs ``--steps`` steps of the default model
(L=4, H=256) in a child process: its peak RSS (VmHWM, polled), the trainer's tokens/s (the whole run, and the
median step after the 4th: steady state, without the start-up), and the time from launch to the first logged step.
``--prepare-in-run`` skips the separate preparation, so the run prepares the corpus itself (a user's first run):
its peak RSS then includes the preparation. Prints JSON lines.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vlbert.commands import flag_types as flags
from vlbert.data.corpus import load_bbc_news


def write_corpus(path: Path, copies: int) -> int:
    records = load_bbc_news()
    with open(path, "w", encoding="utf-8") as f:
        for c in range(copies):
            for r in records:
                f.write(json.dumps({"id": f"copy{c}/{r['id']}", "text": r["text"]}) + "\n")
    return path.stat().st_size


def pretrain(corpus: Path, out: Path, cache: Path, steps: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "vlbert",
        "pretrain",
        "--modality",
        "text",
        "--output-dir",
        str(out),
        *[
            w
            for kv in (
                f"data.corpus={corpus}",
                f"data.corpus_cache_dir={cache}",
                f"training.max_steps={steps}",
                "training.log_every=1",
                "training.eval_every=0",
                "data.max_eval_batches=2",
                "training.progress_bar=false",
            )
            for w in ("--set", kv)
        ],
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first_step, peak_kib = None, 0
    while proc.poll() is None:
        if first_step is None and (out / "log.jsonl").is_file() and (out / "log.jsonl").read_text().strip():
            first_step = time.perf_counter() - start
        try:  # the kernel's high-water mark of the run's resident memory
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak_kib = max(peak_kib, int(status.split("VmHWM:")[1].split()[0]))
        except (OSError, IndexError):
            pass
        time.sleep(0.05)
    if proc.returncode != 0:
        raise RuntimeError(f"the run failed:\n{proc.stderr.read()[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    steps = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steady = [r["tokens_per_s"] for r in steps if r["split"] == "train"][4:]
    return {
        "run_s": round(time.perf_counter() - start, 1),
        "launch_to_first_step_s": round(first_step or 0, 1),
        "tokens_per_s": round(metrics["train_tokens_per_s"], 1),
        "tokens_per_s_median_after_step_4": round(statistics.median(steady), 1) if steady else None,
        "peak_rss_gib": round(peak_kib / 2**20, 3),
    }


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Errors propagate for :func:`vlbert.commands.run_tool` to report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--copies", type=flags.count, nargs="+", default=[2, 200])
    p.add_argument("--steps", type=flags.count, default=30)
    p.add_argument("--num-proc", type=flags.count, default=2)
    p.add_argument("--prepare-in-run", action="store_true", help="let the run prepare the corpus (no separate step)")
    p.add_argument(
        "--workdir",
        help="keep corpora, prepared arrays and runs here (a second call reuses the "
        "preparation); default: a temporary directory",
    )
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.workdir or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        for copies in args.copies:
            corpus = tmp / f"bbc-x{copies}.jsonl"
            size = write_corpus(corpus, copies) if not corpus.is_file() else corpus.stat().st_size
            shutil.rmtree(tmp / f"run-{copies}", ignore_errors=True)
            record = {"corpus_mb": round(size / 1e6, 1)}
            if args.prepare_in_run:
                shutil.rmtree(tmp / "cache", ignore_errors=True)
                record["prepared_in_run"] = True
            else:
                start = time.perf_counter()
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "vlbert",
                        "prepare-corpus",
                        "--corpus",
                        str(corpus),
                        "--num-proc",
                        str(args.num_proc),
                        "--cache-dir",
                        str(tmp / "cache"),
                    ],
                    check=True,
                    capture_output=True,
                )
                prepare_s = time.perf_counter() - start
                record.update(
                    {
                        "prepare_s": round(prepare_s, 1),
                        "prepare_mb_per_s": round(size / 1e6 / prepare_s, 2),
                        "num_proc": args.num_proc,
                    }
                )
            record.update(pretrain(corpus, tmp / f"run-{copies}", tmp / "cache", args.steps))
            print(json.dumps(record), flush=True)
    return 0
