"""The multi-process tests' shared pieces: a free port, a tiny text-pretraining config, the losses a run logged, the
single-process reference run, and :func:`launch`, torch's elastic launcher (torchrun's agent) starting its workers by
fork from this already-imported process (:func:`agent_config`, :func:`forked`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import uuid
from pathlib import Path

from helpers.builders import like_a_worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(corpus, out, batch_size, steps=6, **training):
    return {
        "modality": "text",
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
        },
        "data": {
            "corpus": str(corpus),
            "max_seq_length": 64,
            "eval_fraction": 0.0,
            "corpus_cache_dir": str(Path(out).parent / "corpora"),
        },
        "training": {
            "output_dir": str(out),
            "max_steps": steps,
            "batch_size": batch_size,
            "learning_rate": 1e-3,
            "warmup_steps": 1,
            "log_every": 1,
            "progress_bar": False,
            **training,
        },
    }


def losses(out: Path) -> dict[int, float]:
    return {
        r["step"]: r["loss"]
        for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())
        if r["split"] == "train"
    }


def stopped_copy(run: Path, stopped: Path, checkpoint: int, logged: int) -> None:
    """Make ``stopped`` the run directory ``run`` would have left had it been stopped after logging step
    ``logged``: its checkpoint ``step-<checkpoint>`` and the lines of its ``log.jsonl`` up to step ``logged`` (the
    steps after the checkpoint are retrained on ``--resume``, their lines replaced)."""
    (stopped / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / f"step-{checkpoint}", stopped / "checkpoints" / f"step-{checkpoint}")
    lines = (run / "log.jsonl").read_text().splitlines()
    (stopped / "log.jsonl").write_text("".join(line + "\n" for line in lines if json.loads(line)["step"] <= logged))


def reference_run(run_config: dict, recipe: str = "text-pretraining", resume: bool = False) -> None:
    """What a :func:`launch` worker does (float64, one thread), alone in this process: the single-process side of a
    comparison, or a resume that is not itself under test."""
    from vlbert.recipes import RECIPES, run

    with like_a_worker(float64=True):
        run(RECIPES[recipe], run_config, resume=resume)


def forked_reference_run(run_config: dict, recipe: str = "text-pretraining", resume: bool = False) -> None:
    """:func:`reference_run` in a forked child (:class:`ForkedProcess`): for a bf16-params run, whose backward
    through FSDP2's DTensors starts autograd's device threads, after which a fork of this process can run no
    backward (torch: "Unable to handle autograd's threading in combination with fork-based multiprocessing"), so
    the launches after it would fail. Raises AssertionError if the run fails."""
    import tempfile

    log = Path(tempfile.mkdtemp()) / "stderr"
    process = ForkedProcess(reference_run, run_config, recipe, resume, stderr=log)
    assert process.wait() == 0, f"the forked reference run of {recipe} failed:\n{log.read_text()[-3000:]}"


def start_method() -> str:
    """How this process starts the workers of a test: "fork" (from this already-imported process, the usual case);
    "forkserver" once this process has trained bf16-params itself (FSDP2 on a one-rank process group, which is
    the only process group a test process starts: its launches' are the workers'). A backward through FSDP2's
    DTensors starts autograd's worker threads, after which no forked child can run a backward (torch: "Unable to
    handle autograd's threading in combination with fork-based multiprocessing"), whatever it runs; a fork
    server is a fresh interpreter that has run none, started once per test process (its imports
    :func:`import_before_forking`'s), and every worker is forked from it."""
    import multiprocessing

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return "fork"
    multiprocessing.set_forkserver_preload(["helpers.distributed", "vlbert.recipes", "transformers", "datasets"])
    return "forkserver"


def as_a_new_process() -> None:
    """What a forked worker must not inherit from this process: accelerate's process state (a single-process run
    here made it; a new process under a launcher reads its rank and world size from the environment), and this
    process's threads (one, as ``OMP_NUM_THREADS=1``), and tqdm's write lock: its default holds a multiprocessing
    semaphore that a fork shares, so a child killed while drawing a progress bar left it taken and the test
    process's next bar waited for ever (the killed-extraction test hung so once)."""
    import threading

    import torch
    import tqdm.auto
    import tqdm.std
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    torch.set_num_threads(1)
    os.environ.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    for bar in {tqdm.std.tqdm, tqdm.auto.tqdm}:
        bar.set_lock(threading.RLock())


def import_before_forking() -> None:
    """Import here what every forked run imports, so that the children inherit it instead of each importing it:
    vlbert's recipes, transformers' tokenizer classes (its lazy module: 1.6 s), ``datasets`` (1.0 s) and
    TensorBoard's writer; and measure the CPU's matmul peak that each run's MFU divides by (measured once per
    process and kept: :func:`vlbert.training.mfu.device_peak_flops`, 0.3-0.5 s). Once per test process; 2-3 s of
    CPU saved per child."""
    import datasets  # noqa: F401
    import torch
    import torch.utils.tensorboard  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    import vlbert.recipes  # noqa: F401
    from vlbert.training.mfu import device_peak_flops

    device_peak_flops(torch.device("cpu"), False)


class ForkedProcess:
    """``target(*args)`` in a process forked from this one, which has imported torch, transformers and vlbert
    already (an interpreter's start and those imports cost 4-9 s of CPU on 2-core VMs), with ``subprocess.Popen``'s
    ``poll`` / ``send_signal`` / ``wait``: for the tests whose process is under test (a signal mid-run, a kill), not
    the interpreter's start (tests/commands/test_cli.py starts ``tools/*.py`` as a real process). The child starts as
    :func:`as_a_new_process`, writes its standard error (and its workers', where it forks any) to ``stderr`` (or
    nowhere), and exits with what ``target`` returns."""

    def __init__(self, target, *args, stderr: Path | None = None):
        import multiprocessing

        import_before_forking()
        self.process = multiprocessing.get_context(start_method()).Process(
            target=_forked_process, args=(target, args, str(stderr) if stderr else os.devnull)
        )
        self.process.start()

    def poll(self) -> int | None:
        return self.process.exitcode

    def send_signal(self, sig: int) -> None:
        os.kill(self.process.pid, sig)

    def wait(self, timeout: float = 300.0) -> int:
        self.process.join(timeout)
        assert self.process.exitcode is not None, f"process {self.process.pid} still runs after {timeout} s"
        return self.process.exitcode


def _forked_process(target, args: tuple, stderr: str) -> None:
    import sys

    fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's streams until os._exit)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    as_a_new_process()
    code = 1
    try:
        code = target(*args) or 0
    except SystemExit as e:  # sys.exit(): None is success, as for an interpreter
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def tool_process(name: str, argv: list, stderr: Path | None = None) -> ForkedProcess:
    """``tools/<name>.py argv`` as a :class:`ForkedProcess`: the script's command under the tools' error rule (one
    ``error:`` line and status 1 / 2; 143 after SIGTERM), without an interpreter's start."""
    return ForkedProcess(tool_status, name, list(argv), stderr=stderr)


def tool_status(name: str, argv: list) -> int:
    """The exit status of ``tools/<name>.py argv`` run in this process under the tools' error rule (what a forked
    tool process or a launched rank runs)."""
    from helpers.builders import tool
    from vlbert.commands import run_tool

    return run_tool(tool(name), argv)


def all_forked(ranks: int):
    """What :func:`in_a_new_process` waits on: a barrier of the ``ranks`` workers of a launch (all nodes' workers
    for several nodes), made in this process before any of them is forked.

    Why the workers wait: each worker's first act is to connect to the agent's TCPStore, whose server thread runs
    in the process that forks the next worker, and the server names each connection it accepts through
    ``getnameinfo``, under glibc's resolver lock. A worker forked while that thread held the lock inherits it held,
    with no thread to release it, and its own connect waited in ``__resolv_context_get`` for ever (the
    three-process test hung so twice in 2026-11; a fork-with-threads hazard). Connecting only once every worker
    exists leaves no fork during a connection."""
    import multiprocessing

    return multiprocessing.get_context(start_method()).Barrier(ranks)


def in_a_new_process(forked_all, entrypoint, *args):
    """``entrypoint(*args)`` after :func:`as_a_new_process`, once every worker of the launch is forked
    (``forked_all``: :func:`all_forked`): what each forked worker of an elastic agent runs.

    Raises:
        threading.BrokenBarrierError: some worker of the launch did not start within 120 s.
    """
    as_a_new_process()
    forked_all.wait(timeout=120)
    return entrypoint(*args)


def _forked_worker(rank: int, worker, *args) -> None:
    as_a_new_process()
    worker(rank, *args)


def _run_in_worker(runs: list, float64: bool) -> None:
    """One forked worker (one thread, float64 by default, as :func:`reference_run`), every run in turn.
    ``runs``: ``[recipe, run config]`` or ``[recipe, run config, resume]``."""
    import torch

    if float64:
        torch.set_default_dtype(torch.float64)
    from vlbert.recipes import RECIPES, run

    for name, run_config, *resume in runs:
        run(RECIPES[name], run_config, resume=bool(resume and resume[0]))


def launch(runs: list, nproc: int = 2, float64: bool = True, entrypoint=None, args: tuple = ()) -> dict:
    """Run ``runs`` (``[recipe, run config(, resume)]`` each, in turn) on ``nproc`` processes as torchrun does:
    torch's elastic agent (:func:`torch.distributed.launcher.api.elastic_launch`, what ``torchrun`` runs) with its
    default static rendezvous on a free port (:func:`agent_config`), setting RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR/PORT, ... for each worker. The workers are forked from this process, which has imported torch,
    transformers and vlbert already: a torchrun launch costs each worker an interpreter's start and those imports
    (4-9 s of CPU each on 2-core VMs), which was most of the distributed tests' time. What this leaves untested is torchrun's own command-line parsing
    (torch's); the two-node tests run two such agents in forked node processes (tests/training/test_multinode.py).
    ``entrypoint(*args)`` replaces the runs where given (a tool's ``main``: tests/regions/test_extraction.py).
    Returns each rank's return value; a failed worker raises torch's ``ChildFailedError`` with its traceback. This
    process's signal handlers (which the agent replaces) are restored after."""
    from torch.distributed.launcher.api import elastic_launch

    import_before_forking()

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    if entrypoint is None:
        entrypoint, args = _run_in_worker, (runs, float64)
    try:
        return elastic_launch(agent_config(nproc), in_a_new_process)(all_forked(nproc), entrypoint, *args)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def agent_config(nproc: int, nodes: int = 1, endpoint: str | None = None, run_id: str | None = None):
    """torch's elastic agent's ``LaunchConfig`` as torchrun makes it, its workers forked and ``--max_restarts 0``.
    One node (no ``endpoint``): ``torchrun --nproc_per_node <nproc> --master_addr 127.0.0.1 --master_port <free>``,
    torchrun's default static rendezvous (a TCPStore on the master port, no rendezvous threads). Several nodes:
    ``torchrun --nnodes <nodes> --nproc_per_node <nproc> --rdzv_backend c10d --rdzv_endpoint <endpoint>``, the
    elastic form clusters use.

    Why one node is not launched with c10d as well: c10d's rendezvous names each of its events through
    ``inspect.stack()``, which is deep under pytest (about 24 s of the suite's CPU went there)."""
    from torch.distributed.launcher.api import LaunchConfig

    static = nodes == 1 and endpoint is None
    return LaunchConfig(
        min_nodes=nodes,
        max_nodes=nodes,
        nproc_per_node=nproc,
        run_id=run_id or uuid.uuid4().hex,
        rdzv_backend="static" if static else "c10d",
        rdzv_endpoint=endpoint or f"127.0.0.1:{free_port()}",
        rdzv_configs={"rank": 0, "timeout": 900} if static else {"timeout": 900},
        max_restarts=0,
        monitor_interval=0.05,
        start_method=start_method(),
    )


def forked(worker, *args, nproc: int = 2) -> None:
    """``worker(rank, *args)`` on ``nproc`` processes forked from this one (torch.multiprocessing, as ``mp.spawn``
    but without each process's interpreter start and imports); the workers set up their own process group. A
    failed worker raises ``ProcessRaisedException`` with its traceback."""
    import torch.multiprocessing as mp

    import_before_forking()

    mp.start_processes(_forked_worker, args=(worker, *args), nprocs=nproc, join=True, start_method=start_method())
