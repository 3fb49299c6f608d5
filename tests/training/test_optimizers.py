"""The optimizers of ``training.optimizer``: ``stable_adamw`` is torch-optimi's StableAdamW with the config's
hyperparameters and ModernBERT's fully decoupled weight decay (``decoupled_stableadamw``: ``decouple_lr=True``),
stepping exactly as optimi's own; ``adamw`` stays torch's fused AdamW."""

from __future__ import annotations

import copy

import optimi
import pytest
import torch

from vlbert.training.optimizers import build_optimizer
from vlbert.training.training_config import TrainingConfig, parameter_groups

MODERNBERT = dict(learning_rate=8e-4, adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-6, weight_decay=1e-5)


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))


def set_gradients(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def test_stable_adamw_is_optimis_with_the_configs_hyperparameters():
    config = TrainingConfig(optimizer="stable_adamw", **MODERNBERT)
    model = small_model()
    optimizer = build_optimizer(parameter_groups(model, config.weight_decay), config, torch.device("cpu"))
    assert type(optimizer) is optimi.StableAdamW
    assert not optimizer.defaults.get("fused")  # the trainer checks non-finite steps on the host
    decays = sorted(g["weight_decay"] for g in optimizer.param_groups)
    assert decays == [0.0, 1e-5]  # none on biases and LayerNorm (ModernBERT's filter_bias_norm_wd)
    for group in optimizer.param_groups:
        assert (group["lr"], group["beta1"], group["beta2"], group["eps"]) == (8e-4, 0.9, 0.98, 1e-6)
        assert group["decouple_lr"] is True and group["max_lr"] == 8e-4


def test_a_stable_adamw_step_equals_optimis_own():
    """Three steps (the rate scheduled down, so the fully decoupled decay's lr / max_lr matters) of the built
    optimizer and of optimi.StableAdamW made by hand as ModernBERT's build_optimizer makes it, on copies of the
    same parameters with the same gradients: the same weights, bit for bit."""
    config = TrainingConfig(optimizer="stable_adamw", **{**MODERNBERT, "weight_decay": 0.1})
    ours, theirs = small_model(), small_model()
    theirs.load_state_dict(copy.deepcopy(ours.state_dict()))
    with pytest.warns(UserWarning, match="potentially high"):  # optimi's own warning at weight decay >= 1e-3
        built = build_optimizer(parameter_groups(ours, config.weight_decay), config, torch.device("cpu"))
    groups = [
        {"params": [p for p in theirs.parameters() if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in theirs.parameters() if p.dim() < 2], "weight_decay": 0.0},
    ]
    with pytest.warns(UserWarning, match="potentially high"):
        reference = optimi.StableAdamW(
            groups, lr=8e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1, decouple_lr=True, triton=False
        )
    for step, scale in enumerate((1.0, 0.5, 0.25)):
        for optimizer, model in ((built, ours), (reference, theirs)):
            set_gradients(model, step)
            for group in optimizer.param_groups:
                group["lr"] = 8e-4 * scale
            optimizer.step()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(next(ours.parameters()), small_model()[0].weight)


def test_adamw_stays_torchs_fused_adamw():
    config = TrainingConfig()
    assert config.optimizer == "adamw"
    optimizer = build_optimizer(parameter_groups(small_model(), 0.01), config, torch.device("cpu"))
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["fused"] is True
    assert optimizer.defaults["betas"] == (0.9, 0.999) and optimizer.defaults["eps"] == 1e-6
