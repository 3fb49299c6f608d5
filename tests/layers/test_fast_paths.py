"""The speed paths equal what they replace: the fused masked-LM cross-entropy (value, gradient, accuracy), the CPU
dropout (distribution, scaling, gradient, seeding) and the CPU attention-with-dropout path (against SDPA)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vlbert
from vlbert.layers.attention import _explicit
from vlbert.layers.kernels import cross_entropy_with_accuracy, dropout
from vlbert.layers.unpadded import Unpadding
from vlbert.models.bert import SelfAttention


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_cross_entropy_matches_torch(dtype, atol):
    torch.manual_seed(0)
    logits = (torch.randn(37, 1009, dtype=torch.float64) * 4).to(dtype)
    targets = torch.randint(0, 1009, (37,))
    targets[:5] = logits[:5].float().argmax(-1)  # some rows right, so accuracy is not trivially 0
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    loss, accuracy = cross_entropy_with_accuracy(ours_in, targets)
    ref = F.cross_entropy(ref_in.float() if dtype == torch.bfloat16 else ref_in, targets)
    (loss * 3.0).backward()
    (ref * 3.0).backward()
    assert loss.dtype == (torch.float32 if dtype == torch.bfloat16 else dtype)
    assert torch.allclose(loss.double(), ref.double(), atol=atol)
    assert ours_in.grad.dtype == dtype
    assert torch.allclose(ours_in.grad.double(), ref_in.grad.double(), atol=atol)
    expected = (logits.float().argmax(-1) == targets).float().mean()
    assert accuracy.item() == pytest.approx(expected.item()) and accuracy.item() >= 5 / 37 - 1e-6


def test_cross_entropy_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="logits \\[N, C\\] and targets \\[N\\]"):
        cross_entropy_with_accuracy(torch.zeros(4, 3), torch.zeros(5, dtype=torch.long))


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_cpu_dropout_distribution_scaling_and_gradient(p):
    x = torch.rand(200_000, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) + 1.0
    x.requires_grad_()
    torch.manual_seed(0)
    y = dropout(x, p, training=True)
    kept = y != 0
    n = x.numel()
    assert abs(kept.double().mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5  # binomial 5 sigma
    assert torch.allclose(y[kept], x.detach()[kept] / (1 - p), rtol=1e-12)
    grad = torch.randn(n, dtype=torch.float64)
    y.backward(grad)
    assert torch.allclose(x.grad, torch.where(kept, grad / (1 - p), 0.0), rtol=1e-12)
    torch.manual_seed(0)
    again = dropout(x.detach(), p, training=True)
    assert torch.equal(again != 0, kept), "the mask must follow torch.manual_seed"


def test_dropout_identity_in_eval_bf16_scale_and_bad_p():
    x = torch.randn(4, 8)
    assert dropout(x, 0.5, training=False) is x
    torch.manual_seed(1)
    y = dropout(torch.ones(50_000, dtype=torch.bfloat16), 0.1, training=True)
    assert y.dtype == torch.bfloat16
    assert set(y.unique().float().tolist()) == {0.0, torch.tensor(1 / 0.9, dtype=torch.bfloat16).item()}
    with pytest.raises(ValueError, match="dropout probability must be in \\[0, 1\\]"):
        dropout(x, 1.5, training=True)


def test_cpu_attention_path_equals_sdpa():
    """With a dropout probability so small that nothing is dropped, the CPU training path (explicit softmax and
    :func:`dropout`) gives what scaled_dot_product_attention gives, padding mask included."""
    torch.manual_seed(0)
    config = vlbert.BertConfig(
        vocab_size=10, hidden_size=32, num_attention_heads=4, intermediate_size=64, attention_probs_dropout_prob=1e-12
    )
    attention = SelfAttention(config).double()
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False
    unpadding = Unpadding.from_mask(mask, 3, 7)
    x = torch.randn(unpadding.num_tokens, 32, dtype=torch.float64)
    attention.train()
    trained = attention(x, unpadding, "sdpa")
    attention.eval()
    reference = attention(x, unpadding, "sdpa")
    assert torch.allclose(trained, reference, atol=1e-12)


def test_cpu_attention_dropout_drops_half_and_rescales():
    """p = 0.5 on the attention probabilities: with the identity as values the output *is* the dropped
    probability matrix, so about half of the (real) entries are zero and the rest are softmax / (1 - p); padded
    keys get nothing."""
    torch.manual_seed(0)
    b, h, s = 8, 2, 32
    q, k = torch.randn(2, b, h, s, s, dtype=torch.float64)
    v = torch.eye(s, dtype=torch.float64).expand(b, h, s, s)
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
    mask[1, ..., 20:] = False
    dropped = _explicit(q, k, v, mask, 0.5, True, False)[0]
    probs = torch.softmax((q @ k.transpose(-1, -2) / s**0.5).masked_fill(~mask, float("-inf")), -1)
    real = mask.expand(b, h, s, s)
    kept = dropped != 0
    assert not (kept & ~real).any()
    share = kept[real].double().mean().item()
    n = int(real.sum())
    assert abs(share - 0.5) < 4 * (0.25 / n) ** 0.5, share  # within 4 sigma of half
    torch.testing.assert_close(dropped[kept], probs[kept] * 2, atol=1e-12, rtol=1e-12)


def test_little_padding_runs_padded_with_the_same_values():
    """Below 5% padding the encoder skips unpadding; real positions get the same values either way."""
    torch.manual_seed(0)
    config = vlbert.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    model = vlbert.BertModel(config).double().eval()
    ids = torch.randint(1, 50, (4, 16))
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[2, -2:] = 0  # 2 of 64 positions (3%) are padding
    padded = model(ids, attention_mask=mask).last_hidden_state
    assert padded[2, -1].abs().sum() > 0, "with 3% padding the padded rows are computed"
    model.encoder.min_padding_to_unpad = 0.0
    unpadded = model(ids, attention_mask=mask).last_hidden_state
    assert unpadded[2, -2:].abs().sum() == 0, "unpadded runs leave zeros at padding"
    real = mask.bool()
    assert torch.allclose(padded[real], unpadded[real], atol=1e-12)
