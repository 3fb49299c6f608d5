"""One trainer for pretraining and fine-tuning: AdamW, warmup + linear decay, clipping, accumulation, bf16 on
CUDA, accelerate for device placement and multi-process, evaluation, logs, checkpoints and exact resume.

The trainer knows nothing about tasks: a model maps a batch dict to an :class:`~vlbert.models.ObjectiveOutput`
whose ``loss`` it minimises and whose ``losses``/``metrics``/``counts`` it logs. Recipe defaults follow BERT
(appendix A.2: Adam, lr 1e-4, beta (0.9, 0.999), weight decay 0.01, linear warmup then linear decay).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from vlbert import checkpoint as ckpt
from vlbert.models.bert import compile_model
from vlbert.training.master_weights import MasterWeights
from vlbert.training.hooks import PeriodicCheckpoint, PeriodicEvaluation, TrainerHook
from vlbert.training.mfu import device_peak_flops, estimate_flops_per_token
from vlbert.training.run_config import dataclass_from_section
from vlbert.utils import gather_objects, keep_freed_memory_in_process

logger = logging.getLogger(__name__)

STATE_NAME = "training_state.pt"
CHECKPOINTS_DIR = "checkpoints"


@dataclass
class TrainingConfig:
    """Optimisation and bookkeeping settings (YAML section ``training``).

    Units: steps are optimizer steps; ``batch_size`` is sequences per process per micro-step, so the global batch
    is batch_size x grad_accum_steps x number of processes.
    """

    output_dir: str = "runs/default"
    max_steps: int = 1000
    batch_size: int = 32
    grad_accum_steps: int = 1
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-6
    warmup_steps: int = 100
    max_grad_norm: float = 1.0
    log_every: int = 10
    eval_every: int = 0  # 0: evaluate at the end only
    save_every: int = 0  # 0: save the final model only
    save_total_limit: int = 2
    seed: int = 0
    mixed_precision: str = "auto"  # auto = bf16-params on CUDA, fp32 on CPU; or "no" / "bf16" / "bf16-params"
    num_workers: int = -1  # -1: auto (loader workers on an accelerator, none on CPU); see loader_options
    on_nonfinite: str = "stop"  # "stop" or "skip" the step
    group_by_length: bool = True
    progress_bar: bool = True
    compile: bool = False  # torch.compile the whole model (for GPUs; measured slower on a 2-core CPU)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field and its valid range."""
        positive = ("max_steps", "batch_size", "grad_accum_steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"training.{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise ValueError(f"training.learning_rate must be positive, got {self.learning_rate}")
        for name in ("weight_decay", "warmup_steps", "max_grad_norm", "log_every", "eval_every", "save_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"training.{name} must be >= 0, got {getattr(self, name)}")
        if self.num_workers < -1:
            raise ValueError(f"training.num_workers must be -1 (auto) or >= 0, got {self.num_workers}")
        if self.mixed_precision not in ("auto", "no", "bf16", "bf16-params"):
            # fp16 would need loss scaling, whose routine overflow steps the non-finite guard would stop on;
            # bf16 has float32's range and needs none. bf16: autocast over float32 weights; bf16-params: bf16
            # weights with float32 masters in the optimizer (vlbert.training.master_weights).
            raise ValueError("training.mixed_precision must be auto, no, bf16 or bf16-params, got "
                             f"{self.mixed_precision!r}")
        if self.on_nonfinite not in ("stop", "skip"):
            raise ValueError(f"training.on_nonfinite must be 'stop' or 'skip', got {self.on_nonfinite!r}")

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
        return {"group_size": 50 if self.group_by_length else 1, "num_workers": self.resolved_num_workers(),
                "batches_per_step": self.grad_accum_steps}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainingConfig":
        """Build and validate from the YAML ``training`` section; raises ``ValueError`` for unknown keys,
        wrong types and out-of-range values."""
        config = dataclass_from_section(cls, values, "training")
        config.validate()
        return config


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay on weight matrices and embeddings, none on biases and LayerNorm (any 1-d tensor)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def linear_schedule(warmup_steps: int, max_steps: int) -> Callable[[int], float]:
    """Learning-rate multiplier: linear warmup from 0 over ``warmup_steps``, then linear decay to 0."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))
    return factor


def set_seed(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and every GPU) random generators."""
    from accelerate.utils import set_seed as accelerate_set_seed

    accelerate_set_seed(seed)


class NonFiniteLossError(FloatingPointError):
    """Raised when the loss or gradient norm is NaN/inf and ``on_nonfinite`` is ``stop``."""


class TrainingPreempted(RuntimeError):
    """Raised by :meth:`Trainer.train` after a SIGTERM (how clusters preempt jobs): the step in progress was
    finished and a checkpoint written (``checkpoint``); ``--resume`` continues with the same per-step losses."""

    def __init__(self, step: int, checkpoint):
        super().__init__(f"stopped by SIGTERM after step {step}; checkpoint written to {checkpoint}. Run the same "
                         "command with --resume to continue")
        self.step, self.checkpoint = step, checkpoint


BatchFactory = Callable[[int, int, int, int], Iterable[dict]]  # (epoch, start_batch, rank, world_size) -> batches


class Trainer:
    """Train ``model`` on batches from ``train_batches``.

    Args:
        model: maps ``**batch`` to an ObjectiveOutput (e.g. BertForPreTraining).
        config: :class:`TrainingConfig`.
        train_batches: ``(epoch, start_batch, rank, world_size) -> iterable of batch dicts`` for that rank,
            deterministic in its arguments (so resume can restart mid-epoch).
        eval_batches: ``(rank, world_size) -> iterable of batch dicts``: this process's share of the held-out
            data (every batch once across the ranks; keywords ``rank`` and ``world_size``), or None.
        run_config: the resolved run configuration, saved as ``config.yaml`` beside every checkpoint.
        tokenizer: saved with every checkpoint.
        hooks: :class:`~vlbert.training.hooks.TrainerHook` s run after the built-in ones (periodic evaluation,
            periodic checkpoints) around every optimizer step.

    The model's side of the contract: ``forward(**batch)`` (batch keys its signature does not name are dropped)
    returns an :class:`~vlbert.models.outputs.ObjectiveOutput` with ``loss`` (minimised), ``losses`` and
    ``metrics`` (logged), ``counts`` (the predictions each averages over: weights across ranks and eval batches)
    and ``unused_parameters``; a model with several objectives names them in ``objectives`` (a tuple of loss
    names) so that multi-process losses are weighted exactly.

    Output directory: ``log.jsonl`` (one JSON line per logged step: step, loss, each objective's loss and
    metric, lr, tokens/s), ``metrics.json`` (final figures), ``tensorboard/``, ``config.yaml``, the final model
    (``config.json`` + ``model.safetensors`` + tokenizer) and ``checkpoints/step-N/`` with training state.
    """

    def __init__(self, model, config: TrainingConfig, train_batches: BatchFactory,
                 eval_batches: Callable[..., Iterable[dict]] | None = None, run_config: dict | None = None,
                 tokenizer=None, hooks: Sequence[TrainerHook] = ()):
        from accelerate import Accelerator

        config.validate()
        self.config = config
        mixed = config.mixed_precision
        if mixed == "auto":  # bf16 weights + float32 masters: the faster GPU step (see master_weights.py)
            mixed = "bf16-params" if torch.cuda.is_available() else "no"
        # DDP with every parameter in every backward (see ObjectiveOutput.unused_parameters); cpu: gloo under torchrun,
        # also where a machine has fewer GPUs than processes (NCCL cannot put two ranks on one GPU).
        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        use_cpu = not torch.cuda.is_available() or torch.cuda.device_count() < local_processes
        if use_cpu and torch.cuda.is_available():
            logger.warning("%d processes on this machine but %d GPU(s): training on CPU (gloo)", local_processes,
                           torch.cuda.device_count())
            mixed = "no" if config.mixed_precision == "auto" else mixed
        self.precision = mixed
        self.accelerator = Accelerator(mixed_precision="no" if mixed == "bf16-params" else mixed, cpu=use_cpu)
        if self.accelerator.device.type == "cpu":
            keep_freed_memory_in_process()  # large activations are reused, not page-faulted in every step
        self.output_dir = Path(config.output_dir)
        self.run_config = run_config or {}
        self.tokenizer = tokenizer
        self.train_batches = train_batches
        self.eval_batches = eval_batches
        self.unwrapped = model
        if config.compile:
            compile_model(model)
        self.forward_arguments = set(inspect.signature(model.forward).parameters)
        # Fused AdamW (one kernel over all parameters) on CUDA and, since torch 2.4, on CPU.
        fused = self.accelerator.device.type in ("cuda", "cpu")
        groups = parameter_groups(model, config.weight_decay)
        self.master = MasterWeights(model) if mixed == "bf16-params" else None
        optimizer = torch.optim.AdamW(
            self.master.groups(groups) if self.master else groups, lr=config.learning_rate,
            betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_epsilon, fused=fused or None)
        # The schedule counts optimizer steps; accelerate's prepared scheduler would advance once per process.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, linear_schedule(config.warmup_steps, config.max_steps))
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        # The fused AdamW skips a step on the device when ``found_inf`` is non-zero (as under AMP's grad scaler),
        # so a non-finite loss needs no host synchronisation in the step.
        self._device_skip = bool(fused)
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.skipped_steps = 0
        self.hooks: list[TrainerHook] = [PeriodicEvaluation(), PeriodicCheckpoint(), *hooks]
        self.last_eval: dict[str, float] = {}
        self._log_file = self._writer = None
        self._checks = _NonFiniteChecks()

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    # ------------------------------------------------------------------ data
    def _to_device(self, batch: dict) -> dict:
        """Move tensors to the device, keeping only what the model's ``forward`` takes (batches may carry
        bookkeeping such as the objective's name or example indices)."""
        device = self.accelerator.device
        return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()
                if k in self.forward_arguments}

    def _train_stream(self):
        """(batch on the device, real tokens and sequences counted on the host copy) for every training batch,
        epoch after epoch."""
        acc = self.accelerator
        epoch, start = self.epoch, self.batch_in_epoch
        while True:
            produced = False
            for i, batch in enumerate(self.train_batches(epoch, start, acc.process_index, acc.num_processes)):
                produced = True
                self.epoch, self.batch_in_epoch = epoch, start + i + 1
                mask = batch.get("attention_mask")
                counted = torch.is_tensor(mask) and mask.device.type == "cpu"
                tokens = int(mask.numpy().sum()) if counted else 0
                yield self._to_device(batch), tokens, mask.shape[0] if counted else 0
            if not produced and start == 0:
                raise ValueError("the training data yields no batch; use a larger corpus or a smaller batch_size")
            epoch, start = epoch + 1, 0
            self.epoch, self.batch_in_epoch = epoch, 0

    # ------------------------------------------------------------------ training
    def train(self, extra_metrics: dict[str, Any] | None = None,
              final_metrics: Callable[[torch.nn.Module], dict[str, Any]] | None = None) -> dict[str, Any]:
        """Run until ``max_steps``; returns the final metrics, also written to metrics.json together with
        ``extra_metrics`` (e.g. a baseline the task computed) and ``final_metrics(model)`` (task-specific
        evaluations of the trained model)."""
        cfg, acc = self.config, self.accelerator
        if self.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._write_run_config(self.output_dir)
        self._writer = self._tensorboard() if self.is_main else None
        self._log_file = open(self.output_dir / "log.jsonl", "a", encoding="utf-8") if self.is_main else None
        stream = self._train_stream()
        bar = None
        if self.is_main and cfg.progress_bar:
            from tqdm.auto import tqdm
            bar = tqdm(total=cfg.max_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True)
        window = _Window()
        start_time, start_step = time.perf_counter(), self.step
        total_tokens = 0
        recent_losses: list[torch.Tensor] = []  # device scalars: read once, at the end
        checks = self._checks = _NonFiniteChecks()
        self.model.train()
        preempted = _SigtermFlag()
        for hook in self.hooks:
            hook.before_train(self)
        try:
            while self.step < cfg.max_steps:
                if self._preemption_requested(preempted):
                    checkpoint = self.save_checkpoint()
                    raise TrainingPreempted(self.step, checkpoint or self.output_dir / CHECKPOINTS_DIR)
                out = None
                sums: dict[str, torch.Tensor] = {}
                idle = None  # parameters idle in every micro-batch of this step
                for micro in range(cfg.grad_accum_steps):
                    waited = time.perf_counter()
                    batch, tokens, sequences = next(stream)
                    window.data_wait += time.perf_counter() - waited
                    window.tokens += tokens
                    window.sequences += sequences
                    if micro == 0:
                        step_epoch = self.epoch
                        checks.position(self.step + 1, self.epoch, self.batch_in_epoch - 1)
                    sync = micro == cfg.grad_accum_steps - 1
                    ctx = contextlib.nullcontext() if sync else acc.no_sync(self.model)
                    with ctx, acc.autocast():
                        out = self.model(**batch)
                        if out.loss is None:
                            raise ValueError("the model returned no loss: the batch carries no labels")
                        backward_loss, global_loss = self._global_loss(out)
                        acc.backward(backward_loss / cfg.grad_accum_steps)
                    for name, value in {"loss": global_loss, **out.losses, **out.metrics}.items():
                        value = value.detach().float()
                        sums[name] = sums[name] + value if name in sums else value
                    ids = {id(p): p for p in getattr(out, "unused_parameters", ())}
                    idle = ids if idle is None else {k: p for k, p in idle.items() if k in ids}
                for p in idle.values():  # zero gradients only there for DDP: the optimizer skips None
                    p.grad = None
                if self.master:  # the step happens on the float32 masters
                    self.master.gradients_to_masters()
                    grad_norm = torch.nn.utils.clip_grad_norm_(self.master.masters, cfg.max_grad_norm) \
                        if cfg.max_grad_norm > 0 else torch.zeros((), device=acc.device)
                else:
                    grad_norm = acc.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm) \
                        if cfg.max_grad_norm > 0 else torch.zeros((), device=acc.device)
                loss = sums["loss"] / cfg.grad_accum_steps
                lr = self.scheduler.get_last_lr()[0]  # the rate this step uses
                # A non-finite step leaves the weights as they were and is otherwise a step like any other (the
                # schedule advances, it is logged, the hooks run), whichever path skips it.
                if self._device_skip:  # no host synchronisation: the optimizer skips on the device
                    bad = checks.record(self.step + 1, loss, grad_norm)
                    self._optimizer().found_inf = bad.float()
                    self.optimizer.step()
                    self._optimizer().found_inf = None
                elif self._finite_on_host(loss, grad_norm, checks):
                    self.optimizer.step()
                if self.master:
                    self.master.masters_to_model()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step += 1
                window.steps += 1
                recent_losses = (recent_losses + [loss])[-50:]
                if bar is not None:
                    bar.update(1)
                if cfg.log_every and self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                    self.check_nonfinite()
                    elapsed = window.elapsed()
                    tokens = self._global_sum(window.tokens)
                    total_tokens += tokens
                    record = {"step": self.step, "epoch": step_epoch}
                    record.update({k: float(v) / cfg.grad_accum_steps for k, v in sums.items()})
                    record.update({"lr": lr, "grad_norm": float(grad_norm), "tokens_per_s": tokens / elapsed,
                                   "step_time_s": elapsed / max(1, window.steps),
                                   "data_wait_fraction": min(1.0, window.data_wait / elapsed)})
                    mfu = self.mfu(tokens, self._global_sum(window.sequences), elapsed)
                    if mfu is not None:
                        record["mfu"] = mfu
                    window = _Window()
                    self.log(record, "train")
                    if bar is not None:
                        bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
                paused = time.perf_counter()  # hooks (evaluation, checkpoints, ...) are not training time
                for hook in self.hooks:
                    hook.after_step(self)
                window.start += time.perf_counter() - paused
            self.check_nonfinite()
            total_tokens += self._global_sum(window.tokens)
        finally:
            preempted.restore()
            if bar is not None:
                bar.close()
            if self._log_file is not None:
                self._log_file.flush()
        last_eval = self.last_eval = self.evaluate() if self.eval_batches is not None else self.last_eval
        if last_eval:
            self.log({"step": self.step, **last_eval}, "eval")
        elapsed = time.perf_counter() - start_time
        recent = torch.stack(recent_losses).cpu() if recent_losses else torch.zeros(0)
        recent = recent[torch.isfinite(recent)]  # skipped steps (training.on_nonfinite=skip) left out
        train_loss = float(recent.mean()) if len(recent) else float("nan")
        metrics = {"step": self.step, "train_loss": train_loss,
                   "train_seconds": elapsed, "train_tokens_per_s": total_tokens / max(elapsed, 1e-9),
                   "steps_this_run": self.step - start_step, "skipped_steps": self.skipped_steps, **last_eval,
                   **(extra_metrics or {})}
        if final_metrics is not None:
            metrics.update(final_metrics(self.unwrapped))
        for hook in self.hooks:
            hook.after_train(self, metrics)
        if self.is_main:
            self.save_model(self.output_dir)
            (self.output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
            self._log_file.close()
            if self._writer is not None:
                self._writer.close()
        acc.wait_for_everyone()
        return metrics

    def _optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer inside accelerate's wrapper."""
        return getattr(self.optimizer, "optimizer", self.optimizer)

    def _finite_on_host(self, loss: torch.Tensor, grad_norm: torch.Tensor, checks: "_NonFiniteChecks") -> bool:
        """For optimizers that cannot skip on the device: read loss and norm now (one synchronisation)."""
        bad = checks.record(self.step + 1, loss, grad_norm)
        if not bool(bad):
            return True
        self.check_nonfinite()  # raises with on_nonfinite=stop
        return False

    def check_nonfinite(self) -> None:
        """Read the device's count of non-finite steps since the last check (a log step, a checkpoint, the end):
        with ``on_nonfinite=stop`` raise :class:`NonFiniteLossError` naming the first such step, its epoch and
        batch (the step itself was skipped on the device, so the weights are those of the step before); with
        ``skip`` add them to ``skipped_steps`` and warn."""
        found = self._checks.read()
        if found is None:
            return
        count, message = found
        if self.config.on_nonfinite == "stop":
            raise NonFiniteLossError(message + ". The last good checkpoint is kept; lower the learning rate or set "
                                     "training.on_nonfinite=skip")
        logger.warning("%s; %d step(s) skipped", message, count)
        self.skipped_steps += count

    def _preemption_requested(self, flag: "_SigtermFlag") -> bool:
        """True once SIGTERM reached any process. One process: a flag read. Several: an all-reduce, done every
        10th step only (an all-reduce is a host synchronisation), so a preempted job stops within 10 steps."""
        if self.accelerator.num_processes == 1:
            return flag.raised
        if self.step % 10:
            return False
        return self._any_rank(flag.raised)

    def _global_loss(self, out) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to backpropagate, the loss over the whole global batch) for one micro-batch.

        One process: both are ``out.loss``. Several: each objective's mean loss is re-weighted by this rank's
        share of the objective's predictions across ranks (e.g. masked tokens), so that DDP's gradient average
        equals the gradient of the mean over every prediction of the global batch, exactly as one process would
        compute it (transformers' ``num_items_in_batch`` fix, applied across ranks). Needs the model's
        ``objectives``; without them, the plain per-rank mean is used.
        """
        acc = self.accelerator
        names = getattr(self.unwrapped, "objectives", ())
        if acc.num_processes == 1 or not names:
            return out.loss, out.loss
        device = out.loss.device
        counts = torch.tensor([float(out.counts.get(n, 0)) for n in names], device=device, dtype=torch.float64)
        sums = torch.stack([out.losses[n].detach().double() * out.counts[n] if n in out.losses
                            else torch.zeros((), device=device, dtype=torch.float64) for n in names])
        totals = acc.reduce(torch.stack([counts, sums]), reduction="sum")
        # Objectives absent from the whole global batch weigh 0 (on the device: no host synchronisation).
        present = totals[0] > 0
        weights = torch.where(present, counts * acc.num_processes / totals[0].clamp(min=1), 0.0).float()
        backward = sum(out.losses[n] * weights[i] for i, n in enumerate(names) if n in out.losses)
        idle = getattr(out, "unused_parameters", ())
        if idle:  # keep idle heads in the graph: DDP expects every parameter in every backward
            backward = backward + sum(p.sum() for p in idle) * 0.0
        global_loss = torch.where(present, totals[1] / totals[0].clamp(min=1), 0.0).sum().float()
        return backward, global_loss

    def mfu(self, tokens: int, sequences: int, seconds: float) -> float | None:
        """Model FLOPs utilisation of ``tokens`` real tokens in ``sequences`` sequences trained in ``seconds``
        (all ranks): :func:`~vlbert.training.mfu.estimate_flops_per_token` at their mean length against the
        device's peak times the number of processes (:func:`~vlbert.training.mfu.device_peak_flops`: the
        datasheet on a known GPU, a measured matmul on a CPU). For vision-language models only the text tokens
        are counted (regions add work the figure leaves out). None for a model without a BERT config."""
        config = getattr(self.unwrapped, "config", None)
        if config is None or not hasattr(config, "intermediate_size") or not tokens or not sequences:
            return None
        peak, _ = device_peak_flops(self.accelerator.device, self.precision in ("bf16", "bf16-params"))
        flops = estimate_flops_per_token(config, tokens / sequences) * tokens
        return flops / seconds / (peak * self.accelerator.num_processes)

    def _any_rank(self, flag: bool) -> bool:
        """True if ``flag`` is set on any process (one all-reduce when there are several)."""
        if self.accelerator.num_processes == 1:
            return flag
        t = torch.tensor([float(flag)], device=self.accelerator.device)
        return bool(self.accelerator.reduce(t, reduction="sum") > 0)

    def _global_sum(self, value: int) -> int:
        if self.accelerator.num_processes == 1:
            return value
        t = torch.tensor([value], device=self.accelerator.device)
        return int(self.accelerator.reduce(t, reduction="sum"))

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Average every objective's loss and metric over the held-out batches (weighted by prediction counts).

        Returns keys ``eval_<objective>_loss`` and ``eval_<metric>`` (e.g. eval_mlm_accuracy), summed over ranks.
        """
        if self.eval_batches is None:
            return {}
        model = self.unwrapped  # no DDP collective in an evaluation forward: ranks may run different counts
        model.eval()
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}
        acc = self.accelerator
        for batch in self.eval_batches(rank=acc.process_index, world_size=acc.num_processes):
            batch = self._to_device(batch)
            with torch.no_grad(), acc.autocast():
                out = model(**batch)
            for name, loss in out.losses.items():
                n = out.counts.get(name, 1)
                sums[f"eval_{name}_loss"] = sums.get(f"eval_{name}_loss", 0.0) + float(loss) * n
                weights[f"eval_{name}_loss"] = weights.get(f"eval_{name}_loss", 0.0) + n
            for name, value in out.metrics.items():
                n = out.counts.get(name, 1)
                sums[f"eval_{name}"] = sums.get(f"eval_{name}", 0.0) + float(value) * n
                weights[f"eval_{name}"] = weights.get(f"eval_{name}", 0.0) + n
        model.train()
        # Each rank evaluated its share of the batches: sum over ranks (a rank may have had none).
        totals: dict[str, list[float]] = {}
        for part_sums, part_weights in gather_objects([(sums, weights)]):
            for k, v in part_sums.items():
                total = totals.setdefault(k, [0.0, 0.0])
                total[0] += v
                total[1] += part_weights[k]
        return {k: s / max(w, 1e-12) for k, (s, w) in sorted(totals.items())}

    # ------------------------------------------------------------------ logging
    def _tensorboard(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is a declared dependency; keep training if it was removed
            logger.warning("tensorboard is not installed (pip install tensorboard); TensorBoard logs are off")
            return None
        return SummaryWriter(str(self.output_dir / "tensorboard"))

    def log(self, record: dict, split: str) -> None:
        """Append ``record`` (with ``step``) as a ``split`` line of log.jsonl and to TensorBoard (main process;
        during :meth:`train`)."""
        if not self.is_main:
            return
        record = {"split": split, **record}
        self._log_file.write(json.dumps(record) + "\n")
        self._log_file.flush()
        if self._writer is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._writer.add_scalar(f"{split}/{k}", v, record["step"])

    def _write_run_config(self, directory: Path) -> None:
        import yaml

        with open(directory / "config.yaml", "w", encoding="utf-8") as f:
            yaml.safe_dump(self.run_config, f, sort_keys=False)

    # ------------------------------------------------------------------ checkpoints
    def save_model(self, directory: Path) -> None:
        """Write the model (Hugging Face layout) + tokenizer + config.yaml into ``directory`` (with bf16
        parameters: the float32 masters)."""
        with self.master.float32_model() if self.master else contextlib.nullcontext():
            self.unwrapped.save_pretrained(directory, tokenizer=self.tokenizer)
        self._write_run_config(directory)

    def training_state(self) -> dict:
        """Everything besides the weights needed to continue exactly: optimizer, scheduler, RNGs, position."""
        state = {
            "step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "skipped_steps": self.skipped_steps,
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "rng_python": list(random.getstate()[1]), "rng_torch": torch.get_rng_state(),
            "rng_numpy": _numpy_rng_state(),
        }
        if torch.cuda.is_available():
            state["rng_cuda"] = torch.cuda.get_rng_state_all()
        return state

    def save_checkpoint(self) -> Path | None:
        """Write ``checkpoints/step-N`` atomically (build in a temporary directory, then rename); keep the
        newest ``save_total_limit``. Only the main process writes."""
        self.accelerator.wait_for_everyone()
        if not self.is_main:
            return None
        root = self.output_dir / CHECKPOINTS_DIR
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step-{self.step}"
        tmp = root / f".tmp-step-{self.step}"
        shutil.rmtree(tmp, ignore_errors=True)
        self.save_model(tmp)
        state = self.training_state()
        torch.save(state, tmp / STATE_NAME)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        checkpoints = sorted(latest_checkpoints(self.output_dir), key=lambda p: int(p.name.split("-")[1]))
        for old in checkpoints[:-self.config.save_total_limit] if self.config.save_total_limit else []:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def resume(self, checkpoint: Path | None = None) -> bool:
        """Load the newest complete checkpoint (or ``checkpoint``); returns False if there is none.

        Also truncates ``log.jsonl`` to the checkpoint's step, so the log continues as if never interrupted.
        """
        if checkpoint is None:
            found = latest_checkpoints(self.output_dir)
            if not found:
                return False
            checkpoint = max(found, key=lambda p: int(p.name.split("-")[1]))

        weights = ckpt.hf_to_vlbert(ckpt.read_state_dict(checkpoint))
        with self.master.float32_model() if self.master else contextlib.nullcontext():  # into the masters
            self.unwrapped.load_converted_state_dict(weights, source=str(checkpoint), strict=True)
        state = torch.load(checkpoint / STATE_NAME, map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.skipped_steps = state.get("skipped_steps", 0)
        random.setstate((3, tuple(state["rng_python"]), None))
        torch.set_rng_state(state["rng_torch"])
        if "rng_numpy" in state:
            _set_numpy_rng_state(state["rng_numpy"])
        if "rng_cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng_cuda"])
        log = self.output_dir / "log.jsonl"
        if self.is_main and log.exists():
            kept = [line for line in log.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= self.step]
            log.write_text("".join(line + "\n" for line in kept))
        logger.info("resumed from %s at step %d", checkpoint, self.step)
        return True


class _Window:
    """Timing of the steps since the last log line: wall time (evaluation and checkpoints excluded), time spent
    waiting for batches, steps and real tokens (counted on the host)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.data_wait = 0.0
        self.steps = 0
        self.tokens = 0
        self.sequences = 0

    def elapsed(self) -> float:
        return max(time.perf_counter() - self.start, 1e-9)


class _NonFiniteChecks:
    """Non-finite steps recorded on the device (no host synchronisation) and read at check time.

    ``record`` returns the step's bad flag (a bool tensor) and keeps the count, the first bad step and its loss and
    gradient norm on the device; ``position`` keeps each step's (epoch, batch) on the host, to name it later.
    """

    def __init__(self):
        self.count = None
        self.first = None  # [step, loss, grad_norm] of the first bad step since the last read; step 0 = none
        self.positions: dict[int, tuple[int, int]] = {}

    def position(self, step: int, epoch: int, batch: int) -> None:
        self.positions[step] = (epoch, batch)

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        loss, grad_norm = loss.detach().float(), grad_norm.detach().float().to(loss.device)
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        if self.count is None:
            self.count = torch.zeros((), dtype=torch.int64, device=loss.device)
            self.first = torch.zeros(3, dtype=torch.float64, device=loss.device)
        self.count += bad
        take = bad & (self.first[0] == 0)
        # Python scalars in torch.where are no host-to-device copies (a copy from pageable memory would wait).
        values = torch.stack([torch.where(take, float(step), self.first[0]),
                              torch.where(take, loss.double(), self.first[1]),
                              torch.where(take, grad_norm.double(), self.first[2])])
        self.first = values
        return bad

    def read(self) -> tuple[int, str] | None:
        """(count, message about the first) if any step since the last read was non-finite; resets."""
        if self.count is None:
            self.positions.clear()
            return None
        count = int(self.count)
        first = self.first.tolist()
        positions, self.positions = self.positions, {}
        self.count = None
        if count == 0:
            return None
        step, loss, grad_norm = int(first[0]), first[1], first[2]
        epoch, batch = positions.get(step, (-1, -1))
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        return count, (f"non-finite {what} at step {step} (epoch {epoch}, batch {batch}): loss={loss}, "
                       f"grad_norm={grad_norm}")


class _SigtermFlag:
    """Catch SIGTERM while training (main thread only): ``raised`` turns True and training stops at the end of
    the step in progress; the previous handler is put back by :meth:`restore`."""

    def __init__(self):
        import signal
        import threading

        self.raised = False
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        logger.warning("SIGTERM received: finishing this step, writing a checkpoint, then stopping")
        self.raised = True

    def restore(self) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def _numpy_rng_state() -> dict:
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos), "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached)}


def _set_numpy_rng_state(state: dict) -> None:
    import numpy as np

    np.random.set_state(("MT19937", state["keys"].numpy().astype("uint32"), state["pos"], state["has_gauss"],
                         state["cached_gaussian"]))


def latest_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints under ``output_dir/checkpoints`` (those with a training state)."""
    root = Path(output_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return [p for p in root.glob("step-*") if (p / STATE_NAME).is_file() and p.name.split("-")[1].isdigit()]


__all__ = ["Trainer", "TrainingConfig", "NonFiniteLossError", "TrainingPreempted", "parameter_groups", "linear_schedule",
           "latest_checkpoints"]
