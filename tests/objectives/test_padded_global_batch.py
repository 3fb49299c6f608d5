"""The global batch gathered to fixed bounds (vlbert/utils.py ``all_gather_padded``): a rank's last, smaller batch is
padded, and its padded rows are never drawn as negatives (ITM's hard and itc-mined negatives,
vlbert/layers/sampling.py) and never counted in ITC's loss (vlbert/objectives/contrastive.py): each equals the same
computation over the real rows alone. Two gloo processes check the gather itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_contrastive import pairs, tiny_vl_model

from vlbert.layers.sampling import draw_by_similarity
from vlbert.models.inputs import VLInputs
from vlbert.objectives.contrastive import contrastive_rows
from vlbert.objectives.image_text_matching import ImageTextMatching
from vlbert.utils import GatherBounds, all_gather_padded

#: rank 0 holds 3 rows, rank 1 (its last batch) 2, padded to 4 each
VALID = torch.tensor([True, True, True, False, True, True, False, False])


def _padded(real: torch.Tensor, fill: float) -> torch.Tensor:
    """``real`` [5, ...] laid out as the gather lays it out ([8, ...], padding rows ``fill``)."""
    out = torch.full((len(VALID), *real.shape[1:]), fill, dtype=real.dtype)
    out[VALID] = real
    return out


def test_padded_columns_are_never_drawn_and_change_no_draw():
    """Draws over the padded columns (with logits there larger than any real one) equal the draws over the real
    columns alone, mapped to their positions; a row whose every real candidate is excluded, and uniforms at 0 and
    just below 1, still land on a real column."""
    torch.manual_seed(0)
    rows = 64
    logits = torch.randn(rows, 5) * 3
    exclude = torch.rand(rows, 5) < 0.3
    exclude[0] = True  # every real candidate excluded
    uniforms = torch.rand(rows)
    uniforms[:3] = torch.tensor([0.0, 1.0 - 2.0**-24, 0.5])
    plain = draw_by_similarity(logits, exclude, uniforms)
    padded = draw_by_similarity(_padded(logits.T, 50.0).T, _padded(exclude.T, 0).T.bool(), uniforms, VALID)
    positions = VALID.nonzero().squeeze(1)
    assert torch.equal(padded, positions[plain]), (padded, positions[plain])
    assert VALID[padded].all()


def test_itc_over_padded_columns_equals_itc_over_the_real_ones():
    """ITC's loss, accuracy, chance and gradients over the gathered columns with padding (zero embeddings, content
    0, which a real caption also has here) equal those over the real columns alone."""
    torch.manual_seed(1)
    text = F.normalize(torch.randn(3, 8, dtype=torch.float64), dim=-1).requires_grad_()
    image = F.normalize(torch.randn(3, 8, dtype=torch.float64), dim=-1).requires_grad_()
    all_text = torch.cat([text.detach(), F.normalize(torch.randn(2, 8, dtype=torch.float64), dim=-1)])
    all_image = torch.cat([image.detach(), F.normalize(torch.randn(2, 8, dtype=torch.float64), dim=-1)])
    content = torch.tensor([0, 1, 2, 0, 3])
    same = content[:3, None] == content[None, :]
    padded_same = content[:3, None] == _padded(content, 0)[None, :]
    plain = contrastive_rows(text, image, all_text, all_image, same, 0.07)
    grads = torch.autograd.grad(plain[0], (text, image))
    padded = contrastive_rows(
        text, image, _padded(all_text, 0.0), _padded(all_image, 0.0), padded_same, 0.07, valid=VALID
    )
    for a, b in zip(padded, plain, strict=True):
        assert abs(float(a) - float(b)) < 1e-12, (padded, plain)
    for a, b in zip(torch.autograd.grad(padded[0], (text, image)), grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def _gather(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        rows, width = (3, 5) if rank == 0 else (2, 7)  # rank 1: a last, smaller batch of longer texts
        ids = torch.arange(rows * width).reshape(rows, width) + 1 + 100 * rank
        emb = torch.full((rows, 4), float(rank + 1))
        with pytest.raises(ValueError, match="more than the bound 1"):
            all_gather_padded([ids], 1, [8])
        (all_ids, all_emb), valid = all_gather_padded([ids, emb], 4, [8, None])
        if rank == 0:
            torch.save({"ids": all_ids, "emb": all_emb, "valid": valid}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
def test_two_ranks_gather_uneven_batches_to_the_bounds_with_a_validity_mask(tmp_path):
    """Rank 0 holds 3 texts of 5 positions, rank 1 2 of 7: every rank gets [8, 8] ids (each rank's rows at 4 x
    rank, padding 0) and the mask of the real rows."""
    from helpers.distributed import forked

    out = tmp_path / "rank0.pt"
    forked(_gather, str(tmp_path / "store"), str(out), nproc=2)
    got = torch.load(out)
    expected = torch.zeros(8, 8, dtype=torch.long)
    expected[:3, :5] = torch.arange(15).reshape(3, 5) + 1
    expected[4:6, :7] = torch.arange(14).reshape(2, 7) + 101
    assert torch.equal(got["ids"], expected)
    assert torch.equal(got["valid"], VALID)
    assert got["emb"][:, 0].tolist() == [1.0, 1.0, 1.0, 0.0, 2.0, 2.0, 0.0, 0.0]


def _held_out(model, batch: dict) -> dict:
    """The eval-mode outputs of ITC over ``batch`` and of ITM's hard-negative draw for it."""

    b = batch["input_ids"].shape[0]
    with torch.no_grad():
        out = model(**batch, itc_content=torch.arange(b) % 3)
        labels = {"itm_label": torch.arange(b) % 2, "itm_content": torch.arange(b) % 3, "itm_draw": torch.rand(b)}
        labels["gather_bounds"] = GatherBounds(rows=4, text=8, regions=5)
        inputs = VLInputs(**{k: v for k, v in batch.items() if k != "token_type_ids"})
        drawn = ImageTextMatching().before_encoder(model, inputs, labels).input_ids
    return {"itc_loss": out.losses["itc"], "itc_accuracy": out.metrics["itc_accuracy"], "itm_ids": drawn}


def _evaluate_uneven(rank: int, store: str, out: str) -> None:
    """Rank 0 evaluates two held-out batches, rank 1 one (the trainer deals them round-robin)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        model = tiny_vl_model().eval()
        torch.manual_seed(rank)
        results = [_held_out(model, pairs(4 if n == 0 else 3, seed=10 * rank + n)) for n in range(2 - rank)]
        torch.save(results, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
def test_ranks_evaluating_different_numbers_of_batches_gather_nothing(tmp_path):
    """The trainer deals the held-out batches to the ranks round-robin, so rank 0 may run one more than rank 1:
    ITC and ITM's hard negatives in eval mode use the rank's own batch (a gather would wait for a rank that has
    finished), and every held-out batch scores as in one process. On 14efcf9 rank 0's second batch fails in the
    gather."""
    from helpers.distributed import forked

    out = tmp_path / "held-out"
    forked(_evaluate_uneven, str(tmp_path / "store"), str(out), nproc=2)
    model = tiny_vl_model().eval()
    for rank, batches in ((0, 2), (1, 1)):
        got = torch.load(f"{out}.{rank}")
        torch.manual_seed(rank)
        for n in range(batches):
            alone = _held_out(model, pairs(4 if n == 0 else 3, seed=10 * rank + n))
            for key, value in alone.items():
                torch.testing.assert_close(got[n][key], value, rtol=0, atol=1e-6)
