"""Zero host waits on the fake GPU at two processes (issues 65 and 66): every recipe's default run as rank 0 of two.

Each test runs what tests/gpu/test_gpu_trainer.py and tests/gpu/test_recipe_waits.py run at one process, inside
:class:`fake_cuda.FakeCuda` and :func:`fake_processes.fake_processes` (torch's fake process group, world size 2, the
launcher's environment): the trainer takes its several-process path as under ``accelerate launch`` (FSDP2 over two
ranks, the distributed sampler, the losses weighted across ranks, ITC's and ITM's gathers of the global batch), and
steps 2 and 3 are asserted as at one process (:func:`test_recipe_waits.assert_no_wait`): no host synchronisation,
nothing read back, no blocking host-to-device copy, every batch sent ahead on a side stream.
"""

from __future__ import annotations

import pytest
import test_gpu_trainer
import test_recipe_waits
import torch
from helpers.fake_cuda import FakeCuda
from helpers.fake_processes import fake_processes
from test_gpu_trainer import TWO_STREAM, Probe, _Stop, finetuning_config, text_config, vl_config
from test_recipe_waits import assert_no_wait

from vlbert.recipes import RECIPES, run
from vlbert.utils import all_gather_padded

#: the fixtures of tests/gpu/test_gpu_trainer.py (module-scoped: set up once here too)
region_shards, tiny_bert = test_gpu_trainer.region_shards, test_gpu_trainer.tiny_bert


def run_at_two_processes(recipe: str, config: dict) -> tuple[Probe, FakeCuda]:
    """``recipe``'s run of ``config`` as rank 0 of two processes on the fake GPU, stopped after step 3 (steps 2
    and 3 recorded). A run that fails otherwise fails the test with the host waits recorded before (a value the host
    read from the fake GPU is a stand-in, 0, which can break the run after the wait: a size read back)."""
    with FakeCuda() as gpu, fake_processes(2):
        probe = Probe(gpu)
        try:
            run(RECIPES[recipe], config, hooks=[probe])
        except _Stop:
            return probe, gpu
        except Exception as error:
            waits = "\n".join((gpu.host_syncs + gpu.device_to_host)[-8:])
            raise AssertionError(
                f"the run failed ({error!r:.160}) after these host waits (the last 8):\n{waits}"
            ) from error
    raise AssertionError("the run did not stop after step 3")


def assert_no_wait_at_two(probe: Probe, gpu: FakeCuda, flash: bool = True) -> None:
    """:func:`test_recipe_waits.assert_no_wait`, and the one host-to-device copy a step makes outside the feed at
    several processes: the counts that weight each objective's loss across ranks
    (vlbert/training/distributed.py ``device_counts``), one pinned copy per micro-batch the host does not wait for,
    on the compute stream (what it needs is on the host only once the batch is collated)."""
    counts = [c for c in gpu.host_to_device if c.line.endswith(" device_counts")]
    assert counts and all(not c.blocking and c.line.startswith("vlbert/training/distributed.py") for c in counts)
    gpu.host_to_device[:] = [c for c in gpu.host_to_device if not c.line.endswith(" device_counts")]
    assert_no_wait(probe, gpu, flash)


def _vl(tmp_path, shards, objectives: dict, negatives: str | None = None, **model) -> dict:
    config = vl_config(tmp_path / "run", shards, 1, **model)
    config["data"]["objectives"] = objectives
    if negatives:
        config["data"]["itm_negatives"] = negatives
    return config


#: (objectives, itm_negatives, model, flash, searchsorted ops in steps 2 and 3: the draws of the negatives)
PRETRAINING = {
    "vl-default": ({"mlm": 1, "mrfr": 1, "mrc_kl": 1, "itm": 1}, None, {}, True, 0),
    "itm-hard": ({"itm": 1}, "hard", {}, False, 2),
    "lxmert-itm-hard": ({"itm": 1}, "hard", TWO_STREAM, False, 2),
    "itc": ({"itc": 1}, None, {}, True, 0),
    "itm-itc-mined": ({"itc": 0.001, "itm": 1}, "itc", {}, False, 4),
}


@pytest.mark.parametrize("case", list(PRETRAINING))
def test_vl_pretraining_at_two_processes_makes_the_host_wait_for_nothing(case, region_shards, tmp_path):
    """VL pretraining at two processes: the default mix; ITM on hard negatives drawn from the global batch (both
    ranks' captions gathered, single- and two-stream); ITC over the global batch's columns; ITM on ITC-mined
    negatives (3b rows, images and captions drawn from the gathered global batch). On 07caafa the hard and mined
    negatives read every rank's row count and lengths on the host (vlbert/utils.py all_gather_padded)."""
    objectives, negatives, model, flash, draws = PRETRAINING[case]
    probe, gpu = run_at_two_processes("vl-pretraining", _vl(tmp_path, region_shards, objectives, negatives, **model))
    assert_no_wait_at_two(probe, gpu, flash)
    assert gpu.ops["aten.searchsorted"] == draws, dict(gpu.ops)
    assert gpu.ops["c10d._reduce_scatter_base_"] > 0, dict(gpu.ops)  # FSDP2 over two ranks


def test_itc_with_momentum_and_queue_at_two_processes_makes_the_host_wait_for_nothing(region_shards, tmp_path):
    """ITC with ALBEF's momentum model and queue at two processes: the momentum copy sharded over both ranks as
    the model (its forwards all-gather bf16 weights, its update one foreach lerp of this rank's float32 shards),
    the queue written with the gathered global batch's features at rows chosen on the device."""
    config = _vl(tmp_path, region_shards, {"itc": 1})
    config["data"]["itc"] = {"momentum": 0.995, "queue_size": 16, "alpha": 0.4, "alpha_ramp_steps": 2}
    probe, gpu = run_at_two_processes("vl-pretraining", config)
    assert_no_wait_at_two(probe, gpu)
    assert gpu.ops["aten._foreach_lerp_"] == 2 and gpu.ops["aten.index_copy_"] == 3 * 2, dict(gpu.ops)
    assert gpu.ops["c10d._reduce_scatter_base_"] > 0, dict(gpu.ops)


def test_text_pretraining_at_two_processes_makes_the_host_wait_for_nothing(small_corpus, tmp_path):
    probe, gpu = run_at_two_processes("text-pretraining", text_config(tmp_path / "run", small_corpus, 2))
    assert_no_wait_at_two(probe, gpu)


def _finetuning(task: str, shards, init, tmp_path) -> tuple[str, dict]:
    """(recipe, config) of ``task``'s default run from ``init`` (GQA: the VQA recipe on GQA's questions)."""
    if task == "refcoco":
        return task, test_recipe_waits.refcoco_config(tmp_path / "run", init, tmp_path)
    config = finetuning_config("vqa" if task in ("nlvr2", "gqa") else task, tmp_path / "run", init, shards, tmp_path)
    if task == "nlvr2":
        config["task"] = "nlvr2"
        return task, test_recipe_waits._nlvr2(config, shards, tmp_path)
    if task == "gqa":
        return "vqa", test_recipe_waits._gqa(config, shards, tmp_path)
    return task, config


@pytest.mark.parametrize("task", ["text", "vqa", "gqa", "retrieval", "nlvr2", "snli-ve", "refcoco"])
def test_a_finetuning_step_at_two_processes_makes_the_host_wait_for_nothing(task, region_shards, tiny_bert, tmp_path):
    """Every fine-tuning recipe's default run at two processes (bf16 weights sharded over both, flash attention):
    steps 2 and 3 wait on nothing."""
    recipe, config = _finetuning(task, region_shards, tiny_bert, tmp_path)
    probe, gpu = run_at_two_processes(recipe, config)
    assert_no_wait_at_two(probe, gpu)


def test_the_global_batch_gather_reads_no_size_and_masks_a_short_batch():
    """:func:`~vlbert.utils.all_gather_padded` at two processes on the fake GPU, this rank holding a last batch of
    3 rows (of 4) and texts of 5 positions (of 8): the gathered tensors have the bounds' shapes, the validity mask
    is gathered on the device, and nothing is read back (07caafa: a blocking copy of the row count, then accelerate's
    pad_across_processes read every rank's sizes)."""
    with FakeCuda() as gpu, fake_processes(2):
        ids = torch.ones(3, 5, dtype=torch.long, device="cuda")
        text = torch.ones(3, 16, device="cuda")
        gpu.clear()
        (all_ids, all_text), valid = all_gather_padded([ids, text], 4, [8, None])
    assert (all_ids.shape, all_text.shape, valid.shape, valid.dtype) == ((8, 8), (8, 16), (8,), torch.bool)
    assert gpu.host_syncs == [] and gpu.device_to_host == [] and gpu.host_to_device == [], (
        gpu.host_syncs + gpu.device_to_host + [c.line for c in gpu.host_to_device]
    )
    assert gpu.ops["c10d.allgather_"] == 3, dict(gpu.ops)
