"""Word-region alignment (UNITER's WRA): the IPOT solver against the exact optimal-transport linear program (the
POT package's ot.emd2), padding, gradients to both modalities, bfloat16, and the unit in the VL model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vlbert
from vlbert.layers.optimal_transport import cosine_cost, ipot, ipot_loop, wasserstein_distance
from vlbert.models.inputs import VLInputs
from vlbert.processing import VLProcessor


def problems(count=12, seed=0):
    """Random small problems: cosine costs between 2-8 'words' and 2-11 'regions' of dimension 16."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    for _ in range(count):
        m, n = int(rng.integers(2, 9)), int(rng.integers(2, 12))
        yield torch.randn(1, m, 16), torch.randn(1, n, 16)


def exact(x, y) -> float:
    import ot  # here, not at the top: POT imports scikit-learn (1.8 s), which every xdist worker would pay at collection

    m, n = x.shape[1], y.shape[1]
    return float(ot.emd2(np.full(m, 1 / m), np.full(n, 1 / n), cosine_cost(x, y)[0].double().numpy()))


def test_ipot_converges_to_the_exact_transport_distance():
    gaps_at_50 = []
    for x, y in problems():
        ones_x, ones_y = torch.ones(1, x.shape[1]), torch.ones(1, y.shape[1])
        converged, plan = wasserstein_distance(x, y, ones_x, ones_y, beta=0.5, iterations=1000)
        assert abs(float(converged) - exact(x, y)) < 1e-3
        # a transport plan: the marginals are the uniform masses
        torch.testing.assert_close(plan.sum(2), ones_x / x.shape[1], atol=1e-4, rtol=0)
        torch.testing.assert_close(plan.sum(1), ones_y / y.shape[1], atol=1e-4, rtol=0)
        unites, _ = wasserstein_distance(x, y, ones_x, ones_y)  # UNITER's beta 0.5, 50 iterations
        gaps_at_50.append(abs(float(unites) - exact(x, y)))
    print(
        f"IPOT gap to the exact distance at UNITER's 50 iterations, beta 0.5: max {max(gaps_at_50):.2e}, "
        f"mean {np.mean(gaps_at_50):.2e}"
    )
    assert max(gaps_at_50) < 5e-3


def test_padded_words_and_regions_carry_no_mass():
    x, y = torch.randn(2, 7, 16), torch.randn(2, 9, 16)
    x_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    y_mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    distance, plan = wasserstein_distance(x, y, x_mask, y_mask, iterations=300)
    assert plan[1, 4:].abs().max() == 0 and plan[1, :, 5:].abs().max() == 0
    alone, _ = wasserstein_distance(x[1:, :4], y[1:, :5], torch.ones(1, 4), torch.ones(1, 5), iterations=300)
    torch.testing.assert_close(distance[1], alone[0])
    assert abs(float(distance[1]) - exact(x[1:, :4], y[1:, :5])) < 1e-3
    with pytest.raises(ValueError, match="at least one real word and one real region"):
        ipot(cosine_cost(x, y), torch.zeros(2, 7), y_mask)


def ipot_before(cost, x_mask, y_mask, beta=0.5, iterations=50, k=1):
    """ipot as it was written up to 0da7c4f (9 kernels per iteration): the reference the fused loop must equal."""
    xm, ym = x_mask.bool(), y_mask.bool()
    cost = cost.float()
    joint = (xm[:, :, None] & ym[:, None, :]).float()
    mu, nu = xm.float() / xm.sum(1, keepdim=True), ym.float() / ym.sum(1, keepdim=True)
    kernel, plan, sigma = torch.exp(-cost / beta) * joint, joint.clone(), nu.clone()
    for _ in range(iterations):
        q = kernel * plan
        for _ in range(k):
            delta = mu / (q @ sigma[:, :, None]).squeeze(2).clamp_min(1e-30)
            sigma = nu / (q.transpose(1, 2) @ delta[:, :, None]).squeeze(2).clamp_min(1e-30)
        plan = delta[:, :, None] * q * sigma[:, None, :]
    return plan * joint


class KernelCount(TorchDispatchMode):
    """Counts the ATen calls that launch work (views and metadata ops launch nothing)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += not (func.is_view or func._overloadpacket.__name__ in ("_unsafe_view", "detach"))
        return func(*args, **(kwargs or {}))


def padded_problem(seed=3):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(5, 11, 16, generator=g), torch.randn(5, 9, 16, generator=g)
    x_mask, y_mask = torch.ones(5, 11), torch.ones(5, 9)
    x_mask[1, 6:], y_mask[2, 4:], x_mask[3, 2:], y_mask[3, 8:] = 0, 0, 0, 0
    return cosine_cost(x, y), x_mask, y_mask


@pytest.mark.parametrize("k", [1, 2])
def test_ipot_equals_its_previous_form_in_7_launches_an_iteration(k):
    """The fused loop: the previous form's plan within float32 rounding, padding and all, in at most 7 launching
    ATen calls per iteration (k = 1; the previous form made 9) plus a fixed setup, no host synchronisation."""
    cost, x_mask, y_mask = padded_problem()
    with KernelCount() as counter:
        plan = ipot(cost, x_mask, y_mask, k=k, graph=False)
    torch.testing.assert_close(plan, ipot_before(cost, x_mask, y_mask, k=k), rtol=1e-5, atol=1e-9)
    assert counter.calls <= (3 + 4 * k) * 50 + 20, counter.calls  # (the setup: masks, kernel, the CPU check)
    with KernelCount() as before:
        ipot_before(cost, x_mask, y_mask, k=k)
    print(f"k={k}: {counter.calls} launching ATen calls for 50 iterations (previous form {before.calls})")


def tiny_vl_model(**config_fields):
    torch.manual_seed(0)
    config = vlbert.VLBertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        region_feature_dim=12,
        num_region_classes=0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **config_fields,
    )
    return vlbert.VLBertForPreTraining(config)


def wra_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 60, (4, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 5:] = 0
    region_mask = torch.ones(4, 6, dtype=torch.long)
    region_mask[1, 3:] = 0
    return dict(
        input_ids=ids,
        attention_mask=mask,
        region_features=torch.randn(4, 6, 12, generator=g),
        region_boxes=torch.rand(4, 6, 2, generator=g).repeat(1, 1, 2).clamp(max=0.9) + torch.tensor([0, 0, 0.1, 0.1]),
        region_mask=region_mask,
        itm_label=torch.tensor([1, 0, 1, 0]),
        wra_weight=torch.tensor(0.1),
    )


def test_wra_runs_with_itm_and_its_gradient_reaches_both_modalities():
    model = tiny_vl_model()
    out = model(**wra_batch())
    assert set(out.losses) == {"itm", "wra"} and out.counts["wra"] == 4
    assert out.counts["wra_matched_distance"] == 2 and out.counts["wra_mismatched_distance"] == 2
    out.losses["wra"].backward()
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0  # the words' side
    assert model.bert.region_embeddings.feature_proj.weight.grad.abs().sum() > 0  # the regions' side
    assert model.itm.weight.grad is None  # WRA has no parameters of its own: the ITM head gets nothing from it


def test_wra_at_the_embeddings_transports_between_the_first_layers_inputs():
    from vlbert.analysis.attention_maps import word_region_transport

    model, batch = tiny_vl_model(wra_layer=0), wra_batch()
    out = model(**batch)
    assert out.hidden_states is None  # kept for the unit, not returned unasked
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "region_features", "region_boxes", "region_mask")}
    embeddings = model.bert(**inputs, output_hidden_states=True).hidden_states[0]
    distance, _ = wasserstein_distance(
        embeddings[:, :7], embeddings[:, 7:], batch["attention_mask"], batch["region_mask"]
    )
    torch.testing.assert_close(out.metrics["wra_matched_distance"], distance[[0, 2]].mean())
    torch.testing.assert_close(out.metrics["wra_mismatched_distance"], distance[[1, 3]].mean())
    out.losses["wra"].backward()
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert model.bert.region_embeddings.feature_proj.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.bert.encoder.parameters())  # above the states WRA reads
    # the plan the analysis draws is the same layer's
    one = {k: v[:1] for k, v in inputs.items() if k.startswith("region")}
    _, drawn = word_region_transport(model.eval(), batch["input_ids"][:1], one)
    assert abs(drawn - float(distance[0].detach())) < 1e-5
    with pytest.raises(ValueError, match="wra_layer"):
        tiny_vl_model(wra_layer=3)  # the model has 2 layers


def test_wra_stays_finite_in_a_bfloat16_step():
    model = tiny_vl_model()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**wra_batch())
    assert torch.isfinite(out.loss) and torch.isfinite(out.losses["wra"])
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert out.losses["wra"].dtype == torch.float32  # the transport is solved in float32 under autocast


def test_hard_negatives_replace_only_the_negative_rows_with_other_content():
    """ITM's hard negatives (data.itm_negatives: hard): the label-0 rows get a caption of the batch with another
    content, drawn by similarity from each row's own uniform number (the same draw twice); label-1 rows keep their text."""
    from vlbert.objectives.image_text_matching import ImageTextMatching

    model = tiny_vl_model().eval()
    torch.manual_seed(3)
    b = 8
    ids = torch.randint(5, 60, (b, 6))
    ids[:, 0], ids[:, -1] = 2, 3
    ids[5, 4:] = 0
    ids[5, 3] = 3
    mask = (ids != 0).long()
    labels = {
        "itm_label": torch.tensor([1, 0, 1, 0, 0, 1, 0, 1]),
        "itm_content": torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]),
        "itm_draw": torch.linspace(0.05, 0.95, b),
    }
    regions = {
        "region_features": torch.randn(b, 5, 12),
        "region_boxes": torch.rand(b, 5, 4),
        "region_mask": torch.ones(b, 5, dtype=torch.long),
    }
    draws = []
    for _ in range(2):
        inputs = VLInputs(input_ids=ids.clone(), attention_mask=mask.clone(), **regions)
        draws.append(ImageTextMatching().before_encoder(model, inputs, labels).input_ids)
    assert torch.equal(draws[0], draws[1])
    new = draws[0]
    for i in range(b):
        if labels["itm_label"][i] == 1:
            assert torch.equal(new[i, : mask[i].sum()], ids[i, : mask[i].sum()])
        else:
            source = next(
                j
                for j in range(b)
                if torch.equal(new[i, : mask[j].sum()], ids[j, : mask[j].sum()])
                and int((new[i] != 0).sum()) == int(mask[j].sum())
            )
            assert labels["itm_content"][source] != labels["itm_content"][i]


def test_alignment_share_counts_the_mass_on_the_named_objects_regions(monkeypatch, tokenizer):
    """The issue-32 measurement (vlbert.analysis.alignment_share): the object's box is found from the pixels, regions
    are the object's (IoU >= 0.5), background (IoU < 0.1) or neither (the whole image, partial overlaps), and a
    plan that sends a word's mass to the object's regions scores 1 where a content-blind plan scores their count's
    share."""
    from vlbert.detectors.regions import Regions

    from vlbert.analysis import alignment_share as measure

    image = np.full((64, 64, 3), 255, dtype=np.uint8)
    image[10:30, 20:44] = (200, 30, 30)  # a red rectangle on white: x 20..43, y 10..29
    box = measure.object_box(image)
    assert box.tolist() == [20, 10, 44, 30]
    assert measure.object_box(np.full((64, 64, 3), 255, dtype=np.uint8)) is None  # nothing drawn
    boxes = np.array(
        [[20, 10, 44, 30], [0, 40, 20, 64], [21, 11, 43, 29], [0, 0, 64, 64], [20, 10, 64, 64]], dtype=np.float32
    )  # the object, background, the object again, the whole image, a partial overlap
    regions = Regions("x", 64, 64, boxes, np.zeros((5, 4), np.float16), np.ones(5, np.float32))
    on_object, background = measure.region_roles(regions, box, 5)
    assert on_object.tolist() == [True, False, True, False, False]
    assert background.tolist() == [False, True, False, False, False]

    caption = "a red rectangle"
    n_tokens = len(tokenizer(caption)["input_ids"])
    aligned = np.full((n_tokens, 5), 0.2)
    aligned[:, [0, 2]], aligned[:, 1] = 0.45, 0.0  # every word: all its object + background mass on the object
    monkeypatch.setattr(measure, "word_region_transport", lambda model, ids, padded: (aligned, 0.0))
    result = measure.alignment_share(
        None, VLProcessor(tokenizer, max_regions=5), [(caption, regions, box, ("red", "rectangle", "purple"))]
    )
    assert result == {
        "words": 2,
        "share": 1.0,
        "uniform": pytest.approx(2 / 3),
        "images": 1,
        "by_word": [1.0, 1.0, None],
    }  # "purple": absent
    blind = np.full((n_tokens, 5), 0.2)
    monkeypatch.setattr(measure, "word_region_transport", lambda model, ids, padded: (blind, 0.0))
    result = measure.alignment_share(None, VLProcessor(tokenizer, max_regions=5), [(caption, regions, box, ("red",))])
    assert result["share"] == pytest.approx(result["uniform"]) == pytest.approx(2 / 3)
    # one word aligned, the other blind: each word's share apart, their mean as the share
    mixed = blind.copy()
    mixed[2, [0, 2]], mixed[2, 1] = 0.45, 0.0  # "red" (row 2 after [CLS] a) on the object
    monkeypatch.setattr(measure, "word_region_transport", lambda model, ids, padded: (mixed, 0.0))
    result = measure.alignment_share(
        None, VLProcessor(tokenizer, max_regions=5), [(caption, regions, box, ("red", "rectangle"))]
    )
    assert result["by_word"] == [1.0, pytest.approx(2 / 3)] and result["share"] == pytest.approx(5 / 6)


def zero_padded(cost, x_mask, y_mask, multiple=16):
    """The problem as :class:`~vlbert.layers.optimal_transport.CapturedIPOT` hands it to its graph: M and N rounded
    up to ``multiple``, the added rows and columns of zero cost and zero mask."""
    b, m, n = cost.shape
    rows, cols = -(-m // multiple) * multiple, -(-n // multiple) * multiple
    padded = cost.new_zeros(b, rows, cols), x_mask.new_zeros(b, rows), y_mask.new_zeros(b, cols)
    padded[0][:, :m, :n], padded[1][:, :m], padded[2][:, :n] = cost, x_mask, y_mask
    return padded


def test_ipot_on_the_zero_padded_problem_is_the_exact_sizes_plan():
    """What the captured replay relies on: the loop on the problem rounded up to the graph's size (zero cost, zero
    mask) puts no mass on the added rows and columns and gives the exact-size plan on the real ones, within float32
    rounding (the tolerance of the fused-loop test above: padding adds exact zeros to the matrix-vector products,
    which a BLAS may sum in another order over the longer rows)."""
    for m, n in [(11, 9), (7, 14), (20, 9)]:
        g = torch.Generator().manual_seed(m * n)
        cost = cosine_cost(torch.randn(4, m, 16, generator=g), torch.randn(4, n, 16, generator=g))
        x_mask, y_mask = torch.ones(4, m), torch.ones(4, n)
        x_mask[1, m // 2 :], y_mask[2, n // 2 :] = 0, 0
        padded = ipot_loop(*zero_padded(cost, x_mask, y_mask), 0.5, 50, 1)
        assert padded[:, m:].abs().max() == 0 and padded[:, :, n:].abs().max() == 0
        torch.testing.assert_close(padded[:, :m, :n], ipot(cost, x_mask, y_mask, graph=False), rtol=1e-5, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_captured_ipot_replays_the_eager_loop_on_cuda():
    """The CUDA-graph replay (the default on a GPU) against the eager loop on the same device, across sizes that
    share a graph (rounded up to 16) and one that does not, and after a batch whose cost held a NaN.

    The replay runs the eager loop's kernels in its order at the graph's size, so it equals the eager loop on the
    zero-padded problem bit for bit. Against the eager loop at the exact size it is equal within float32 rounding
    only (the tolerance of test_ipot_on_the_zero_padded_problem_is_the_exact_sizes_plan): cuBLAS picks its batched
    matrix-vector kernel by shape, and one that reduces over 16 columns where 9 are real sums them in another order
    than one over 9.
    """
    from vlbert.layers.optimal_transport import CapturedIPOT

    captured = CapturedIPOT()
    for seed, (m, n) in enumerate([(11, 9), (7, 14), (11, 9), (20, 9)]):
        g = torch.Generator().manual_seed(seed)
        cost = cosine_cost(torch.randn(4, m, 16, generator=g), torch.randn(4, n, 16, generator=g)).cuda()
        x_mask, y_mask = torch.ones(4, m, device="cuda"), torch.ones(4, n, device="cuda")
        x_mask[1, m // 2 :], y_mask[2, n // 2 :] = 0, 0
        plan = captured(cost, x_mask, y_mask, 0.5, 50, 1)
        at_graph_size = ipot_loop(*zero_padded(cost, x_mask, y_mask, captured.multiple), 0.5, 50, 1)[:, :m, :n]
        torch.testing.assert_close(plan, at_graph_size, rtol=0, atol=0)
        torch.testing.assert_close(plan, ipot(cost, x_mask, y_mask, graph=False), rtol=1e-5, atol=1e-9)
        if seed == 0:
            captured(torch.full_like(cost, float("nan")), x_mask, y_mask, 0.5, 50, 1)
    assert len(captured.graphs) == 2 and not captured.failed
