"""benchmarks/fake_device.py's graph walk, which stands in for autograd's engine on the fake GPU (the memory
benchmark's and the tests' FakeCuda): on real CPU tensors it gives autograd's gradients, runs hooks and queued
callbacks as the engine does, and frees the forward's saved tensors."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from benchmarks.fake_device import GraphWalk, SavedTensors


class _ScaledSum(torch.autograd.Function):
    """``scale * a + b`` with a non-tensor first argument, as FSDP2's functions have: its backward returns one
    gradient per forward argument, its graph has edges for the tensors only."""

    @staticmethod
    def forward(ctx, scale: float, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.scale = scale
        return scale * a + b

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, ctx.scale * grad, grad


def _loss(x: torch.Tensor, w: torch.Tensor, frozen: torch.Tensor) -> torch.Tensor:
    """A graph with broadcasting (x [3, 1] * w [4]), a tensor used twice, a Python Function and a hooked tensor."""
    y = torch.tanh(x * w)
    y.register_hook(lambda g: 3 * g)
    z = _ScaledSum.apply(0.5, y, frozen) * y
    return (z.sum(0) ** 2).sum()


def _leaves() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(3, 1, requires_grad=True), torch.randn(4, requires_grad=True), torch.randn(3, 4)


def test_the_walk_gives_autograd_s_gradients_and_runs_hooks():
    x, w, frozen = _leaves()
    expected = torch.autograd.grad(_loss(x, w, frozen), [x, w])
    walk = GraphWalk()
    with mock.patch("torch.Tensor.register_hook", walk.engine_patches()["torch.Tensor.register_hook"]):
        loss = _loss(x, w, frozen)
    walk(loss)
    assert torch.allclose(x.grad, expected[0]) and torch.allclose(w.grad, expected[1])
    assert walk.hooks == {} and not walk.running


def test_callbacks_queued_during_the_walk_run_after_the_graph():
    x, w, frozen = _leaves()
    walk = GraphWalk()
    engine = walk.engine_patches()["torch.autograd.variable.Variable._execution_engine"]
    seen = []

    def hook(grad):
        engine.queue_callback(lambda: seen.append(x.grad is not None))
        return grad

    with pytest.raises(RuntimeError, match="during backward"):
        engine.queue_callback(lambda: None)
    with mock.patch("torch.Tensor.register_hook", walk.engine_patches()["torch.Tensor.register_hook"]):
        y = x * w
        y.register_hook(hook)
    walk(y.sum())
    assert seen == [True] and walk.callbacks == []


def test_the_walk_frees_saved_tensors_and_hands_leaves_gradients_on():
    x, w, frozen = _leaves()
    got = {}
    with SavedTensors() as saved:
        loss = _loss(x, w, frozen)
    assert saved.holders and all(holder for holder in saved.holders)
    holders = list(saved.holders)
    GraphWalk(saved, on_leaf=lambda leaf, grad: got.setdefault(id(leaf), grad))(loss)
    assert saved.holders == [] and all(holder == [] for holder in holders)
    assert x.grad is None and set(got) == {id(x), id(w)}
