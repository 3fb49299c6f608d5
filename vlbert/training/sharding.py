"""bf16 parameters trained through float32 sharded weights (``training.mixed_precision: bf16-params``), by FSDP2.

torch's ``fully_shard`` (FSDP2) is applied to each encoder layer (:class:`~vlbert.models.bert.BertLayer`, which
every encoder repeats, LXMERT's streams included) and then to the whole model, as torchtitan applies it to each
transformer block and then the root, with ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``:

- the model's parameters become float32 DTensors, each rank holding a 1/N shard (dim 0); the optimizer is built
  over them, so its state is float32 and sharded too (Micikevicius et al. 2018, section 3.1: an FP32 master copy of
  the weights receives the update);
- before a layer's forward its bf16 weights are all-gathered (cast from the float32 shards), and freed after it
  (the root's stay until the backward), so the forward and backward compute in bf16 with nothing cast inside them;
- after a layer's backward its gradients are cast to float32 and reduce-scattered (summed, then divided by N: the
  average over the processes), overlapped with the backward of the layers below it; with gradient accumulation the
  micro-batches before the last keep float32 unsharded sums (``set_requires_gradient_sync(False)``: FSDP2
  upcasts each micro-batch's gradient to ``reduce_dtype`` before adding), and the last one reduces them.

A single process runs the same code on a process group of one rank (:func:`start_local_group`): its all-gather and
reduce-scatter are copies. Source: torch 2.14 ``torch/distributed/fsdp/_fully_shard`` (``fully_shard``,
``MixedPrecisionPolicy``, ``FSDPModule.unshard``/``set_requires_gradient_sync``) and
``torch/distributed/checkpoint/state_dict.py`` (full state dicts from and into a sharded model); torchtitan
``parallelize.py`` (the order: blocks, then the root). Why not accelerate's FSDP plugin: docs/distributed.md.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from vlbert.models.bert import BertLayer
from vlbert.models.modernbert import ModernBertLayer

#: the computing dtype of bf16-params
COMPUTE_DTYPE = torch.bfloat16
#: whether this process started the default process group itself, for one rank (:func:`start_local_group`)
_LOCAL = {"group": False}


def local_backend() -> str:
    """The backends of :func:`start_local_group`'s group: gloo for CPU tensors; for CUDA tensors NCCL where this
    torch has it and a GPU is there (``dist.is_nccl_available() and torch.cuda.is_available()``), gloo otherwise.
    NCCL starts its communicator at the first CUDA collective only, so a CPU run pays nothing for it, and a CPU run
    followed by a GPU run in one process (a test session) finds the GPU's backend in the group it already has."""
    nccl = dist.is_nccl_available() and torch.cuda.is_available()
    return "cpu:gloo,cuda:nccl" if nccl else "cpu:gloo,cuda:gloo"


def start_local_group(device: torch.device) -> None:
    """Start a process group of one rank (this process) when none is started, for tensors on ``device`` or the
    CPU (:func:`local_backend`). The store is in memory (``HashStore``): nothing listens on a port. Kept for the
    life of the process (later trainers reuse it); :func:`release_local_group` ends it when a launcher's process
    group must replace it.

    Raises ValueError if ``device`` is neither a CPU nor a CUDA device."""
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"bf16-params trains on a CPU or CUDA device, not {device}")
    if dist.is_initialized():
        return
    dist.init_process_group(local_backend(), store=dist.HashStore(), rank=0, world_size=1)
    _LOCAL["group"] = True


def release_local_group() -> None:
    """End the one-rank process group :func:`start_local_group` started (a process forked from one that trained
    alone, now one rank of several); nothing otherwise."""
    if _LOCAL["group"] and dist.is_initialized():
        dist.destroy_process_group()
    _LOCAL["group"] = False


def sharded_layer_classes() -> tuple[type, ...]:
    """The modules sharded one by one (each its own all-gather and reduce-scatter): BERT's and ModernBERT's
    layers."""
    return (BertLayer, ModernBertLayer)


def shard_model(model: nn.Module, device: torch.device) -> nn.Module:
    """Shard ``model`` (on ``device``) in place for bf16-params training: its floating parameters float32 (cast
    from any other float dtype), its floating buffers bf16 (as in the model's bf16 computation), then
    ``fully_shard`` on each of its :func:`sharded_layer_classes` and on itself over every rank of the default
    process group (a one-rank group started if none is: :func:`start_local_group`). Returns ``model`` (its class
    now also an ``FSDPModule``; parameter names unchanged).

    Raises ValueError if the model's parameters are on another device than ``device``."""
    from torch.distributed.device_mesh import init_device_mesh

    elsewhere = sorted({str(p.device) for p in model.parameters() if p.device.type != device.type})
    if elsewhere:
        raise ValueError(f"bf16-params: parameters on {elsewhere}, training on {device}: move the model first")
    start_local_group(device)
    model.float()
    for buffer in model.buffers():
        if buffer.is_floating_point():
            buffer.data = buffer.data.to(COMPUTE_DTYPE)
    _scalars_as_vectors(model)
    return _fully_shard(model, init_device_mesh(device.type, (dist.get_world_size(),)))


def shard_like(module: nn.Module, model: nn.Module) -> nn.Module:
    """Shard ``module``, whose parameters are whole float32 weights of the parts of the :func:`shard_model`-sharded
    ``model`` (a copy of them), as ``model`` is: on its mesh, with its policy, each of its
    :func:`sharded_layer_classes` then ``module`` itself, so that each parameter's shard on this rank covers the
    same elements as ``model``'s shard of the same weight (``fully_shard`` splits dim 0 by ``torch.chunk``). The
    root too gives back its gathered weights after each forward (``reshard_after_forward=True``): a module run
    without a backward (ALBEF's momentum model) keeps nothing gathered between forwards. Returns ``module``;
    collective-free (each rank keeps its chunk).

    Raises ValueError if ``model`` is not sharded."""
    mesh = next((p.device_mesh for p in model.parameters() if hasattr(p, "device_mesh")), None)
    if mesh is None:
        raise ValueError("shard_like: the model is not sharded (shard it with shard_model first)")
    return _fully_shard(module, mesh, reshard_root=True)


def _fully_shard(model: nn.Module, mesh, reshard_root: bool | None = None) -> nn.Module:
    """``fully_shard`` on each of ``model``'s :func:`sharded_layer_classes`, then on ``model`` (its
    ``reshard_after_forward``: ``reshard_root``, None = FSDP2's default: kept gathered for the backward), with
    bf16-params' policy, over ``mesh``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # inputs are left as they come: the model casts its float inputs (region features, pixels) itself
    policy = MixedPrecisionPolicy(param_dtype=COMPUTE_DTYPE, reduce_dtype=torch.float32, cast_forward_inputs=False)
    for layer in [m for m in model.modules() if isinstance(m, sharded_layer_classes())]:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_root)
    return model


def _scalars_as_vectors(model: nn.Module) -> None:
    """Replace each 0-d parameter of ``model`` (retrieval's ``log_temperature``, ITC's ``temperature``) by a
    one-element one of the same value, which ``fully_shard`` can shard (it refuses scalars); the forwards
    broadcast it as they did the scalar. Their names are kept in ``model._sharded_scalars``: the whole state dicts
    (:func:`full_model_state`, :func:`full_optimizer_state`) give them back as 0-d tensors, the checkpoint's
    layout whatever the precision."""
    names = []
    for module_name, module in model.named_modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if p.dim() == 0:
                setattr(module, name, nn.Parameter(p.detach().reshape(1), requires_grad=p.requires_grad))
                names.append(f"{module_name}.{name}" if module_name else name)
    model._sharded_scalars = frozenset(names)


def _as_scalars(model: nn.Module, state: dict) -> dict:
    """``state`` (parameter name -> tensor, or -> dict of tensors) with :func:`_scalars_as_vectors`'s parameters
    0-d again."""
    scalars = getattr(model, "_sharded_scalars", frozenset())

    def scalar(t):
        return t.reshape(()) if torch.is_tensor(t) and t.shape == (1,) else t

    return {
        k: ({n: scalar(t) for n, t in v.items()} if isinstance(v, dict) else scalar(v)) if k in scalars else v
        for k, v in state.items()
    }


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` was sharded by :func:`shard_model` (or any ``fully_shard``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def gathered(model: nn.Module):
    """Within the block every parameter of the sharded ``model`` is its whole bf16 weight (all-gathered once on
    entry: collective, every rank enters together), and its forwards gather and free nothing: ranks may run
    different numbers of forwards (an evaluation's uneven shares). On exit the weights are sharded again."""
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for module in modules:
        module.unshard()
        module.set_reshard_after_forward(False, recurse=False)
    try:
        yield model
    finally:
        for module in modules:
            module.reshard()
            module.set_reshard_after_forward(module is not model, recurse=False)  # fully_shard's defaults


@contextlib.contextmanager
def gradient_sync(model: nn.Module, sync: bool):
    """Within the block the sharded ``model``'s backwards reduce-scatter their gradients (``sync``) or keep float32
    unsharded sums for a later micro-batch's backward to reduce (not ``sync``); reducing again on exit."""
    model.set_requires_gradient_sync(sync)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (collective: every rank calls it), ``t`` itself otherwise."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def clip_grad_norm(parameters: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients of ``parameters`` (DTensor shards or plain) so that their global L2 norm is at most
    ``max_norm``; returns the norm before clipping, a float32 0-d tensor on their device (the shards' partial norms
    summed across the ranks: collective, no host synchronisation)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = full_tensor(torch.nn.utils.get_total_norm(grads, 2.0))
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict of the sharded ``model`` (float32 parameters, its buffers) as CPU tensors under the
    model's own names, on rank 0; {} on the others. Collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return _as_scalars(model, full)


def _names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The model's name of each parameter of ``optimizer``, in ``Optimizer.state_dict``'s numbering."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state dict over the sharded ``model``'s parameters with whole (gathered) tensors, in
    ``torch.optim.Optimizer.state_dict``'s own layout (parameters numbered in group order), on rank 0; {} on the
    others. Collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    full = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not full:
        return {}
    index = {name: i for i, name in enumerate(_names(model, optimizer))}
    return {
        "state": {index[name]: state for name, state in _as_scalars(model, full["state"]).items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]],
    }


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load what :func:`full_optimizer_state` returned (or ``Optimizer.state_dict()`` of an unsharded run of the
    same model) into ``optimizer`` over the sharded ``model``: each rank keeps its shards. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _names(model, optimizer)
    scalars = getattr(model, "_sharded_scalars", frozenset())

    def sharded(name: str, s: dict) -> dict:  # a 0-d parameter's state, one element as the parameter now is
        return {
            k: v.reshape(1) if name in scalars and torch.is_tensor(v) and v.dim() == 0 and k != "step" else v
            for k, v in s.items()
        }

    keyed = {
        "state": {names[i]: sharded(names[i], s) for i, s in state["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]],
    }
    # strict=False: a parameter no step has given a gradient yet (an idle head) has no state, as in torch's own
    set_optimizer_state_dict(model, optimizer, keyed, options=StateDictOptions(full_state_dict=True, strict=False))


__all__ = [
    "COMPUTE_DTYPE",
    "local_backend",
    "start_local_group",
    "release_local_group",
    "sharded_layer_classes",
    "shard_model",
    "shard_like",
    "is_sharded",
    "gathered",
    "gradient_sync",
    "full_tensor",
    "clip_grad_norm",
    "full_model_state",
    "full_optimizer_state",
    "load_full_optimizer_state",
]
