"""The masking-rate schedule of text pretraining (``data.mlm_probability_schedule``): the stated rates at the stated
steps (mmBERT's 30% -> 15% -> 5%), applied by the training loader to the batches of each optimizer step across
epochs and gradient accumulation, and the same batches when the loader restarts mid-run (resume)."""

from __future__ import annotations

import pytest
import torch

from vlbert.data.loading import train_loader
from vlbert.data.masking_schedule import MaskingSchedule
from vlbert.data.pretraining import MaskingCollator
from vlbert.layers.losses import IGNORE_INDEX

MMBERT = {0.0: 0.3, 0.767: 0.15, 0.967: 0.05}  # Marone et al. 2025: 2.3T, 0.6T and 0.1T of 3T tokens


def test_mmbert_rates_at_the_stated_steps():
    schedule = MaskingSchedule(MMBERT, max_steps=1000)
    expected = {0: 0.3, 766: 0.3, 767: 0.15, 966: 0.15, 967: 0.05, 999: 0.05}
    assert {s: schedule.rate(s) for s in expected} == expected
    assert schedule.fields(500) == {"mlm_probability": 0.3}
    # No phase at 0: data.mlm_probability until the first; a fraction whose step is not whole starts after it.
    later = MaskingSchedule({0.25: 0.05}, max_steps=10, default=0.15)
    assert [later.rate(s) for s in range(5)] == [0.15, 0.15, 0.15, 0.05, 0.05]  # ceil(2.5) = 3
    assert [later.rate(s) for s in range(3)] == [MaskingSchedule({}, 10, 0.15).rate(s) for s in range(3)]
    with pytest.raises(ValueError, match=r"data.mlm_probability_schedule\[0.5\] must be a rate in \(0, 1\)"):
        MaskingSchedule({0.5: 1.0}, 10)


class Sequences(torch.utils.data.Dataset):
    """12 items of [CLS] + 40 ordinary ids + [SEP], each with its own mask_seed."""

    def __len__(self):
        return 12

    def lengths(self):
        return [42] * 12

    def __getitem__(self, i):
        ids = [1] + [10 + (7 * i + j) % 80 for j in range(40)] + [2]
        return {"input_ids": ids, "token_type_ids": [0] * 42, "mask_seed": 1000 + i}


def run_batches(schedule, epochs: int, start_epoch: int = 0, start: int = 0):
    """(run's batch index, batch) for the batches from (start_epoch, start) on, as the trainer consumes them."""
    collator = MaskingCollator(vocab_size=100, mask_token_id=4, pad_token_id=0, special_token_ids=(1, 2, 3, 4))
    out = []
    for epoch in range(start_epoch, epochs):
        loader = train_loader(
            Sequences(), collator, 2, 0, epoch, start if epoch == start_epoch else 0, step_fields=schedule.fields,
            batches_per_step=2,
        )  # fmt: skip
        first = epoch * 6 + (start if epoch == start_epoch else 0)  # 12 items / batch 2 = 6 batches an epoch
        out += [(first + k, batch) for k, batch in enumerate(loader)]
    return out


def test_each_steps_batches_mask_its_rate_across_epochs_and_accumulation():
    """Batch r serves step r // 2 (two batches a step); 40 maskable ids a row: 12, 6 and 2 at 30%, 15%, 5%."""
    schedule = MaskingSchedule({0.0: 0.3, 0.5: 0.15, 0.9: 0.05}, max_steps=10)
    batches = run_batches(schedule, epochs=4)
    assert [r for r, _ in batches] == list(range(24))
    for r, batch in batches:
        chosen = (batch["labels"] != IGNORE_INDEX).sum(1)
        assert chosen.tolist() == [round(40 * schedule.rate(r // 2))] * 2, r
    assert {round(40 * schedule.rate(r // 2)) for r in range(20)} == {12, 6, 2}


def test_a_loader_restarted_mid_run_masks_as_the_uninterrupted_one():
    schedule = MaskingSchedule({0.0: 0.3, 0.5: 0.15, 0.9: 0.05}, max_steps=10)
    whole = dict(run_batches(schedule, epochs=3))
    resumed = run_batches(schedule, epochs=3, start_epoch=1, start=3)  # at step 4 (batch 9), before the change
    assert [r for r, _ in resumed] == list(range(9, 18))
    for r, batch in resumed:
        assert torch.equal(batch["input_ids"], whole[r]["input_ids"])
        assert torch.equal(batch["labels"], whole[r]["labels"])
