"""A task's predictions over the held-out set, kept batch by batch: from the trainer's final held-out pass (the
forwards that give the objectives' held-out losses), or from a pass of their own where no trainer ran. One forward
per held-out batch at the end of a run instead of two, as transformers' ``Trainer`` computes its loss and hands the
same logits to ``compute_metrics``."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from accelerate.utils import gather_object

from vlbert.utils import evaluation, forward_arguments

#: ``keep(batch, output) -> [(dataset index, value), ...]``: what a task keeps of one held-out batch (``batch``: the
#: collator's dict on the host, with its ``index`` int64 [B] and targets; ``output``: the model's output for it).
Keep = Callable[[dict, Any], Iterable[tuple[int, Any]]]


class HeldOutPredictions:
    """Per-example values (``keep``'s) of the held-out batches this process sees, by dataset index.

    The trainer fills it during its final held-out pass (``Trainer.train(final_outputs=...)``: :meth:`update` per
    batch, then :meth:`finish`); :meth:`run` fills it with a pass of its own. :meth:`gathered` joins every process's
    share in dataset order (accelerate's ``gather_object``; a collective: every process calls it).
    """

    def __init__(self, keep: Keep):
        self.keep = keep
        self.values: dict[int, Any] = {}
        self.finished = False

    def update(self, batch: dict, output) -> None:
        """Keep what ``keep`` takes of one batch and its model output."""
        self.values.update(self.keep(batch, output))

    def finish(self) -> None:
        """Mark the pass complete (a process may have seen no batch: its share is then empty)."""
        self.finished = True

    @evaluation
    def run(self, model, batches: Iterable[dict], inputs: Callable[[dict], dict]) -> "HeldOutPredictions":
        """Fill from a pass of its own: ``model(**inputs(batch))`` on the model's device for every batch (the
        entries its ``forward`` names, as the trainer gives them), in eval mode without gradients (the model is
        given back in the mode it was in). Returns ``self``."""
        device, named = next(model.parameters()).device, forward_arguments(model)
        for batch in batches:
            arguments = {k: v.to(device) for k, v in inputs(batch).items() if k in named}
            self.update(batch, model(**arguments))
        self.finish()
        return self

    def gathered(self) -> dict[int, Any]:
        """Every process's values, by dataset index in increasing order."""
        return dict(sorted(gather_object(list(self.values.items()))))


__all__ = ["HeldOutPredictions", "Keep"]
