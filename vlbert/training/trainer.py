"""One trainer for pretraining and fine-tuning: ``training.optimizer`` and ``training.schedule`` (AdamW, warmup +
linear decay by default), clipping, accumulation, bf16 on CUDA, accelerate for device placement and multi-process,
evaluation, logs, checkpoints and exact resume.

The trainer knows nothing about tasks: a model maps a batch dict to an :class:`~vlbert.models.ObjectiveOutput`
whose ``loss`` it minimises and whose ``losses``/``metrics``/``counts`` it logs. Recipe defaults follow BERT
(appendix A.2: Adam, lr 1e-4, beta (0.9, 0.999), weight decay 0.01, linear warmup then linear decay).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
import yaml

from vlbert.run_files import CHECKPOINTS_DIR
from vlbert.training import checkpointing, sharding
from vlbert.training.device import check_placement, own_accelerator, prepare_compute, resolve_precision, restore_tf32
from vlbert.training.distributed import global_batch_loss
from vlbert.training.evaluation import evaluate_objectives
from vlbert.training.feed import device_batches, moves_to_device
from vlbert.training.guards import NonFiniteChecks, NonFiniteLossError, SigtermFlag, TrainingPreempted
from vlbert.training.hooks import PeriodicCheckpoint, PeriodicEvaluation, StepStats, TrainerHook
from vlbert.training.idle import IdleParameters
from vlbert.training.log_hook import LogHook
from vlbert.training.mfu import device_peak_flops, estimate_step_flops
from vlbert.training.optimizers import build_optimizer
from vlbert.training.processes import control_plane, start_processes
from vlbert.training.run_directory import record_run_files
from vlbert.training.schedules import build_scheduler, schedule_hooks
from vlbert.training.training_config import TrainingConfig, parameter_groups, seed_process_streams
from vlbert.utils import forward_arguments, keep_freed_memory_in_process

logger = logging.getLogger(__name__)

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
        hooks: :class:`~vlbert.training.hooks.TrainerHook` s run around every optimizer step, after the log line
            and before the periodic evaluation and checkpoint (which therefore hold their state of that step).

    The model's side of the contract: ``forward(**batch)`` (batch keys other than its signature's names and its
    ``label_names`` are dropped; the collator's unpadded ``layout`` is one of its arguments) returns an
    :class:`~vlbert.models.outputs.ObjectiveOutput` with ``loss`` (minimised), ``losses`` and ``metrics`` (logged),
    ``counts`` (the predictions each averages over: weights across ranks and eval batches) and
    ``unused_parameters`` (the modules its ``idle_modules`` declares: kept in DDP's graph with weight zero and
    skipped by the optimizer, :class:`~vlbert.training.idle.IdleParameters`); a model with several objectives names
    them in ``objectives`` (loss names) so that multi-process losses are weighted exactly.

    Output directory: ``log.jsonl`` (one JSON line per logged step: step, loss, each objective's loss and
    metric, lr, tokens/s), ``metrics.json`` (final figures), ``tensorboard/``, ``config.yaml``, the final model
    (``config.json`` + ``model.safetensors`` + tokenizer) and ``checkpoints/step-N/`` with training state.
    """

    def __init__(
        self,
        model,
        config: TrainingConfig,
        train_batches: BatchFactory,
        eval_batches: Callable[..., Iterable[dict]] | None = None,
        run_config: dict | None = None,
        tokenizer=None,
        hooks: Sequence[TrainerHook] = (),
    ):
        config.validate()
        self.config = config
        self.precision, use_cpu = resolve_precision(config.mixed_precision)
        mixed = self.precision
        start_processes(config.collective_timeout)
        self.accelerator = own_accelerator(use_cpu)
        #: this trainer's device, fixed here (accelerate's ``device`` is the process's state, which a later trainer
        #: on another device restarts: :func:`own_accelerator`)
        self.device = self.accelerator.device
        self.control = control_plane(config.collective_timeout)
        if self.device.type == "cpu":
            keep_freed_memory_in_process()  # large activations are reused, not page-faulted in every step
        self.output_dir = Path(config.output_dir)
        self.run_config, self.resumed = run_config or {}, False  # resumed: keeps output_dir's first config.yaml
        self.tokenizer = tokenizer
        self.train_batches = train_batches
        self.eval_batches = eval_batches
        self.unwrapped = model
        # On its device before it is sharded and the optimizer made: they live where the parameters do.
        model.to(self.device)
        self._tf32_replaced = prepare_compute(model, self.device, self.precision, config)  # compile, TF32
        #: bf16-params: FSDP2 holds float32 shards and computes in bf16 (training/sharding.py)
        self.sharded = mixed == "bf16-params"
        if self.sharded:
            sharding.shard_model(model, self.device)
        self.forward_arguments = forward_arguments(model)
        # modules whose weights have a range (ITC's temperature) put them back after every optimizer step
        self._constraints = [m.constrain_parameters for m in model.modules() if hasattr(m, "constrain_parameters")]
        groups = parameter_groups(model, config.weight_decay)
        optimizer = build_optimizer(groups, config, self.device)
        self.scheduler = build_scheduler(optimizer, config)  # counts optimizer steps (vlbert.training.schedules)
        # accelerate wraps a float32 or autocast model in DDP; a sharded one reduces its own gradients
        self.model, self.optimizer = (model, optimizer) if self.sharded else self.accelerator.prepare(model, optimizer)
        seed_process_streams(config.seed, self.accelerator.process_index, self.accelerator.num_processes)
        # The fused AdamW skips a step on the device when ``found_inf`` is non-zero (as under AMP's grad scaler),
        # so a non-finite loss needs no host synchronisation in the step; other optimizers are checked on the host.
        self._device_skip = bool(optimizer.defaults.get("fused"))
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.skipped_steps = 0
        self.log_hook = LogHook()  # first: a step is logged before it is evaluated or checkpointed
        # user hooks before evaluation and checkpoints: a checkpoint holds their state after the same step
        # and the schedule's after the periodic checkpoint (wsd: the end-of-stable checkpoint reuses its step-N)
        self.hooks: list[TrainerHook] = [self.log_hook, *hooks, PeriodicEvaluation(), PeriodicCheckpoint()]
        self.hooks += schedule_hooks(config)
        self.last_eval: dict[str, float] = {}
        self.stats: StepStats | None = None  # the last step's (see run_step)
        self._checks = NonFiniteChecks()
        self._placement_checked = False

    def autocast(self):
        """The context of this trainer's forwards: bf16 autocast for ``mixed_precision: bf16``, else none; its own,
        as accelerate's precision is one per process (:func:`~vlbert.training.device.own_accelerator`)."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    # ------------------------------------------------------------------ data
    def _to_device(self, batch: dict) -> dict:
        """Move tensors to the device, keeping only what the model's ``forward`` takes (batches may carry
        bookkeeping such as the objective's name or example indices)."""
        return {
            k: v.to(self.device, non_blocking=True) if moves_to_device(v) else v for k, v in self._inputs(batch).items()
        }

    def _inputs(self, batch: dict) -> dict:
        """The entries of ``batch`` the model's ``forward`` takes."""
        return {k: v for k, v in batch.items() if k in self.forward_arguments}

    def _train_stream(self):
        """(batch on the device, real text tokens, sequences, real regions) for every training batch, epoch after
        epoch, each sent to the device one batch ahead (:func:`~vlbert.training.feed.device_batches`)."""
        return device_batches(self)

    # ------------------------------------------------------------------ training
    def train(
        self,
        extra_metrics: dict[str, Any] | None = None,
        final_metrics: Callable[[torch.nn.Module], dict[str, Any]] | None = None,
        final_outputs=None,
    ) -> dict[str, Any]:
        """Run until ``max_steps``; returns the final metrics, also written to metrics.json together with
        ``extra_metrics`` (e.g. a baseline the task computed) and ``final_metrics(model)`` (task-specific
        evaluations of the trained model, after the final held-out pass: ``final_outputs``, an object with
        ``update(batch, output)`` and ``finish()``, is given every held-out batch and its output in that pass, so
        that the task's evaluation need not run the model again). Each step: hooks' ``before_step``,
        :meth:`run_step` (which sets :attr:`stats`), hooks' ``after_step`` (logging is one:
        :class:`~vlbert.training.log_hook.LogHook`)."""
        if self.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._write_run_config(self.output_dir)
        stream = self._train_stream()
        start_time, start_step, self._tokens_this_run = time.perf_counter(), self.step, 0
        self._recent_losses: list[torch.Tensor] = []  # device scalars: read once, at the end
        self._checks = NonFiniteChecks()
        self.model.train()
        preempted = SigtermFlag()
        for hook in self.hooks:
            hook.before_train(self)
        if self.is_main:  # config.yaml, and the log and TensorBoard files the log hook opened
            record_run_files(self.output_dir)
        try:
            self._run_steps(stream, preempted)
            return self._finish(
                extra_metrics, final_metrics, final_outputs, time.perf_counter() - start_time, start_step
            )
        finally:
            restore_tf32(self._tf32_replaced)  # the process's own TF32 flags again once the run ends
            self._tf32_replaced = None

    def _run_steps(self, stream, preempted: SigtermFlag) -> None:
        """Steps until ``max_steps``, or until ``preempted`` saw a SIGTERM (a checkpoint, then
        :class:`TrainingPreempted`); then the non-finite check of the run's last losses."""
        try:
            while self.step < self.config.max_steps:
                if self._preemption_requested(preempted):
                    checkpoint = self.save_checkpoint()
                    raise TrainingPreempted(self.step, checkpoint or self.output_dir / CHECKPOINTS_DIR)
                for hook in self.hooks:
                    hook.before_step(self)
                self.stats = self.run_step(stream)
                for hook in self.hooks:
                    hook.after_step(self)
            self.check_nonfinite()
        finally:
            preempted.restore()
            self.log_hook.stop()

    def run_step(self, stream) -> StepStats:
        """One optimizer step over ``grad_accum_steps`` micro-batches from ``stream``: forward, backward, clipping,
        the (device-skippable) AdamW step, the schedule. No host synchronisation. Returns its :class:`StepStats`."""
        cfg, acc, checks = self.config, self.accelerator, self._checks
        started = time.perf_counter()
        stats = StepStats(step=self.step + 1, epoch=self.epoch)
        idle = IdleParameters()  # the model's declared idle parameters, applied under DDP here
        for micro in range(cfg.grad_accum_steps):
            waited = time.perf_counter()
            batch, tokens, sequences, regions = next(stream)
            stats.data_wait += time.perf_counter() - waited
            stats.tokens += tokens
            stats.sequences += sequences
            stats.regions += regions
            if micro == 0:
                stats.epoch = self.epoch
                checks.position(self.step + 1, self.epoch, self.batch_in_epoch - 1)
            # the last micro-batch's backward reduces (DDP: all-reduce; FSDP2: float32 reduce-scatter, which also
            # ends the step's float32 sum of the micro-batches' gradients)
            sync = micro == cfg.grad_accum_steps - 1
            with self._gradient_sync(sync), self.autocast():
                out = self.model(**batch)
                if out.loss is None:
                    raise ValueError("the model returned no loss: the batch carries no labels")
                backward_loss, global_loss = self._global_loss(out)
                backward_loss = idle.add_to_loss(backward_loss, out, acc.num_processes)
                idle.record(out, self.model)  # (before the backward: a sharded model's names are of this forward)
                acc.backward(backward_loss / cfg.grad_accum_steps)
            for name, value in {"loss": global_loss, **out.losses, **out.metrics}.items():
                value = value.detach().float() / cfg.grad_accum_steps
                stats.sums[name] = stats.sums[name] + value if name in stats.sums else value
        idle.drop_gradients(self.model)  # zero gradients only there for DDP: the optimizer skips None
        stats.grad_norm = self._clip_gradients()
        stats.loss, stats.lr = stats.sums["loss"], self.scheduler.get_last_lr()[0]  # the rate this step uses
        # A non-finite step leaves the weights as they were and is otherwise a step like any other (the schedule
        # advances, it is logged, the hooks run), whichever path skips it.
        if self._device_skip:  # no host synchronisation: the optimizer skips on the device
            self._optimizer().found_inf = checks.record(self.step + 1, stats.loss, stats.grad_norm).float()
            self.optimizer.step()
            self._optimizer().found_inf = None
        elif self._finite_on_host(stats.loss, stats.grad_norm, checks):
            self.optimizer.step()
        for constrain in self._constraints:  # the trained (float32, with bf16-params sharded) weights, in place
            constrain()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if not self._placement_checked:  # once the optimizer's state exists; reads devices, copies nothing
            check_placement(self.unwrapped, self.device, self._optimizer())
            self._placement_checked = True
        self._recent_losses = (self._recent_losses + [stats.loss])[-50:]
        self._tokens_this_run += stats.tokens
        stats.seconds = time.perf_counter() - started
        return stats

    def _clip_gradients(self) -> torch.Tensor:
        """Clip to ``max_grad_norm`` (the float32 shards' gradients with bf16 parameters); the norm before
        clipping."""
        cfg, acc = self.config, self.accelerator
        if cfg.max_grad_norm <= 0:
            return torch.zeros((), device=self.device)
        if self.sharded:
            return sharding.clip_grad_norm(list(self.model.parameters()), cfg.max_grad_norm)
        return acc.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)

    def _gradient_sync(self, sync: bool):
        """The context of a micro-batch's forward and backward: whether its backward reduces the gradients across
        the processes (``sync``, the step's last micro-batch) or accumulates them locally."""
        if sync:
            return contextlib.nullcontext()
        if self.sharded:
            return sharding.gradient_sync(self.model, False)
        return self.accelerator.no_sync(self.model)

    def _finish(self, extra_metrics, final_metrics, final_outputs, elapsed: float, start_step: int) -> dict[str, Any]:
        """The final evaluation, metrics.json and the final model (after the hooks' ``after_train``)."""
        last_eval = self.last_eval = self.evaluate(final_outputs) if self.eval_batches is not None else self.last_eval
        if last_eval:
            self.log({"step": self.step, **last_eval}, "eval")
        recent = torch.stack(self._recent_losses).cpu() if self._recent_losses else torch.zeros(0)
        recent = recent[torch.isfinite(recent)]  # skipped steps (training.on_nonfinite=skip) left out
        metrics = {
            "step": self.step,
            "train_loss": float(recent.mean()) if len(recent) else float("nan"),
            "train_seconds": elapsed,
            "train_tokens_per_s": self._global_sum(self._tokens_this_run) / max(elapsed, 1e-9),
            "steps_this_run": self.step - start_step,
            "skipped_steps": self.skipped_steps,
            **last_eval,
            **(extra_metrics or {}),
        }
        if final_metrics is not None:
            with self.whole_weights():
                metrics.update(final_metrics(self.unwrapped))
        for hook in self.hooks:
            hook.after_train(self, metrics)
        weights = self.model_state()  # (collective when sharded: every rank)
        if self.is_main:
            self.save_model(self.output_dir, weights)
            (self.output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
            record_run_files(self.output_dir)
        self.log_hook.close()
        self.accelerator.wait_for_everyone()
        return metrics

    def _optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer inside accelerate's wrapper."""
        return getattr(self.optimizer, "optimizer", self.optimizer)

    def _finite_on_host(self, loss: torch.Tensor, grad_norm: torch.Tensor, checks: NonFiniteChecks) -> bool:
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
            raise NonFiniteLossError(
                message + ". The last good checkpoint is kept; lower the learning rate or set "
                "training.on_nonfinite=skip"
            )
        logger.warning("%s; %d step(s) skipped", message, count)
        self.skipped_steps += count

    def _preemption_requested(self, flag: SigtermFlag) -> bool:
        """True once SIGTERM reached any process, checked between every two steps so that all stop after the same
        one: one process reads its flag; several all-reduce it on the CPU control plane (no GPU synchronisation;
        :class:`~vlbert.training.processes.ControlPlane`)."""
        return self.control.any(flag.raised, "agree on stopping after SIGTERM")

    def _global_loss(self, out) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to backpropagate, the loss over the whole global batch) of one micro-batch
        (:func:`~vlbert.training.distributed.global_batch_loss`)."""
        return global_batch_loss(out, getattr(self.unwrapped, "objectives", ()), self.accelerator)

    def mfu(self, tokens: int, sequences: int, seconds: float, regions: int = 0) -> float | None:
        """Model FLOPs utilisation of ``sequences`` sequences holding ``tokens`` real text tokens and ``regions``
        real regions, trained in ``seconds`` (all ranks): every position the encoder runs counts
        (:func:`~vlbert.training.mfu.estimate_step_flops`, at the mean total length), against the device's peak
        times the number of processes (:func:`~vlbert.training.mfu.device_peak_flops`: the datasheet on a known
        GPU, a measured matmul on a CPU). None for a model without a BERT config."""
        config = getattr(self.unwrapped, "config", None)
        if config is None or not hasattr(config, "intermediate_size") or not (tokens or regions) or not sequences:
            return None
        peak, _ = device_peak_flops(self.device, self.precision in ("bf16", "bf16-params"))
        flops = estimate_step_flops(config, tokens, sequences, regions)
        return flops / seconds / (peak * self.accelerator.num_processes)

    def _any_rank(self, flag: bool) -> bool:
        """True if ``flag`` is set on any process (one all-reduce when there are several)."""
        if self.accelerator.num_processes == 1:
            return flag
        t = torch.tensor([float(flag)], device=self.device)
        return bool(self.accelerator.reduce(t, reduction="sum") > 0)

    def _global_sum(self, value: int) -> int:
        if self.accelerator.num_processes == 1:
            return value
        t = torch.tensor([value], device=self.device)
        return int(self.accelerator.reduce(t, reduction="sum"))

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, outputs=None) -> dict[str, float]:
        """Every objective's loss and metric over the held-out batches, all ranks (see
        :func:`~vlbert.training.evaluation.evaluate_objectives`, which gives ``outputs`` every batch and its
        output); {} without held-out batches."""
        if self.eval_batches is None:
            return {}
        acc = self.accelerator
        batches = self.eval_batches(rank=acc.process_index, world_size=acc.num_processes)
        # the unwrapped model: no DDP collective in an evaluation forward, ranks may run different counts
        with self.whole_weights():
            return evaluate_objectives(self.unwrapped, batches, self.autocast, self._to_device, outputs)

    def whole_weights(self):
        """The context in which the model's forwards need no collective (each rank may run its own number): a
        sharded model's bf16 weights gathered once on entry (every rank enters together,
        :func:`~vlbert.training.sharding.gathered`); nothing to do otherwise."""
        return sharding.gathered(self.unwrapped) if self.sharded else contextlib.nullcontext()

    # ------------------------------------------------------------------ logging
    def log(self, record: dict, split: str) -> None:
        """Append ``record`` (with ``step``) as a ``split`` line of log.jsonl and to TensorBoard (main process;
        during :meth:`train`)."""
        self.log_hook.write(record, split)

    def _write_run_config(self, directory: Path) -> None:
        if not (self.resumed and directory == self.output_dir and (directory / "config.yaml").is_file()):
            with open(directory / "config.yaml", "w", encoding="utf-8") as f:
                yaml.safe_dump(self.run_config, f, sort_keys=False)

    # ------------------------------------------------------------------ checkpoints
    def model_state(self) -> dict[str, torch.Tensor] | None:
        """The weights :meth:`save_model` writes, when the model is sharded: its whole float32 state dict, on the
        main process ({} elsewhere; collective: every rank calls it). None when the model holds them itself."""
        return sharding.full_model_state(self.unwrapped) if self.sharded else None

    def save_model(self, directory: Path, weights: dict[str, torch.Tensor] | None = None) -> None:
        """Write the model (Hugging Face layout) + tokenizer + config.yaml into ``directory``; a sharded model's
        ``weights`` are :meth:`model_state`'s (its float32 shards gathered), gathered here when not given (one
        process)."""
        if weights is None and self.sharded:
            weights = self.model_state()
        # (a model's own weights: no state_dict argument, which a model of another library may not take)
        extra = {} if weights is None else {"state_dict": weights}
        self.unwrapped.save_pretrained(directory, tokenizer=self.tokenizer, **extra)
        self._write_run_config(directory)

    def training_state(self) -> dict:
        """Everything besides the weights needed to continue exactly (:func:`checkpointing.training_state`)."""
        return checkpointing.training_state(self)

    def save_checkpoint(self) -> Path | None:
        """Write ``checkpoints/step-N`` atomically, keep the newest ``save_total_limit`` (main process; see
        :func:`~vlbert.training.checkpointing.save_checkpoint`)."""
        return checkpointing.save_checkpoint(self)

    def resume(self, checkpoint: Path | None = None) -> bool:
        """Load the newest complete checkpoint (or ``checkpoint``); returns False if there is none (see
        :func:`~vlbert.training.checkpointing.resume`)."""
        return checkpointing.resume(self, checkpoint)


__all__ = ["Trainer"]
