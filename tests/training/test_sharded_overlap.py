"""bf16-params on two processes (FSDP2, vlbert/training/sharding.py) reduce-scatters each layer's gradients during
the backward, as soon as that layer's backward is done, not after it: the overlap of communication with the
backward that the hand-made bucketed reduction (reduction.py, replaced) gave. Each reduce-scatter FSDP2 issues is
recorded (the ``torch.distributed`` function it calls, wrapped), and so is the moment the first encoder layer's
backward finishes (the gradient of its input, the embeddings' output); on gloo the calls are synchronous, so the
order of the records is the order of the work."""

from __future__ import annotations

import pytest
import torch

LAYERS = 3


def _record_reduce_scatters(events: list) -> None:
    """Wrap the reduce-scatter functions FSDP2 may call (torch 2.14: ``reduce_scatter_single``; older:
    ``reduce_scatter_tensor``) to append "reduce-scatter" to ``events``."""
    import torch.distributed as dist

    for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        original = getattr(dist, name, None)
        if original is None:
            continue

        def wrapped(*args, _original=original, **kwargs):
            events.append("reduce-scatter")
            return _original(*args, **kwargs)

        setattr(dist, name, wrapped)


def _two_ranks(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    from vlbert.config import BertConfig
    from vlbert.models.bert import BertForPreTraining
    from vlbert.training import sharding

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        config = BertConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=LAYERS,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=32,
        )
        model = sharding.shard_model(BertForPreTraining(config), torch.device("cpu"))
        events: list[str] = []
        _record_reduce_scatters(events)

        def mark(module, inputs, output) -> None:  # (returns None: the output is left as it is)
            output.register_hook(lambda g: events.append("first layer done"))

        model.bert.embeddings.register_forward_hook(mark)
        input_ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(rank))
        loss = model(input_ids=input_ids).last_hidden_state.float().pow(2).mean()
        events.append("backward starts")
        loss.backward()
        events.append("backward returned")
        if rank == 0:
            torch.save(events, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.integration
def test_each_layer_reduce_scatters_during_the_backward(tmp_path):
    from helpers.distributed import forked

    out = tmp_path / "events.pt"
    forked(_two_ranks, str(tmp_path / "store"), str(out))
    events = torch.load(out)
    start, first_layer_done = events.index("backward starts"), events.index("first layer done")
    # one reduce-scatter per encoder layer, one for the root's own parameters (embeddings, heads)
    assert events.count("reduce-scatter") == LAYERS + 1, events
    # the layers above the first reduce before the first layer's backward is over: overlapped with it
    assert events[start:first_layer_done].count("reduce-scatter") >= LAYERS - 1, events
    assert events.index("backward returned") > max(i for i, e in enumerate(events) if e == "reduce-scatter")
