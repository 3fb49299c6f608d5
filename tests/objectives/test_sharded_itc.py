"""ITC's state under bf16-params (FSDP2 on a one-rank gloo group, on the CPU): ALBEF's momentum copy is a plain
bfloat16 module built from the whole float32 weights and follows the float32 shards the optimizer updates; the
temperature's clamp reaches the float32 weight after every optimizer step (inside a forward it reaches only the
bfloat16 computing copy); the momentum model with bf16-params on several processes is refused in one line, at the
recipe's start and at the hook's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from objectives.test_contrastive import pairs, tiny_vl_model

from vlbert.objectives.contrastive import TEMPERATURE_RANGE
from vlbert.objectives.momentum import MomentumOptions, attach
from vlbert.training import sharding
from vlbert.training.momentum import MomentumDistillation, check_processes

REFUSAL = "bf16-params on several processes is not supported yet"


def fake_trainer(model, processes: int = 1, sharded: bool = True):
    return SimpleNamespace(
        unwrapped=model, sharded=sharded, step=0, accelerator=SimpleNamespace(num_processes=processes)
    )


def whole_float32(model) -> dict[str, torch.Tensor]:
    """Each parameter's float32 weight (a one-rank DTensor's local tensor), cloned."""
    return {n: p.detach().to_local().clone() for n, p in model.named_parameters()}


def test_the_momentum_copy_of_a_sharded_model_starts_from_its_float32_weights_and_follows_its_shards():
    model = sharding.shard_model(tiny_vl_model(), torch.device("cpu"))
    with torch.no_grad():  # weights that bfloat16 does not hold exactly: the copy must start from these
        for p in model.parameters():
            p.to_local().add_(1e-3 * torch.randn(p.to_local().shape, generator=torch.Generator().manual_seed(1)))
    hook = MomentumDistillation(MomentumOptions(momentum=0.9, queue_size=8, alpha=0.4, mlm_alpha=0.4))
    trainer = fake_trainer(model)
    hook.before_train(trainer)
    teacher, weights = hook.teacher, whole_float32(model)
    from torch.distributed.fsdp import FSDPModule

    assert not [m for m in teacher.module.modules() if isinstance(m, FSDPModule)]  # a plain module, FSDP's hooks gone
    assert not [m for m in teacher.module.modules() if m._forward_pre_hooks or m._forward_hooks]
    assert {p.dtype for p in teacher.module.parameters()} == {torch.bfloat16}
    assert not [p for p in teacher.module.parameters() if hasattr(p, "device_mesh")]
    for name, shadow, p in zip(teacher.names, teacher.shadow, teacher.module.parameters(), strict=True):
        assert shadow.dtype == torch.float32 and torch.equal(shadow, weights[name])  # exact, not via bfloat16
        assert torch.equal(p, weights[name].to(torch.bfloat16))
    # a training step: the sharded model's forward reads the teacher, the optimizer moves the float32 shards
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = model(**pairs(4), itc_content=torch.tensor([1, 2, 3, 4]))
    assert out.loss.isfinite() and teacher.pointer == 4
    out.loss.backward()
    optimizer.step()
    hook.after_step(trainer)
    moved = whole_float32(model)
    assert not torch.equal(moved["itc.text_proj.weight"], weights["itc.text_proj.weight"])  # the step moved it
    for name, shadow in zip(teacher.names, teacher.shadow, strict=True):
        torch.testing.assert_close(shadow, torch.lerp(weights[name], moved[name], 0.1), rtol=0, atol=0)
    # its state (whole float32 weights, 0-d ITC temperature one element as the shard) goes back into a new teacher
    state = hook.state_dict()
    again = MomentumDistillation(hook.options)
    again.load_state_dict(state)
    again.before_train(trainer)
    assert all(torch.equal(a, b) for a, b in zip(again.teacher.shadow, teacher.shadow, strict=True))
    attach(model, None)


def test_the_temperature_clamp_reaches_the_float32_weight_after_each_optimizer_step():
    model = sharding.shard_model(tiny_vl_model(), torch.device("cpu"))
    weight = model.itc.temperature  # float32 DTensor, one element
    with torch.no_grad():
        weight.detach().to_local().fill_(0.9)
    model.train()
    out = model(**pairs(4), itc_content=torch.tensor([1, 2, 3, 4]))  # the forward clamps its bfloat16 copy only
    out.loss.backward()
    assert float(weight.detach().to_local()) == pytest.approx(0.9)
    model.itc.constrain_parameters()  # what the trainer calls after every optimizer step
    assert weight.dtype == torch.float32 and float(weight.detach().to_local()) == TEMPERATURE_RANGE[1]
    with torch.no_grad():
        weight.detach().to_local().fill_(-1.0)
    model.itc.constrain_parameters()
    assert float(weight.detach().to_local()) == pytest.approx(TEMPERATURE_RANGE[0])


def test_momentum_with_bf16_params_on_several_processes_is_refused_in_one_line(monkeypatch):
    check_processes(True, 1)
    check_processes(False, 4)
    with pytest.raises(ValueError, match=REFUSAL) as refused:
        check_processes(True, 2)
    assert "\n" not in str(refused.value) and "training.mixed_precision" in str(refused.value)
    with pytest.raises(ValueError, match=REFUSAL):  # the hook's start (the Trainer used directly)
        MomentumDistillation(MomentumOptions(momentum=0.9)).before_train(fake_trainer(tiny_vl_model(), 2))
    from vlbert.recipes import vl_pretraining

    ctx = SimpleNamespace(data=SimpleNamespace(itc=MomentumOptions(momentum=0.9)), training=SimpleNamespace(seed=0))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    ctx.training.mixed_precision = "bf16-params"
    with pytest.raises(ValueError, match=REFUSAL):  # the recipe's start, before any model is sharded
        vl_pretraining.hooks(ctx, None, None)
    ctx.training.mixed_precision = "bf16"
    assert len(vl_pretraining.hooks(ctx, None, None)) == 1
