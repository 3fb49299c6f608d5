"""The optimizer table (``training.optimizer``): a name -> a function building the optimizer over the trainer's
parameter groups from the ``training`` section. A new optimizer is one module with such a function and one line in
:data:`OPTIMIZERS`.

* ``adamw`` (the default): ``torch.optim.AdamW`` (Loshchilov & Hutter 2019), fused on CUDA and CPU. Its weight
  decay is decoupled from the gradient and scaled by the learning rate: each step multiplies a weight by
  ``1 - lr_t x weight_decay``. BERT's recipe (appendix A.2: lr 1e-4, weight decay 0.01).
* ``stable_adamw``: StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale
  vision-language models": AdamW with AdaFactor's update clipping) as torch-optimi implements it
  (``optimi.StableAdamW``), with *fully* decoupled weight decay (``decouple_lr=True``): each step multiplies a
  weight by ``1 - (lr_t / lr) x weight_decay``, so ``weight_decay`` is a rate per step at the peak learning rate,
  independent of it. This is ModernBERT's ``decoupled_stableadamw`` (AnswerDotAI/ModernBERT ``main.py``
  ``build_optimizer``, used by ``yamls/modernbert/modernbert-base-pretrain.yaml``: lr 8e-4, betas (0.9, 0.98),
  eps 1e-6, weight decay 1e-5 with no decay on biases and norms). A given ``weight_decay`` is therefore far
  stronger here than under ``adamw`` (0.01 under ``adamw`` at lr 1e-4 is 1e-6 per step; 0.01 here is 0.01 per
  step, and torch-optimi warns about values of 1e-3 and more).

Both take the groups of :func:`~vlbert.training.training_config.parameter_groups` (no decay on biases and
LayerNorm weights, a group's own ``lr`` where a module asks for one) and ``learning_rate``, ``adam_beta1``,
``adam_beta2``, ``adam_epsilon``, ``weight_decay``. An optimizer whose ``defaults["fused"]`` is true skips a
non-finite step on the device (the trainer sets ``found_inf``); any other is checked on the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from vlbert.training.training_config import TrainingConfig


def adamw(groups: list[dict], config: TrainingConfig, device: torch.device) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` over ``groups``, fused (one kernel over every parameter) on CUDA and, since torch 2.4,
    on CPU; lr-scaled decoupled weight decay (Loshchilov & Hutter 2019)."""
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(
        groups,
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
        weight_decay=config.weight_decay,
        fused=fused or None,
    )


def stable_adamw(groups: list[dict], config: TrainingConfig, device: torch.device) -> torch.optim.Optimizer:
    """torch-optimi's ``StableAdamW`` over ``groups`` with fully decoupled weight decay (``decouple_lr=True``),
    each group's ``max_lr`` its own peak rate (its ``lr``, else ``learning_rate``), as ModernBERT's
    ``decoupled_stableadamw``; torch-optimi chooses its kernel on CUDA (Triton where available), its PyTorch one
    elsewhere.

    Raises:
        ImportError: torch-optimi is not installed (one line naming ``pip install torch-optimi``).
    """
    try:
        from optimi import StableAdamW
    except ImportError as e:
        raise ImportError(
            "training.optimizer: stable_adamw needs torch-optimi; pip install 'torch-optimi>=0.3' (a dependency of "
            "vlbert: reinstall it), or set training.optimizer=adamw"
        ) from e
    groups = [{**g, "max_lr": g.get("lr", config.learning_rate)} for g in groups]
    return StableAdamW(
        groups,
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
        weight_decay=config.weight_decay,
        decouple_lr=True,
        # off CUDA, no Triton: torch-optimi 0.3 decides on Triton over a still empty list of parameters, so it
        # picks its Triton kernels on a CPU wherever triton is importable, and they fail there
        triton=None if device.type == "cuda" else False,
    )


#: ``training.optimizer`` -> ``(parameter groups, training config, device) -> optimizer``
OPTIMIZERS: dict[str, Callable[[list[dict], TrainingConfig, torch.device], torch.optim.Optimizer]] = {
    "adamw": adamw,
    "stable_adamw": stable_adamw,
}


def build_optimizer(groups: list[dict], config: TrainingConfig, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer ``training.optimizer`` names (:data:`OPTIMIZERS`) over ``groups`` on ``device``.

    Raises:
        ValueError: a name not in :data:`OPTIMIZERS` (one line listing them).
    """
    if config.optimizer not in OPTIMIZERS:
        raise ValueError(f"training.optimizer must be one of {sorted(OPTIMIZERS)}, got {config.optimizer!r}")
    return OPTIMIZERS[config.optimizer](groups, config, device)


__all__ = ["OPTIMIZERS", "adamw", "stable_adamw", "build_optimizer"]
