"""Two machines without and with a shared output directory, as a cluster gives them: two torchrun launches on
loopback, one process each, joined by c10d rendezvous (gloo). Separate output directories (each node's scratch
disk) stop both nodes in one line before any training, within a bounded time; on a shared one, SIGTERM to one node
during a slow step (1 s) stops both after that step with its checkpoint, and ``--resume`` on two processes continues
with the uninterrupted run's losses."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.builders import wait_for_log_lines
from helpers.distributed import config, env, free_port, launch, losses, reference_run

HERE = Path(__file__).resolve().parent


def two_nodes(run_configs: list[dict], *extra: str, step_seconds: float = 0.0) -> list[subprocess.Popen]:
    """Two torchrun launches (``--nnodes 2``, one process each, c10d rendezvous on 127.0.0.1), node k running
    ``run_configs[k]``."""
    endpoint = f"127.0.0.1:{free_port()}"
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc_per_node",
                "1",
                "--rdzv_backend",
                "c10d",
                "--rdzv_endpoint",
                endpoint,
                "--rdzv_id",
                "vlbert-test",
                "--max_restarts",
                "0",
                str(HERE.parent / "helpers" / "multinode_worker.py"),
                json.dumps(c),
                *extra,
            ],
            env={**env(), "VLBERT_TEST_STEP_SECONDS": str(step_seconds)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in run_configs
    ]


def finish(procs: list[subprocess.Popen], timeout: float = 180) -> list[tuple[int, str]]:
    return [(p.wait(timeout=timeout), p.stderr.read()) for p in procs]


@pytest.mark.slow
@pytest.mark.integration
def test_nodes_without_a_shared_output_directory_stop_in_one_line(small_corpus, tmp_path):
    started = time.time()
    ends = finish(two_nodes([config(small_corpus, tmp_path / f"node{k}" / "run", 4) for k in range(2)]))
    for code, stderr in ends:
        ours = [line for line in stderr.splitlines() if line.startswith("error: ")]
        assert code != 0 and len(ours) == 1 and "must be on storage that every node sees" in ours[0], stderr[-3000:]
    assert time.time() - started < 120
    assert not list(tmp_path.rglob("log.jsonl")) and not list(tmp_path.rglob("checkpoints"))  # never trained


@pytest.mark.slow
@pytest.mark.integration
def test_sigterm_on_one_node_stops_both_after_the_same_step_and_both_resume(small_corpus, tmp_path):
    steps = 4
    reference, shared = tmp_path / "reference", tmp_path / "shared"
    reference_run(config(small_corpus, reference, 8, steps))  # one process at twice the batch = two at 4
    nodes = two_nodes([config(small_corpus, shared, 4, steps)] * 2, step_seconds=1.0)
    wait_for_log_lines(nodes[0], shared / "log.jsonl", 1, timeout=120)
    nodes[1].send_signal(signal.SIGTERM)  # as a cluster preempting one machine: torchrun passes it to its worker
    ends = finish(nodes)
    stopped_at = len(losses(shared))
    assert 1 <= stopped_at < steps, ends
    assert (shared / "checkpoints" / f"step-{stopped_at}" / "training_state.pt").is_file(), ends
    for _, stderr in ends:
        assert f"stopped by SIGTERM after step {stopped_at}" in stderr, stderr[-3000:]
    # The resume on 2 processes of one launch (forked: helpers.distributed.launch); what is particular to two nodes,
    # the preemption of one of them, is above.
    launch([["text-pretraining", config(small_corpus, shared, 4, steps), "resume"]])
    a, b = losses(reference), losses(shared)
    assert sorted(b) == list(range(1, steps + 1))
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-6, (a, b)
