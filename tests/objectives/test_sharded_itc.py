"""ITC's state under bf16-params (FSDP2 on a one-rank gloo group, on the CPU): ALBEF's momentum copy is sharded as
the model (float32 shards, gathered in bfloat16 for its forwards), starts from the float32 weights and follows the
float32 shards the optimizer updates; the temperature's clamp reaches the float32 weight after every optimizer step
(inside a forward it reaches only the bfloat16 computing copy). Several processes: tests/objectives/
test_sharded_momentum.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from objectives.test_contrastive import pairs, tiny_vl_model

from vlbert.models.inputs import VLInputs
from vlbert.objectives import OBJECTIVES
from vlbert.objectives.contrastive import TEMPERATURE_RANGE
from vlbert.objectives.momentum import MomentumOptions, attach
from vlbert.training import sharding
from vlbert.training.momentum import MomentumDistillation


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

    assert teacher.sharded and isinstance(teacher.module, FSDPModule)  # sharded as the model, its own FSDP root
    assert {type(m).__name__ for m in teacher.module.modules() if isinstance(m, FSDPModule)} == {
        "FSDPParts",
        "FSDPBertLayer",
    }
    assert all(p.dtype == torch.float32 and hasattr(p, "device_mesh") for p in teacher.module.parameters())
    for name, shadow in zip(teacher.names, teacher.shadow, strict=True):
        assert shadow.dtype == torch.float32 and torch.equal(shadow, weights[name])  # exact, not via bfloat16
    # its forward gathers bfloat16 weights: the features of the model's weights in bfloat16 at the start
    inputs, itc = VLInputs(**pairs(4)), OBJECTIVES["itc"]
    plain = tiny_vl_model().to(torch.bfloat16)  # the model's weights in bfloat16, unsharded
    with torch.no_grad():
        for name, p in plain.named_parameters():
            p.copy_(weights[name].reshape(p.shape))
        features = teacher.run(lambda parts: itc.embed(parts, inputs, {}))
        expected = itc.embed(plain, inputs, {})
    assert all(torch.equal(a, b) for a, b in zip(features, expected, strict=True))
    assert all(hasattr(p, "device_mesh") for p in teacher.module.parameters())  # sharded again after it
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
