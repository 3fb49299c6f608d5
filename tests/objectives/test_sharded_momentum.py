"""ALBEF's momentum model under bf16-params on several processes (FSDP2, 2 gloo processes on the CPU): the teacher
is sharded as the model, each rank moving its float32 shards. Through the same sharded code with float32 as the
computing dtype, 2 processes at batch b give 1 unsharded process at batch 2b's losses, momentum weights and queue
(ITC with queue and soft targets, distilled MLM); in bfloat16 they agree with 1 sharded process to a tenth of
bfloat16's own distance from float32. The momentum weights after N steps are the exponential moving average of the
model's float32 weights after each step, bit for bit. Through the trainer, a 2-process bf16-params run resumed from
its checkpoint gives the uninterrupted run's losses. ALBEF's recipe (configs/vl/albef-regions.yaml) is accepted
with bf16-params on 2 processes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from objectives.test_contrastive import _Reducer, pairs, tiny_vl_model

OPTIONS = {"momentum": 0.8, "queue_size": 12, "alpha": 0.4, "mlm_alpha": 0.4, "alpha_ramp_steps": 2}
STEPS, BATCH = 4, 6  # the global batch: 2 steps fill the queue, the third wraps around
CONTENT = torch.tensor([1, 2, 3, 4, 1, 5])  # a caption of rank 0 (content 1) has an equal-content positive on rank 1


def _batch(step: int, rank: int, world: int) -> dict:
    """This rank's share of step ``step``'s global batch: pairs with ITC contents and MLM labels (two masked
    positions a caption)."""
    batch = pairs(BATCH, seed=step)
    labels = torch.full_like(batch["input_ids"], -100)
    for column in (1, 2):
        labels[:, column] = batch["input_ids"][:, column]
    b = BATCH // world
    share = {k: v[rank * b : (rank + 1) * b] for k, v in {**batch, "labels": labels, "itc_content": CONTENT}.items()}
    return share


def _whole(model) -> dict[str, torch.Tensor]:
    """Each float32 weight of ``model``, whole (gathered where sharded: collective), cloned."""
    from vlbert.training import sharding

    return {n: sharding.full_tensor(p.detach()).clone() for n, p in model.named_parameters()}


def _train(rank: int, world: int, store: str, out: str, sharded: bool, dtype: str) -> None:
    """``STEPS`` training steps of the tiny model (sharded where asked, ``dtype`` its computing dtype) as the
    trainer takes them (global-batch loss, SGD, the temperature's clamp, the hook around each step); rank 0 writes
    the losses, the model's whole weights at the start and after each step, and the teacher's state."""
    import torch.distributed as dist

    from vlbert.objectives.momentum import MomentumOptions
    from vlbert.training import sharding
    from vlbert.training.distributed import global_batch_loss
    from vlbert.training.momentum import MomentumDistillation

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    sharding.COMPUTE_DTYPE = getattr(torch, dtype)  # (read by shard_model and shard_like at each call)
    try:
        model = tiny_vl_model()
        if sharded:
            sharding.shard_model(model, torch.device("cpu"))
        model.train()
        hook = MomentumDistillation(MomentumOptions(**OPTIONS), seed=3)
        trainer = SimpleNamespace(unwrapped=model, sharded=sharded, step=0)
        hook.before_train(trainer)
        record = {"losses": [], "weights": [_whole(model)]}
        for step in range(STEPS):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
            trainer.step = step
            hook.before_step(trainer)
            out_ = model(**_batch(step, rank, world))
            backward, loss = global_batch_loss(out_, model.objectives, _Reducer(world))
            backward.backward()
            optimizer.step()
            optimizer.zero_grad()
            model.itc.constrain_parameters()
            hook.after_step(trainer)
            record["losses"].append(loss.item())
            record["weights"].append(_whole(model))
        teacher = hook.state_dict()
        if rank == 0:
            torch.save({**record, "teacher": teacher}, out)
    finally:
        dist.destroy_process_group()


def _run(tmp_path, name: str, world: int, sharded: bool, dtype: str = "bfloat16") -> dict:
    from helpers.distributed import forked

    out = tmp_path / f"{name}.pt"
    forked(_train, world, str(tmp_path / f"{name}.store"), str(out), sharded, dtype, nproc=world)
    return torch.load(out, weights_only=True)


def _close(a: dict, b: dict, atol: float) -> None:
    assert set(a) == set(b)
    for name in a:
        torch.testing.assert_close(a[name].reshape(b[name].shape), b[name], rtol=0, atol=atol, msg=name)


def _check_ema(run: dict) -> None:
    """The teacher's weights are the EMA of the model's after each step, from its start, bit for bit."""
    decay = OPTIONS["momentum"]
    expected = dict(run["weights"][0])
    for weights in run["weights"][1:]:
        expected = {n: torch.lerp(m, weights[n], 1.0 - decay) for n, m in expected.items()}
    shadow = run["teacher"]["shadow"]
    assert run["teacher"]["updates"] == STEPS and len(shadow) > 20
    _close(shadow, {n: expected[n] for n in shadow}, atol=0)


@pytest.mark.slow
@pytest.mark.integration
def test_two_sharded_processes_with_momentum_equal_one_in_float32_and_track_it_in_bf16(tmp_path):
    reference = _run(tmp_path, "reference", 1, sharded=False)
    two = _run(tmp_path, "two", 2, sharded=True, dtype="float32")
    assert two["losses"][0] == reference["losses"][0]  # the same float32 weights, the same loss
    # then the ranks' reduced gradients round differently from one batch's: float32's few units in the last place
    assert max(abs(a - b) / b for a, b in zip(two["losses"], reference["losses"], strict=True)) <= 1e-6, (
        two["losses"],
        reference["losses"],
    )
    _close(two["teacher"]["shadow"], reference["teacher"]["shadow"], atol=1e-6)
    for key, queue in reference["teacher"]["queues"].items():
        torch.testing.assert_close(two["teacher"]["queues"][key], queue, rtol=0, atol=1e-6, msg=key)
    assert two["teacher"]["pointer"] == reference["teacher"]["pointer"] == (STEPS * BATCH) % OPTIONS["queue_size"]
    moved = two["teacher"]["shadow"]["itc.text_proj.weight"] - two["weights"][0]["itc.text_proj.weight"]
    assert moved.abs().max() > 1e-3  # the momentum weights did move
    _check_ema(two)
    # bfloat16: the ranks' smaller batches round differently (ITC's temperature of 0.07 magnifies the momentum
    # features' rounding in the soft targets): 2 processes agree with 1 (both sharded) to a tenth of how far
    # bfloat16 is from float32 on the same steps
    one = _run(tmp_path, "one-bf16", 1, sharded=True)
    two = _run(tmp_path, "two-bf16", 2, sharded=True)
    assert two["losses"][0] == one["losses"][0]

    def gap(a: list, b: list) -> float:
        return max(abs(x - y) for x, y in zip(a, b, strict=True))

    bf16_error = gap(one["losses"], reference["losses"])
    assert 1e-3 < bf16_error < 0.1 and gap(two["losses"], one["losses"]) <= bf16_error / 10, (
        two["losses"],
        one["losses"],
        reference["losses"],
    )
    _check_ema(two)


def test_albefs_recipe_is_accepted_with_bf16_params_on_two_processes(monkeypatch):
    """configs/vl/albef-regions.yaml's sections validate and its momentum hook is made with bf16-params under a
    2-process launch (no longer refused)."""
    from helpers.builders import ROOT

    from vlbert.recipes import vl_pretraining
    from vlbert.training.momentum import MomentumDistillation
    from vlbert.training.run_config import dataclass_from_section, load_run_config
    from vlbert.training.trainer import TrainingConfig

    config = load_run_config(ROOT / "configs" / "vl" / "albef-regions.yaml")
    config["training"]["mixed_precision"] = "bf16-params"
    training = TrainingConfig.from_dict(config["training"])
    training.validate()
    data = dataclass_from_section(vl_pretraining.VLDataConfig, config["data"], "data")
    assert data.itc.enabled and data.itc.queue_size == 65536
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    hooks = vl_pretraining.hooks(SimpleNamespace(data=data, training=training), None, None)
    assert [type(h) for h in hooks] == [MomentumDistillation]


@pytest.mark.slow
@pytest.mark.integration
def test_a_two_process_bf16_params_run_with_momentum_resumes_to_the_same_losses(tmp_path):
    """Through the trainer (tools' recipe, 2 launched processes, bf16-params): the checkpoint of step 2 holds the
    whole momentum weights and the queue (gathered from the shards), and a run resumed from it on 2 processes gives
    the uninterrupted run's losses for steps 3 and 4."""

    from helpers.builders import write_easy_vqa_shards
    from helpers.distributed import launch, losses, stopped_copy
    from objectives.test_momentum import momentum_run_config

    def run_config(out):
        config = momentum_run_config(shards, out)
        config["training"].update(max_steps=4, batch_size=2, mixed_precision="bf16-params")
        return config

    shards = write_easy_vqa_shards(tmp_path / "shards", 24)
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    launch([["vl-pretraining", run_config(whole)]])
    state = torch.load(whole / "checkpoints" / "step-2" / "training_state.pt", weights_only=False)
    hook = next(v for k, v in state["hooks"].items() if k.endswith("MomentumDistillation"))
    assert hook["updates"] == 2 and hook["shadow"]["bert.embeddings.word_embeddings.weight"].shape[1] == 32
    stopped_copy(whole, stopped, 2, 3)
    launch([["vl-pretraining", run_config(stopped), "resume"]])
    a, b = losses(whole), losses(stopped)
    assert sorted(b) == [1, 2, 3, 4] and max(abs(a[s] - b[s]) for s in a) <= 1e-6, (a, b)
