"""The trainer's hold on its device: its own accelerate state (:func:`own_accelerator`), TF32 for float32 matmuls
on CUDA (:func:`use_tf32`) and the regional compilation of the encoder layers (:func:`compile_layers`)."""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from vlbert.models.bert import BertLayer, compile_model
from vlbert.training.processes import launched_processes, use_cpu_processes

logger = logging.getLogger(__name__)


def resolve_precision(mixed_precision: str) -> tuple[str, bool]:
    """(the precision a run trains in, whether it trains on CPU processes) for ``training.mixed_precision``:
    ``auto`` is bf16 weights with float32 shards on CUDA (the faster GPU step: sharding.py), float32 on CPU.
    On CPU under torchrun also where a machine has fewer GPUs than processes (NCCL cannot put two ranks on one GPU;
    gloo can: :func:`~vlbert.training.processes.use_cpu_processes`), said in one warning."""
    mixed = mixed_precision
    if mixed == "auto":
        mixed = "bf16-params" if torch.cuda.is_available() else "no"
    use_cpu = use_cpu_processes()
    if use_cpu and torch.cuda.is_available():
        logger.warning(
            "%s processes on this machine but %d GPU(s): training on CPU (gloo)",
            os.environ.get("LOCAL_WORLD_SIZE"),
            torch.cuda.device_count(),
        )
        mixed = "no" if mixed_precision == "auto" else mixed
    return mixed, use_cpu


def prepare_compute(model: nn.Module, device: torch.device, precision: str, config) -> tuple[str, bool] | None:
    """Before the optimizer is made: ``training.compile`` (:meth:`~vlbert.training.training_config.TrainingConfig.
    compile_mode`: the encoder layers (:func:`compile_layers`), the whole model
    (:func:`~vlbert.models.bert.compile_model`) or nothing) and ``training.tf32`` (:func:`use_tf32`; returns the
    flags it replaced, for :func:`restore_tf32`)."""
    mode = config.compile_mode(device.type)
    if mode == "model":
        compile_model(model)
    elif mode == "layers":
        compile_layers(model)
    return use_tf32(device, precision, config.tf32)


def own_accelerator(cpu: bool):
    """An accelerate ``Accelerator`` for one Trainer (device placement, DDP, ``no_sync``, process state) whose
    state never decides the trainer's precision, so that trainers of any precisions follow each other (or live side
    by side) in one process.

    accelerate keeps one ``AcceleratorState`` per process, fixed by the first ``Accelerator``: a second one with
    another ``mixed_precision`` raises ``ValueError: AcceleratorState has already been initialized`` (accelerate
    1.x ``state.py``, ``AcceleratorState._check_initialized``), and ``cpu=True`` after a GPU state does too. So the
    Accelerator is always made with ``mixed_precision="no"`` (the trainer applies its own bf16 autocast:
    :meth:`Trainer.autocast`), and in a single process (no process group, nothing else to keep) a state that
    another run left on another device (a GPU run before a CPU one, or the reverse) is started afresh for this
    trainer's device: CUDA when it is available and ``cpu`` is False, else the CPU. Under a launcher the process
    group and its device are the process's for its lifetime and are kept. A state another ``Accelerator`` made
    with a mixed precision (user code, ``ACCELERATE_MIXED_PRECISION``) is replaced by this one's, the process
    state kept.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState

    state = PartialState._shared_state
    if state and launched_processes() == 1:  # (a one-rank process group of bf16-params' is no launcher's)
        wanted = "cuda" if torch.cuda.is_available() and not cpu else "cpu"
        device = state.get("device")
        if device is None or device.type != wanted:
            AcceleratorState._reset_state(reset_partial_state=True)
    if AcceleratorState._shared_state.get("_mixed_precision", "no") != "no":  # another library's Accelerator
        AcceleratorState._reset_state()  # the process state (devices, process group) is kept
    return Accelerator(mixed_precision="no", cpu=cpu)


def use_tf32(device: torch.device, precision: str, enabled: bool = True) -> tuple[str, bool] | None:
    """Let float32 matmuls and convolutions on CUDA run on the tensor cores in TF32 (10-bit mantissa inputs, float32
    accumulation), as transformers' ``tf32`` training flag does (``torch.backends.cuda.matmul.allow_tf32``, here
    through ``torch.set_float32_matmul_precision("high")``, and ``torch.backends.cudnn.allow_tf32``), or keep them
    in full float32 (``"highest"``, cuDNN's TF32 off) when not ``enabled`` (``training.tf32: false``): for a
    float32 run (``precision`` ``no``) on a CUDA ``device``, set either way, so that a run never inherits another
    run's choice in the same process. Its MFU is reported against the TF32 peak
    (:func:`~vlbert.training.mfu.device_peak_flops`); without TF32 an H100 runs float32 matmuls at about 1/15 of it.
    Process-wide, as torch's flags are: :func:`restore_tf32` puts back what it replaced when the run ends.

    Returns:
        the flags it replaced, (matmul precision, cuDNN's ``allow_tf32``), or None where it changed nothing (a bf16
        run, a CPU run).
    """
    if not (device.type == "cuda" and precision == "no"):
        return None
    replaced = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = bool(enabled)
    return replaced


def restore_tf32(replaced: tuple[str, bool] | None) -> None:
    """Put back the flags :func:`use_tf32` replaced (nothing for None)."""
    if replaced is not None:
        torch.set_float32_matmul_precision(replaced[0])
        torch.backends.cudnn.allow_tf32 = replaced[1]


def check_placement(model: nn.Module, device: torch.device, optimizer: torch.optim.Optimizer) -> None:
    """Raise RuntimeError if a parameter of ``model``, its gradient or an optimizer state is not on the training
    ``device`` (the trainer calls it after its first step; devices are read, nothing copied). A scalar CPU step
    counter is no copy and is allowed."""
    errors = [f"parameter {n} on {p.device}" for n, p in model.named_parameters() if p.device.type != device.type]
    for i, p in enumerate(q for group in optimizer.param_groups for q in group["params"]):
        for what, t in (
            ("gradient", p.grad),
            *((f"optimizer state {k}", v) for k, v in optimizer.state.get(p, {}).items()),
        ):
            if torch.is_tensor(t) and t.device.type != device.type and not (t.dim() == 0 and t.device.type == "cpu"):
                errors.append(f"{what} of parameter {i} {tuple(p.shape)} on {t.device}")
    if errors:
        raise RuntimeError(
            f"training on {device}, but: "
            + "; ".join(errors[:5])
            + (f" (and {len(errors) - 5} more)" if len(errors) > 5 else "")
            + ": a bug in the trainer's placement, please report it"
        )


def compiled_layer_classes() -> tuple[type, ...]:
    """The encoder layers :func:`compile_layers` compiles: BERT's :class:`~vlbert.models.bert.BertLayer`, which
    every encoder repeats (LXMERT's language, object and cross-modality layers included; its cross-attention stays
    eager: a compiled module inside a compiled one would be traced twice)."""
    return (BertLayer,)


def compile_errors() -> tuple[type[Exception], ...]:
    """What a failed compilation raises (dynamo's refusals, a backend or inductor failing): torch 2.14
    ``torch/_dynamo/exc.py`` (``Unsupported``, ``BackendCompilerFailed`` and ``torch._inductor.exc.InductorError``
    derive from ``TorchDynamoException``). Read when a compiled call fails: importing torch._dynamo costs 2 s,
    which a run that compiles nothing (and every ``vlbert`` command's start) need not pay."""
    import torch._dynamo.exc

    return (torch._dynamo.exc.TorchDynamoException,)


def compile_layers(model: nn.Module, **options) -> list[nn.Module]:
    """Regional compilation: ``torch.compile`` each encoder layer of ``model`` in place (``nn.Module.compile``,
    dynamic shapes: the unpadded length changes every batch; parameter names and checkpoints unchanged), as
    torch's regional-compilation recipe does for repeated blocks: every layer has the same code, so dynamo traces
    one and reuses it, and compile time stays that of one layer instead of the whole model. Inductor fuses inside
    each layer (bias + GELU, dropout + residual + LayerNorm). ``options`` go to ``torch.compile``.

    Compilation happens at a layer's first call; if it fails (:func:`compile_errors`) every layer goes back to eager
    with one warning and the call is run eagerly, so a machine without a working compiler trains as without
    ``training.compile``. Returns the compiled layers."""
    layers = [m for m in model.modules() if isinstance(m, compiled_layer_classes())]
    state = {"failed": False}
    for layer in layers:
        layer.compile(**{"dynamic": True, **options})
        layer._compiled_call_impl = _falling_back(layer._compiled_call_impl, layer, layers, state)
    return layers


def _falling_back(compiled, layer: nn.Module, layers: list[nn.Module], state: dict):
    """``compiled`` (a layer's compiled call), which on a compilation error turns every layer of ``layers`` back
    to eager (once, with one log line) and runs ``layer`` eagerly."""

    def call(*args, **kwargs):
        if state["failed"]:
            return layer._call_impl(*args, **kwargs)
        try:
            return compiled(*args, **kwargs)
        except Exception as error:
            if not isinstance(error, compile_errors()):
                raise
            state["failed"] = True
            for other in layers:
                other._compiled_call_impl = None
            cause = getattr(error, "inner_exception", None) or error.__cause__ or error  # the backend's own
            text = str(cause).strip()
            logger.warning(
                "training.compile: compiling the encoder layers failed (%s: %s); training eager",
                type(cause).__name__,
                text.splitlines()[0][:200] if text else "",
            )
            return layer._call_impl(*args, **kwargs)

    return call


__all__ = [
    "own_accelerator",
    "check_placement",
    "resolve_precision",
    "prepare_compute",
    "use_tf32",
    "restore_tf32",
    "compile_layers",
    "compiled_layer_classes",
    "compile_errors",
]
