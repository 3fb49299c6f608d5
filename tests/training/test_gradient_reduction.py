"""The float32 gradient all-reduce of bf16-params training overlaps the backward (training/reduction.py): on 2 CPU
processes (gloo) the buckets' all-reduces are launched while the backward still runs, in the same order on every
rank, and the averaged gradient equals the one-shot all-reduce of the whole buffer after the backward bit for bit.
(That 2 processes at batch b train as 1 process at batch 2b with it: tests/test_distributed.py.)"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.builders import write_easy_vqa_shards
from helpers.distributed import forked, launch
from torch import nn

from vlbert.training.master_weights import MasterWeights
from vlbert.training.reduction import gradient_buckets

WIDTH, LAYERS = 32, 8
LAYER_BYTES = (WIDTH * WIDTH + WIDTH) * 4  # one layer's float32 gradient


class Chain(nn.Module):
    """``LAYERS`` tanh layers, a head, and a side head used only where ``side`` is set (an idle parameter)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        self.side = nn.Linear(WIDTH, 1)
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor, side: bool) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        loss = self.head(x).float().pow(2).mean()
        return loss + self.side(x).float().pow(2).mean() if side else loss


def _step(master: MasterWeights, model: Chain, batches, sides, overlap: bool, events: list, declare=False) -> None:
    """One optimizer step's gradient: 2 micro-batches; with ``overlap`` the last one's backward reduces. With
    ``declare``, a micro-batch without the side head keeps it in the graph with weight zero (the trainer's idle
    term) and, with ``overlap``, declares it idle."""
    for micro, (x, side) in enumerate(zip(batches, sides, strict=True)):
        events.append(f"micro-batch {micro}")
        idle = list(model.side.parameters()) if declare and not side else []
        master.begin_backward(reduce=overlap and micro == len(batches) - 1, idle=idle if overlap else ())
        loss = model(x, side) + sum(p.sum() for p in idle) * 0.0
        (loss / len(batches)).backward()
        events.append("backward done")
        master.accumulate_gradients()
    if overlap:
        master.finish_gradients(world_size=2)
    else:  # the reference: the whole buffer in one all-reduce after the last backward
        master.finish_gradients(world_size=1)
        master.all_reduce_gradients(world_size=2)


def _worker(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    events: list = []
    launch = dist.all_reduce

    def recording(tensor, *args, **kwargs):
        events.append(f"all_reduce {tensor.numel()}")
        return launch(tensor, *args, **kwargs)

    dist.all_reduce = recording
    results = {}
    cases = {  # steps of (the side head used in micro-batch 0, 1; declared idle where unused)
        "all used": [((True, True), False)],
        "idle side head": [((True, rank == 1), False)],  # on rank 0, not used in the last micro-batch
        "declared idle": [((True, True), False), ((rank == 1, rank == 1), True)],  # rank 0's step 2: never
    }
    for case, steps in cases.items():
        torch.manual_seed(0)
        model = Chain()
        reference = copy.deepcopy(model)
        master = MasterWeights(model, bucket_bytes=2 * LAYER_BYTES)  # buckets of about 2 layers
        one_shot = MasterWeights(reference, bucket_bytes=2 * LAYER_BYTES)
        # the backward's last gradient, recorded as it is computed (before it is accumulated: MasterWeights' hook)
        model.layers[0].weight.register_hook(lambda grad: events.append("first layer's gradient"))
        generator = torch.Generator().manual_seed(rank)
        equal = []
        for sides, declare in steps:
            batches = [torch.randn(4, WIDTH, generator=generator).bfloat16() for _ in range(2)]
            events.clear()
            _step(master, model, batches, sides, overlap=True, events=events, declare=declare)
            overlapped = list(events)
            _step(one_shot, reference, batches, sides, overlap=False, events=[], declare=declare)
            equal.append(torch.equal(master.grad_buffer, one_shot.grad_buffer))
        present = [[m.grad is not None for m in w.masters] for w in (master, one_shot)]
        results[case] = {
            "events": overlapped,  # of the last step
            "buckets": len(master.buckets),
            "equal": all(equal),
            "grads": present[0] == present[1] or declare,  # a declared idle parameter has none (the trainer's too)
            "changed": bool((one_shot.grad_buffer != 0).any()),
        }
    dist.destroy_process_group()
    Path(out.format(rank=rank)).write_text(json.dumps(results))


@pytest.mark.slow
@pytest.mark.integration
def test_buckets_are_all_reduced_during_the_backward_and_equal_the_one_shot_reduction(tmp_path):
    """2 gloo processes, a model of 8 layers + 2 heads in buckets of 2 layers, 2 micro-batches of different data
    per rank. The first micro-batch reduces nothing; in the last one's backward the buckets are launched in bucket
    order while the backward runs: all but the bucket of the first layer before the first layer's gradient exists
    (the backward's last). The averaged float32 gradient equals the one-shot all-reduce of the whole buffer after the
    backward, bit for bit. With the side head idle on rank 0 in the last micro-batch, its bucket and the ones after
    it go after that rank's backward, the launch sequence stays the same on both ranks and the result exact; declared
    idle (``ObjectiveOutput.unused_parameters``, as the trainer passes them), it holds no bucket back, also in a step
    where it had no gradient at all (its slice, the previous step's sum, is zeroed before it goes)."""
    out = str(tmp_path / "rank{rank}.json")
    forked(_worker, str(tmp_path / "store"), out)
    ranks = [json.loads(Path(out.format(rank=r)).read_text()) for r in range(2)]
    buckets = ranks[0]["all used"]["buckets"]
    assert buckets == LAYERS // 2 + 1  # about 2 layers each (the heads with the last layer)
    for result in ranks:
        for case in result.values():
            assert case["equal"] and case["grads"] and case["changed"], case
        events = result["all used"]["events"]
        last = events.index("micro-batch 1")
        assert not any(e.startswith("all_reduce") for e in events[:last]), events  # nothing before the last one
        launches = [i for i, e in enumerate(events) if e.startswith("all_reduce")]
        assert len(launches) == buckets, events
        first_gradient = events.index("first layer's gradient", last)
        assert sum(i < first_gradient for i in launches) == buckets - 1, events  # overlapped with the backward
        assert events.index("backward done", last) > launches[-1], events  # all launched within the backward
    # the same collectives in the same order on both ranks, whichever rank's backward filled a bucket late
    idle = [[e for e in r["idle side head"]["events"] if e.startswith("all_reduce")] for r in ranks]
    assert idle[0] == idle[1] and len(idle[0]) == buckets, idle
    # declared idle (rank 0's side head, unused in the whole step: its slice zeroed before its bucket goes, not
    # after, which would race the reduction): no bucket waits for it, all go during the backward
    for result in ranks:
        events = result["declared idle"]["events"]
        end = events.index("backward done", events.index("micro-batch 1"))
        assert sum(e.startswith("all_reduce") for e in events[:end]) == buckets, events
    rank0 = ranks[0]["idle side head"]["events"]
    in_backward = rank0[rank0.index("micro-batch 1") : rank0.index("backward done", rank0.index("micro-batch 1"))]
    assert sum(e.startswith("all_reduce") for e in in_backward) < buckets, rank0  # the rest after it


def test_buckets_cover_every_parameter_once_last_parameters_first():
    """DDP's layout: contiguous ranges from the last parameter back, none above the cap except a parameter larger
    than the cap alone; a bad cap is one clear error."""
    numels = [50, 10, 10, 30, 200, 5, 5, 5]
    buckets = gradient_buckets(numels, 40)
    assert [list(b) for b in buckets] == [[5, 6, 7], [4], [2, 3], [1], [0]]
    assert sorted(i for b in buckets for i in b) == list(range(len(numels)))
    with pytest.raises(ValueError, match="bucket_elements"):
        gradient_buckets(numels, 0)


def test_reducing_before_the_last_micro_batch_is_refused():
    """Once the step's all-reduce began, more micro-batches would add into reduced sums: refused, with the fix."""
    model = Chain()
    master = MasterWeights(model)
    master.begin_backward(reduce=True)  # (no process group needed: nothing is launched before a bucket fills)
    with pytest.raises(RuntimeError, match="last micro-batch"):
        master.begin_backward(reduce=True)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Region shards of 16 easy-VQA training images (a tiny detector: 64-pixel input, 6 proposals)."""
    return write_easy_vqa_shards(tmp_path_factory.mktemp("reduction-regions") / "shards", 16)


def _trainer_worker(config: dict, out: str) -> None:
    """One rank of a :func:`helpers.distributed.launch` (its rank, world and rendezvous from the agent)."""
    import os

    from vlbert.recipes import RECIPES, run
    from vlbert.training import reduction

    rank = int(os.environ["RANK"])
    reduction.BUCKET_BYTES = 16 * 2**10  # many buckets in a tiny model
    seen = []  # per last micro-batch: (buckets launched during its backward, buckets)
    accumulate = MasterWeights.accumulate_gradients

    def recording(self):
        if self.reduction is not None:
            seen.append((len(self.reduction.launched), len(self.buckets)))
        return accumulate(self)

    MasterWeights.accumulate_gradients = recording
    run(RECIPES["vl-pretraining"], config)
    Path(out.format(rank=rank)).write_text(json.dumps(seen))


@pytest.mark.slow
@pytest.mark.integration
def test_vl_pretraining_on_two_processes_reduces_every_bucket_during_the_backward(shards, tmp_path):
    """The trainer's bf16-params VL pretraining on 2 gloo processes, 2 micro-batches a step, one objective a step
    (MLM, MRFR, MRC-kl, ITM): the heads of the other objectives get their zero gradient in the backward (the idle
    term), so every bucket is launched before the last micro-batch's backward returns, in every step, on both
    ranks. (A parameter without a gradient would hold its bucket, and every bucket after it, to the end.)"""
    config = {
        "modality": "vl",
        "tokenizer": "minilm",
        "model": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
        "data": {
            "shards": str(shards),
            "max_images": 16,
            "eval_fraction": 0.0,
            "objectives": {"mlm": 1, "mrfr": 1, "mrc_kl": 1, "itm": 1},
        },
        "training": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 6,
            "batch_size": 2,
            "grad_accum_steps": 2,
            "mixed_precision": "bf16-params",
            "learning_rate": 1e-3,
            "warmup_steps": 1,
            "log_every": 1,
            "progress_bar": False,
            "num_workers": 0,
        },
    }
    out = str(tmp_path / "rank{rank}.json")
    launch([], entrypoint=_trainer_worker, args=(config, out))
    for rank in range(2):
        seen = json.loads(Path(out.format(rank=rank)).read_text())
        assert len(seen) == 6 and all(buckets > 10 for _, buckets in seen), seen
        assert all(launched == buckets for launched, buckets in seen), seen
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert len({next(k for k in ("mlm", "mrfr", "mrc_kl", "itm") if k in r) for r in records if "loss" in r}) >= 2
