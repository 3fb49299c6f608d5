"""Two machines without and with a shared output directory, as a cluster gives them: two nodes on loopback, each
torch's elastic agent (torchrun's) over one process, joined by c10d rendezvous (gloo): :class:`Node`. Separate
output directories (each node's scratch disk) stop both nodes in one line before any training, within a bounded
time; on a shared one, SIGTERM to one node during a slow step (1 s) stops both after that step with its checkpoint,
and ``--resume`` on two processes continues with the uninterrupted run's losses."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
from helpers.builders import wait_for_log_lines
from helpers.distributed import (
    ForkedProcess,
    agent_config,
    all_forked,
    config,
    free_port,
    in_a_new_process,
    launch,
    losses,
    reference_run,
)


class Node(ForkedProcess):
    """One machine of a two-node job, as torchrun is on it: a process running torch's elastic agent (what
    ``torchrun --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d`` runs) over one worker, both forked (the node from
    this process, the worker from the node: no interpreter start and imports, which took 4 processes x 4-9 s of
    CPU a test). The node's standard error, which its worker shares as under torchrun, goes to a file. SIGTERM to
    the node reaches the agent's handler, which passes it to the worker, as torchrun does."""

    def __init__(self, run_config: dict, endpoint: str, stderr: Path, step_seconds: float, forked_all):
        self.stderr_path = stderr
        super().__init__(_node, run_config, endpoint, step_seconds, forked_all, stderr=stderr)


def _node(run_config: dict, endpoint: str, step_seconds: float, forked_all) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    config = agent_config(1, nodes=2, endpoint=endpoint, run_id="vlbert-test")
    try:
        elastic_launch(config, in_a_new_process)(forked_all, _node_worker, run_config, step_seconds)
    except ChildFailedError:
        return 1
    return 0


def _node_worker(run_config: dict, step_seconds: float) -> None:
    """The node's one process: text pretraining in float64 under the tools' error rule (one ``error:`` line, exit
    1 / 2, 143 after SIGTERM), each optimizer step held ``step_seconds`` longer (a slow step, to be preempted
    during one)."""
    import torch

    from vlbert.commands import run_tool
    from vlbert.recipes import RECIPES, run
    from vlbert.training.hooks import TrainerHook

    torch.set_default_dtype(torch.float64)

    class SlowSteps(TrainerHook):
        """Sleep before each step (a signal handler runs during the sleep, which then goes on: PEP 475)."""

        def before_step(self, trainer) -> None:
            time.sleep(step_seconds)

    sys.exit(run_tool(lambda argv: run(RECIPES["text-pretraining"], run_config, hooks=[SlowSteps()]), []))


def two_nodes(run_configs: list[dict], root: Path, step_seconds: float = 0.0) -> list[Node]:
    """Two nodes (:class:`Node`) joined by c10d rendezvous on 127.0.0.1, node k running ``run_configs[k]``, its
    standard error in ``root/node<k>.stderr``."""
    endpoint, forked_all = f"127.0.0.1:{free_port()}", all_forked(len(run_configs))  # one worker a node
    return [Node(c, endpoint, root / f"node{k}.stderr", step_seconds, forked_all) for k, c in enumerate(run_configs)]


def finish(nodes: list[Node], timeout: float = 180) -> list[tuple[int, str]]:
    return [(n.wait(timeout=timeout), n.stderr_path.read_text()) for n in nodes]


@pytest.mark.slow
@pytest.mark.integration
def test_nodes_without_a_shared_output_directory_stop_in_one_line(small_corpus, tmp_path):
    started = time.time()
    ends = finish(two_nodes([config(small_corpus, tmp_path / f"node{k}" / "run", 4) for k in range(2)], tmp_path))
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
    nodes = two_nodes([config(small_corpus, shared, 4, steps)] * 2, tmp_path, step_seconds=1.0)
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
