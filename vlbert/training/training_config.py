"""The ``training`` section of a run config, the parameter groups and the learning-rate schedule.

Recipe defaults follow BERT (appendix A.2: Adam, lr 1e-4, beta (0.9, 0.999), weight decay 0.01, linear warmup then
linear decay).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
import torch

from vlbert.common.typed_config import Range, check_fields
from vlbert.training.optimizers import OPTIMIZERS
from vlbert.training.run_config import dataclass_from_section
from vlbert.training.schedules import schedule_of


@dataclass
class TrainingConfig:
    """Optimisation and bookkeeping settings (YAML section ``training``).

    Units: steps are optimizer steps; ``batch_size`` is sequences per process per micro-step, so the global batch
    is batch_size x grad_accum_steps x number of processes.
    """

    output_dir: str = "runs/default"
    max_steps: Annotated[int, Range(ge=1)] = 1000
    batch_size: Annotated[int, Range(ge=1)] = 32
    grad_accum_steps: Annotated[int, Range(ge=1)] = 1
    learning_rate: Annotated[float, Range(gt=0)] = 1e-4
    weight_decay: Annotated[float, Range(ge=0)] = 0.01
    adam_beta1: Annotated[float, Range(ge=0, lt=1)] = 0.9
    adam_beta2: Annotated[float, Range(ge=0, lt=1)] = 0.999
    adam_epsilon: Annotated[float, Range(gt=0)] = 1e-6
    warmup_steps: Annotated[int, Range(ge=0)] = 100
    # The 2024-26 encoder recipe as options (docs/configuration.md, "Optimizer, schedule and masking rate").
    # optimizer: a key of vlbert.training.optimizers.OPTIMIZERS: adamw (torch's, lr-scaled decoupled weight decay;
    # BERT) or stable_adamw (torch-optimi's StableAdamW with fully decoupled weight decay: ModernBERT's
    # decoupled_stableadamw, AnswerDotAI/ModernBERT yamls/modernbert/modernbert-base-pretrain.yaml).
    optimizer: str = "adamw"
    # schedule: a key of vlbert.training.schedules.SCHEDULES: linear (warmup, linear decay to 0; BERT) or wsd
    # (warmup-stable-decay, checkpoints/end-of-stable kept; ModernBERT's warmup_stable_decay, vlbert.training.wsd)
    schedule: str = "linear"
    # wsd: the decay's length in steps, or as a fraction of max_steps (give one; neither: 0.1, ModernBERT's
    # default t_decay), its shape (linear as ModernBERT's WSD, or 1-sqrt as its decay run and Hägele et al. 2024)
    # and the multiplier it ends at (ModernBERT's alpha_f)
    decay_steps: Annotated[int, Range(ge=0)] | None = None
    decay_fraction: Annotated[float, Range(ge=0, le=1)] | None = None
    decay_shape: str = "linear"  # a key of vlbert.training.wsd.DECAY_SHAPES
    final_lr_ratio: Annotated[float, Range(ge=0, le=1)] = 0.0
    max_grad_norm: Annotated[float, Range(ge=0)] = 1.0  # 0: no clipping
    log_every: Annotated[int, Range(ge=0)] = 10
    eval_every: Annotated[int, Range(ge=0)] = 0  # 0: evaluate at the end only
    save_every: Annotated[int, Range(ge=0)] = 0  # 0: save the final model only
    save_total_limit: Annotated[int, Range(ge=0)] = 2  # 0: keep every checkpoint
    seed: Annotated[int, Range(ge=0, le=2**32 - 1)] = 0  # numpy's seeds are 32-bit
    # auto = bf16-params on CUDA, fp32 on CPU. fp16 would need loss scaling, whose routine overflow steps the
    # non-finite guard would stop on; bf16 has float32's range and needs none. bf16: autocast over float32 weights;
    # bf16-params: bf16 computation over float32 weights sharded by FSDP2 (vlbert.training.sharding).
    mixed_precision: Literal["auto", "no", "bf16", "bf16-params"] = "auto"
    num_workers: Annotated[int, Range(ge=-1)] = -1  # -1: auto (loader workers on an accelerator, none on CPU)
    on_nonfinite: Literal["stop", "skip"] = "stop"  # "stop" or "skip" the step
    group_by_length: bool = True
    progress_bar: bool = True
    # torch.compile: "auto" = each encoder layer compiled (regional compilation) on CUDA, eager elsewhere (measured
    # slower on a 2-core CPU); true = the layers wherever the run is; "model" = the whole model; false = eager
    compile: bool | Literal["auto", "model", "layers"] = "auto"
    tf32: bool = True  # float32 runs on CUDA: matmuls in TF32 (transformers' tf32 flag); false = full float32
    # seconds a collective between processes may wait before every rank stops (a rank died or hangs; not a hang).
    # Rank 0 preparing data alone (tokenising a corpus, extracting regions) must fit in it.
    collective_timeout: Annotated[float, Range(gt=0)] = 1800.0

    def validate(self) -> None:
        """Check every field's type and range as its annotation says (:func:`vlbert.common.typed_config.check_fields`,
        numbers given as text converted); raise ``ValueError`` naming the bad field, what it got and what it
        takes."""
        check_fields(self, "training")
        self.check_recipe()

    def __post_init__(self) -> None:
        self.check_recipe()

    def check_recipe(self) -> None:
        """Check ``optimizer`` and ``schedule`` against their tables and the schedule's own settings (one line
        naming the key and the fix; :mod:`vlbert.training.optimizers`, :mod:`vlbert.training.schedules`).

        Raises:
            ValueError: an unknown optimizer or schedule; settings the schedule refuses (e.g. WSD's warmup and
                decay longer than ``max_steps``).
        """
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"training.optimizer must be one of {sorted(OPTIMIZERS)}, got {self.optimizer!r}")
        schedule_of(self).check(self)

    def compile_mode(self, device_type: str) -> str | None:
        """What ``compile`` means on a ``device_type`` device: "layers" (regional compilation of the encoder
        layers: :func:`~vlbert.training.device.compile_layers`; ``auto`` on CUDA, or true), "model" (the whole
        model: :func:`~vlbert.models.bert.compile_model`) or None (eager; ``auto`` elsewhere, or false); "?" for a
        value that is none of these. YAML's true/false (and yes/no) arrive as booleans or as "yes"/"no"."""
        value = self.compile if isinstance(self.compile, str) else ("yes" if self.compile else "no")
        value = value.strip().lower()
        if value == "auto":
            return "layers" if device_type == "cuda" else None
        if value in ("yes", "true", "on", "layers"):
            return "layers"
        if value in ("no", "false", "off"):
            return None
        return "model" if value == "model" else "?"

    def resolved_num_workers(self) -> int:
        """``num_workers``, with -1 (auto) resolved: on a CUDA machine, 4 loader processes per training process
        (fewer where the CPUs per process are fewer, keeping one for the training process), so batches are built
        and pinned while the GPU computes; on CPU none, since loader processes would take cores from the step."""
        if self.num_workers >= 0:
            return self.num_workers
        if not torch.cuda.is_available():
            return 0
        per_process = (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        return max(0, min(4, per_process - 1))

    def loader_options(self) -> dict[str, int]:
        """Keyword arguments for :func:`vlbert.data.loading.train_loader` from ``group_by_length``,
        ``num_workers`` (resolved: :meth:`resolved_num_workers`) and ``grad_accum_steps``, so every task honours
        them the same way."""
        return {
            "group_size": 50 if self.group_by_length else 1,
            "num_workers": self.resolved_num_workers(),
            "batches_per_step": self.grad_accum_steps,
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainingConfig":
        """Build from the YAML ``training`` section through the typed reading of config values; raises
        ``ValueError`` for unknown keys, wrong types and out-of-range values (one line naming the key)."""
        return dataclass_from_section(cls, values, "training")


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay on weight matrices and embeddings, none on biases and LayerNorm (any 1-d tensor).
    Parameters with a learning rate of their own (``model.learning_rates()`` of a
    :class:`~vlbert.models.pretrained.PreTrainedModel`: a trainable visual backbone's) get groups with that ``lr``;
    the schedule scales every group alike. Empty groups are left out."""
    own = model.learning_rates() if hasattr(model, "learning_rates") else {}
    groups: dict[tuple[float | None, bool], list] = {}
    for p in model.parameters():
        if p.requires_grad:
            groups.setdefault((own.get(id(p)), p.dim() >= 2), []).append(p)
    out = []
    for (lr, decay), params in groups.items():
        out.append({"params": params, "weight_decay": weight_decay if decay else 0.0, **({"lr": lr} if lr else {})})
    return sorted(out, key=lambda g: ("lr" in g, g["weight_decay"] == 0.0))


def set_seed(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and every GPU) random generators."""
    from accelerate.utils import set_seed as accelerate_set_seed

    accelerate_set_seed(seed)


def process_seed(seed: int, rank: int) -> int:
    """The seed of process ``rank``'s random streams in a run seeded ``seed``: independent streams per process from
    numpy's ``SeedSequence`` spawn keys (the standard way to derive parallel streams from one seed), so that no
    two ranks draw the same dropout masks. A 63-bit int."""
    return int(np.random.SeedSequence(seed, spawn_key=(rank,)).generate_state(1, dtype=np.uint64)[0] >> 1)


def seed_process_streams(seed: int, rank: int, world_size: int) -> None:
    """Give each process of a multi-process run its own torch CPU and CUDA streams (dropout, masking drawn in the
    step), seeded :func:`process_seed`; with one process nothing changes (the run's stream continues from
    :func:`set_seed`). Called once the model exists: its initial weights depend on the seed alone, and DDP
    broadcasts rank 0's anyway. Checkpoints save and restore every rank's streams."""
    if world_size <= 1:
        return
    stream = process_seed(seed, rank)
    torch.manual_seed(stream)  # seeds the CUDA generators too (lazily where CUDA is not yet initialised)


__all__ = ["TrainingConfig", "parameter_groups", "set_seed", "process_seed", "seed_process_streams"]
