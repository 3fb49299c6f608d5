"""The README's quick start, timed: each command run as a newcomer runs it, from a clean output directory and a cold
cache, several times; min / median / max wall time and the load average while it ran.

    python -m benchmarks quickstart --repeats 3                    # every quick-start command, 3 times each
    python -m benchmarks quickstart --commands vl vqa --repeats 1  # the image-text path once
    taskset -c 0,1 python -m benchmarks quickstart --json          # on 2 cores of a larger machine

Each repeat runs, in a new temporary directory (its working directory, so ``runs/`` starts empty) and with a new
region and corpus cache in it (``--set data.cache_dir=...`` / ``data.corpus_cache_dir=...``, the only change to the
README's lines), the commands of :data:`COMMANDS` in order: ``text`` (BERT pretraining), ``vl`` (VL pretraining,
its region extraction included), ``vqa`` (easy-VQA fine-tuning from that ``vl`` run, extraction of the test images
and the evaluation over every test question included), ``predict`` (``vlbert example-image`` + ``tools/predict.py``
on it). A command that needs an earlier one's run (``vqa`` needs ``vl``) brings it along, untimed, where it is not
among ``--commands``. Each command runs in a child process (``python -m vlbert ...``: the package this Python
imports), its log kept in the repeat's directory (``<name>.log``; ``--keep`` keeps the directories;
``--show-output`` prints what the last repeat's commands printed: the end-of-run tables, the answers). The load
average is the 1-minute figure read every 2 s while the command ran (its mean and maximum), beside the machine's CPU
count; on a shared machine the figures grow with the load, so compare them only at a like load.

Prints one table (``--json``: one JSON object per command) and, per run, the seconds it took.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from vlbert.commands import flag_types as flags

#: name -> (the README's command line(s), as argv after ``python -m vlbert`` (``tools/finetune_vqa.py`` is
#: ``vlbert finetune --task vqa``); the names of the commands it needs first). ``{cache}``: the repeat's cache.
COMMANDS = {
    "text": ([["pretrain", "--modality", "text", "--set", "data.corpus_cache_dir={cache}/corpora"]], ()),
    "vl": ([["pretrain", "--modality", "vl", "--set", "data.cache_dir={cache}/regions"]], ()),
    "vqa": (
        [
            [
                "finetune",
                "--task",
                "vqa",
                "--dataset",
                "easy-vqa",
                "--init-from",
                "runs/vl-default",
                "--set",
                "data.cache_dir={cache}/regions",
            ]
        ],
        ("vl",),
    ),
    "predict": (
        [
            ["example-image", "photo.png"],
            [
                "predict",
                "runs/vqa-easy-vqa",
                "--image",
                "photo.png",
                "--text",
                "what color is the shape?",
                "--top-k",
                "3",
            ],
        ],
        ("vl", "vqa"),
    ),
}


class LoadMonitor:
    """The 1-minute load average read every ``interval`` seconds in a thread while in the ``with`` block:
    ``mean`` and ``max`` of the readings (the first taken on entry)."""

    def __init__(self, interval: float = 2.0):
        self.interval, self.readings = interval, []
        self._stop = threading.Event()

    def _poll(self):
        while not self._stop.wait(self.interval):
            self.readings.append(os.getloadavg()[0])

    def __enter__(self):
        self.readings = [os.getloadavg()[0]]
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.readings.append(os.getloadavg()[0])

    @property
    def mean(self) -> float:
        return statistics.fmean(self.readings)

    @property
    def max(self) -> float:
        return max(self.readings)


def run_command(name: str, workdir: Path, cache: Path) -> tuple[float, float, float, str]:
    """(wall seconds, mean load, max load, standard output) of quick-start command ``name`` run in ``workdir``;
    its standard error (logs, progress bars) goes to ``workdir/<name>.log``.

    Raises:
        RuntimeError: the command failed (its last output lines in the message).
    """
    printed = []
    start = time.perf_counter()
    with LoadMonitor() as load, open(workdir / f"{name}.log", "w") as log:
        for argv in COMMANDS[name][0]:
            argv = [w.format(cache=cache) for w in argv]
            proc = subprocess.run(
                [sys.executable, "-m", "vlbert", *argv],
                cwd=workdir,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            printed.append(proc.stdout)
            if proc.returncode != 0:
                log.flush()
                tail = (workdir / f"{name}.log").read_text(errors="replace").replace("\r", "\n").splitlines()[-30:]
                raise RuntimeError(
                    f"quick-start command {name} ({' '.join(argv)}) exited {proc.returncode}:\n"
                    + "\n".join([proc.stdout[-2000:], *tail])
                )
    return time.perf_counter() - start, load.mean, load.max, "".join(printed)


def minutes(seconds: float) -> str:
    """``"4:05"`` (minutes:seconds, rounded to the second)."""
    m, s = divmod(round(seconds), 60)
    return f"{m}:{s:02d}"


def time_commands(
    timed: list[str], repeats: int, workdir: str | None = None, keep: bool = False
) -> tuple[dict[str, list[tuple[float, float, float]]], dict[str, str]]:
    """Run the quick-start commands ``timed`` (and those they need first) ``repeats`` times, each repeat in a clean
    directory under ``workdir`` (removed unless ``keep``), reporting each run on stderr.

    Returns:
        (command -> one (seconds, mean load, max load) per repeat, command -> what it printed in the last repeat).
    Raises:
        RuntimeError: a quick-start command failed.
    """
    needed = [n for n in COMMANDS if n in timed or any(n in COMMANDS[t][1] for t in timed)]
    results: dict[str, list[tuple[float, float, float]]] = {n: [] for n in timed}
    outputs: dict[str, str] = {}
    for repeat in range(repeats):
        directory = Path(tempfile.mkdtemp(prefix=f"quickstart-{repeat}-", dir=workdir))
        try:
            for name in needed:
                seconds, mean_load, max_load, output = run_command(name, directory, directory / "cache")
                if name in results:
                    results[name].append((seconds, mean_load, max_load))
                    outputs[name] = output
                    print(
                        f"repeat {repeat + 1}/{repeats}: {name} {seconds:.0f} s (load {mean_load:.1f} mean, "
                        f"{max_load:.1f} max)",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            if keep:
                print(f"kept {directory}", file=sys.stderr)
            else:
                shutil.rmtree(directory, ignore_errors=True)
    return results, outputs


def summary(results: dict[str, list[tuple[float, float, float]]]) -> list[dict]:
    """One row per command of :func:`time_commands`' results: its runs, min / median / max seconds, the 1-minute
    load's mean and max, the CPU count and every run's seconds."""
    rows = []
    for name, runs in results.items():
        seconds = [s for s, _, _ in runs]
        rows.append(
            {
                "command": name,
                "runs": len(seconds),
                "min_s": round(min(seconds), 1),
                "median_s": round(statistics.median(seconds), 1),
                "max_s": round(max(seconds), 1),
                "load_mean": round(statistics.fmean(m for _, m, _ in runs), 1),
                "load_max": round(max(x for _, _, x in runs), 1),
                "cpus": os.cpu_count(),
                "seconds": [round(s, 1) for s in seconds],
            }
        )
    return rows


def print_table(rows: list[dict]) -> None:
    """The :func:`summary` rows as a plain table, times as minutes:seconds."""
    head = ("command", "runs", "min", "median", "max", "load (1 min) mean / max", "CPUs")
    table = [head] + [
        (
            r["command"],
            str(r["runs"]),
            minutes(r["min_s"]),
            minutes(r["median_s"]),
            minutes(r["max_s"]),
            f"{r['load_mean']:.1f} / {r['load_max']:.1f}",
            str(r["cpus"]),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for k, row in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; the module docstring); returns 0.

    Raises:
        RuntimeError: a quick-start command failed.
    """
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--commands",
        nargs="+",
        choices=list(COMMANDS),
        default=list(COMMANDS),
        help="which quick-start commands to time (default: all, in the README's order)",
    )
    p.add_argument("--repeats", type=flags.count, default=3, help="clean runs of each command (default 3)")
    p.add_argument("--workdir", help="make the repeats' directories here (default: the system's temporary one)")
    p.add_argument("--keep", action="store_true", help="keep each repeat's directory (runs, caches, outputs)")
    p.add_argument("--show-output", action="store_true", help="print what each command printed (last repeat)")
    p.add_argument("--json", action="store_true", help="one JSON object per command instead of the table")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.workdir and not Path(args.workdir).is_dir():
        p.error(f"--workdir {args.workdir} is not a directory: create it, or leave --workdir out (a temporary one)")
    timed = [n for n in COMMANDS if n in args.commands]
    results, outputs = time_commands(timed, args.repeats, args.workdir, args.keep)
    rows = summary(results)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print_table(rows)
    if args.show_output:
        for name in timed:
            print(f"\n--- {name} (last repeat) ---\n{outputs[name]}")
    return 0


__all__ = ["COMMANDS", "LoadMonitor", "run_command", "time_commands", "summary", "print_table", "main"]
