"""The GPU step, checked where the tests run (issue 31): every attention kernel equals ``eager`` on ragged text and
text + regions, the collator's unpadded layout equals the one the model reads from the mask, a training step reads
nothing back from the device, the whole model compiles without a graph break, the padded-vocabulary MLM loss is
the cross-entropy, and bf16 weights with float32 masters train as float32 does. The H100 figures are the proxy's
(../shared/gpu/roofline.py), quoted in docs/performance.md."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
import traceback
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers.builders import tiny_text_trainer
from torch.utils._python_dispatch import TorchDispatchMode

import vlbert
from vlbert.layers.attention import ATTENTION_FUNCTIONS, register_attention
from vlbert.layers.losses import masked_lm_loss, masked_positions
from vlbert.layers.unpadded import Unpadding, stream_layouts, unpadded_layout
from vlbert.models.vl import VLBertForPreTraining
from vlbert.training.sharding import full_tensor

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ("eager", "sdpa", "varlen")


def ragged_text(b=4, t=11, vocab=90, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    for row, length in enumerate((t, 7, 3, 9)[:b]):
        mask[row, length:] = 0
    ids = ids * mask
    labels = torch.full_like(ids, -100)
    labels[:, 1] = ids[:, 1]
    labels[0, 5] = ids[0, 5]
    return ids, mask, labels


def ragged_regions(b=4, r=5, d=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    boxes = torch.rand(b, r, 2, generator=g).sort(-1).values
    boxes = torch.stack([boxes[..., 0] * 0.5, boxes[..., 0] * 0.4, boxes[..., 1], boxes[..., 1]], -1)
    region_mask = torch.ones(b, r, dtype=torch.long)
    region_mask[1, 3:] = 0
    region_mask[3, 1:] = 0
    return torch.randn(b, r, d, generator=g), boxes, region_mask


def text_config(**kw):
    return vlbert.BertConfig(
        **{
            "vocab_size": 90,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            **kw,
        }
    )


def vl_config(**kw):
    return vlbert.VLBertConfig(
        **{
            "vocab_size": 90,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "region_feature_dim": 16,
            "num_region_classes": 0,
            **kw,
        }
    )


#: VL-BERT's region pathway: [text ; regions ; END], the visual embedding added to every token.
VL_BERT = {"region_embedding": "vl-bert"}
#: LXMERT's encoder (issue 42), one layer per stream.
TWO_STREAM = {
    "encoder": "two-stream",
    "l_layers": 1,
    "r_layers": 1,
    "x_layers": 1,
    "region_embedding": "lxmert",
    "region_location_dim": 4,
}


def run(model, batch):
    """(last hidden state, loss, the gradient of every parameter) of one forward + backward."""
    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    return (
        out.last_hidden_state,
        out.loss,
        {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
    )


@pytest.mark.parametrize("modality", ["text", "vl", "two-stream", "vl-bert"])
def test_every_attention_kernel_equals_eager_on_ragged_batches(modality):
    """float64, eval mode: each kernel, with the unpadding read from the mask or given by the collator (for the
    two-stream model also each stream's layout, the one its collator gives; for VL-BERT's pathway the collator's
    layout extended by its [END] on the device), gives eager's hidden states (1e-10 at real positions, zeros at
    padding), loss and gradients."""
    ids, mask, labels = ragged_text()
    batch = dict(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids), labels=labels)
    masks = [mask]
    if modality != "text":
        feats, boxes, region_mask = ragged_regions()
        batch.update(
            region_features=feats, region_boxes=boxes, region_mask=region_mask, itm_label=torch.tensor([1, 0, 1, 1])
        )
        masks.append(region_mask)
        if modality == "two-stream":  # the last cross layer's region sub-layer is read by region objectives only
            batch.update(masked_regions=region_mask.bool() & (torch.arange(5) == 0), region_targets=feats)
    else:
        batch["next_sentence_label"] = torch.tensor([0, 1, 0, 1])
    real = torch.cat(masks, 1).bool()
    layouts = {
        "mask": {},
        "joint": {"layout": unpadded_layout(*masks), "masked_lm_positions": masked_positions(labels)},
    }
    streams = TWO_STREAM if modality == "two-stream" else VL_BERT if modality == "vl-bert" else {}
    if modality == "two-stream":
        layouts["streams"] = {"layout": stream_layouts(*masks), "masked_lm_positions": masked_positions(labels)}
    results = {}
    for kernel in KERNELS:
        config = (text_config if modality == "text" else vl_config)(attn_implementation=kernel, **streams)
        torch.manual_seed(0)
        model = (vlbert.BertForPreTraining if modality == "text" else VLBertForPreTraining)(config).double().eval()
        for given, layout in layouts.items():
            results[kernel, given] = run(model, {**batch, **layout})
    hidden, loss, grads = results["eager", "mask"]
    assert all(g.abs().sum() > 0 for n, g in grads.items() if n.startswith("bert.encoder"))
    for key, (h, l, g) in results.items():
        torch.testing.assert_close(h[real], hidden[real], atol=1e-10, rtol=0, msg=str(key))
        assert h[~real].abs().max() == 0, key
        torch.testing.assert_close(l, loss, atol=1e-10, rtol=0)
        assert g.keys() == grads.keys()
        for name in g:
            torch.testing.assert_close(g[name], grads[name], atol=1e-9, rtol=1e-7, msg=f"{key} {name}")


def test_two_stream_layouts_agree_where_a_row_has_no_region():
    """LXMERT's cross-attention on each stream's layout (issue 42): ``varlen`` (queries and keys of their own
    cu_seqlens; here its per-sequence CPU reference of the flash kernel), ``sdpa`` and ``eager``, given the
    collator's per-stream layout or reading the masks, agree (float64: hidden states, loss, gradients) on a batch
    where one row's regions are all masked out: its text attends to no region (cross-attention output 0 in the
    unpadded kernel, attention to the zero padding in the padded ones)."""
    ids, mask, labels = ragged_text()
    feats, boxes, region_mask = ragged_regions()
    region_mask[3] = 0
    batch = dict(
        input_ids=ids,
        attention_mask=mask,
        labels=labels,
        region_features=feats,
        region_boxes=boxes,
        region_mask=region_mask,
    )
    results = {}
    for kernel in KERNELS:
        torch.manual_seed(0)
        model = VLBertForPreTraining(vl_config(attn_implementation=kernel, **TWO_STREAM)).double().eval()
        for given in (False, True):
            layout = {"layout": stream_layouts(mask, region_mask)} if given else {}
            results[kernel, given] = run(model, {**batch, **layout})
    real = torch.cat([mask, region_mask], 1).bool()
    hidden, loss, grads = results["eager", False]
    for key, (h, l, g) in results.items():
        torch.testing.assert_close(h[real], hidden[real], atol=1e-10, rtol=0, msg=str(key))
        torch.testing.assert_close(l, loss, atol=1e-10, rtol=0)
        for name in grads:
            torch.testing.assert_close(g[name], grads[name], atol=1e-9, rtol=1e-7, msg=f"{key} {name}")


def test_kernels_in_bf16_autocast_stay_within_bf16_and_keep_the_stream_in_bf16():
    """Under bf16 autocast the residual stream and LayerNorm stay bf16 (the output is bf16) and every kernel is
    within bf16's tolerance of float32 eager."""
    ids, mask, _ = ragged_text()
    real = mask.bool()
    torch.manual_seed(0)
    model = vlbert.BertModel(text_config(attn_implementation="eager")).eval()
    reference = model(ids, attention_mask=mask).last_hidden_state
    for kernel in KERNELS:
        model.encoder.attn_implementation = kernel
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(ids, attention_mask=mask, layout=unpadded_layout(mask)).last_hidden_state
        assert out.dtype == torch.bfloat16, kernel
        error = (out.float() - reference)[real].abs().max()
        assert error < 0.06, (kernel, error)  # LayerNorm outputs of O(1): a few bf16 ulps after 2 layers


def test_attn_implementation_config_json_and_registration(tmp_path):
    """transformers' key: eager/sdpa written to config.json (and transformers loads it), varlen (a name transformers
    refuses) kept out; transformers' flash_attention_2 reads as varlen; an unknown name is one line naming the
    kernels; a registered kernel is used by name."""
    import transformers

    model = vlbert.BertModel(text_config(attn_implementation="sdpa"))
    model.save_pretrained(tmp_path / "sdpa")
    assert json.loads((tmp_path / "sdpa" / "config.json").read_text())["attn_implementation"] == "sdpa"
    assert transformers.BertModel.from_pretrained(tmp_path / "sdpa").config._attn_implementation == "sdpa"
    vlbert.BertModel(text_config(attn_implementation="varlen")).save_pretrained(tmp_path / "varlen")
    assert "attn_implementation" not in json.loads((tmp_path / "varlen" / "config.json").read_text())
    transformers.BertModel.from_pretrained(tmp_path / "varlen")
    assert text_config(attn_implementation="flash_attention_2").attn_implementation == "varlen"

    ids, mask, _ = ragged_text()
    with pytest.raises(
        ValueError,
        match=r"attn_implementation='flash' is not a registered attention kernel; use "
        r"one of \['eager', 'sdpa', 'varlen'",
    ):
        vlbert.BertModel(text_config(attn_implementation="flash"))(ids, attention_mask=mask)
    calls = []

    def counting(q, k, v, unpadding, dropout_p, training, output_attentions=False):
        calls.append(unpadding.num_tokens)
        return ATTENTION_FUNCTIONS["eager"](q, k, v, unpadding, dropout_p, training, output_attentions)

    register_attention("test_counting", counting)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_attention("test_counting", counting)
        vlbert.BertModel(text_config(attn_implementation="test_counting"))(ids, attention_mask=mask)
        assert calls == [int(mask.sum())] * 2  # two layers, the real tokens only
    finally:
        del ATTENTION_FUNCTIONS["test_counting"]


def test_collator_layout_equals_the_mask_and_regions_follow_their_text():
    ids, mask, _ = ragged_text()
    _, _, region_mask = ragged_regions()
    layout = unpadded_layout(mask, region_mask)
    full = torch.cat([mask, region_mask], 1)
    unpadding = Unpadding.from_mask(full, *full.shape)
    assert torch.equal(layout.indices, unpadding.indices)
    assert torch.equal(layout.cu_seqlens, unpadding.cu_seqlens)
    assert layout.cu_seqlens.tolist() == [0, 11 + 5, 16 + 7 + 3, 26 + 3 + 5, 34 + 9 + 1]
    x = torch.arange(full.numel(), dtype=torch.float64).view(*full.shape, 1)
    assert torch.equal(unpadding.pad(unpadding.unpad(x)), x * full[..., None])
    with pytest.raises(ValueError, match="recompute it with unpadded_layout"):
        vlbert.BertModel(text_config())(ids, attention_mask=mask, layout=unpadded_layout(mask[:2]))
    streams = stream_layouts(mask, region_mask)  # a two-stream model's: each stream's own mask
    assert streams.text.cu_seqlens.tolist() == [0, 11, 18, 21, 30]
    assert streams.regions.cu_seqlens.tolist() == [0, 5, 8, 13, 14]
    assert streams.regions.indices.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15]
    feats, boxes, _ = ragged_regions()
    with pytest.raises(ValueError, match="single-stream: collate with VLCollator"):
        vlbert.VLBertModel(vl_config())(
            ids, attention_mask=mask, region_features=feats, region_boxes=boxes, region_mask=region_mask, layout=streams
        )


def test_padded_vocabulary_mlm_loss_is_the_cross_entropy(monkeypatch):
    """The MLM head multiplies by a vocabulary padded to a multiple of 64 with -inf logits (on CUDA; here forced
    on the CPU): loss, accuracy and gradients equal F.cross_entropy over the true vocabulary (float32 and bf16),
    and the returned logits are V wide."""
    from vlbert.layers.pretraining_heads import MaskedLMHead

    monkeypatch.setattr(MaskedLMHead, "pad_vocab_on", ("cuda", "cpu"))
    torch.manual_seed(0)
    config = text_config(vocab_size=100)
    model = vlbert.BertForPreTraining(config)
    hidden = torch.randn(2, 6, 32, requires_grad=True)
    labels = torch.full((2, 6), -100)
    labels[0, 1], labels[1, 4], labels[1, 5] = 3, 99, 50
    head, embeddings = model.masked_lm, model.bert.embeddings.word_embeddings.weight
    assert head(hidden[0], embeddings, padded=True).shape == (6, 128)  # 100 rows padded to 128, the extra -inf
    loss, logits, accuracy, n = masked_lm_loss(head, embeddings, hidden, labels, masked_positions(labels))
    assert logits.shape == (3, 100) and n == 3
    reference = head(hidden[labels != -100], embeddings)
    torch.testing.assert_close(logits, reference)
    torch.testing.assert_close(loss, F.cross_entropy(reference, labels[labels != -100]))
    (grad,) = torch.autograd.grad(loss, hidden)
    (ref_grad,) = torch.autograd.grad(F.cross_entropy(reference, labels[labels != -100]), hidden)
    torch.testing.assert_close(grad, ref_grad)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, _, _, _ = masked_lm_loss(head, embeddings, hidden, labels)
        low_logits = head(hidden[labels != -100], embeddings)
    torch.testing.assert_close(low, F.cross_entropy(low_logits.float(), labels[labels != -100]), atol=1e-5, rtol=0)


class DeviceReads(TorchDispatchMode):
    """Every operation of the step that would make the host wait for a GPU: a tensor read into Python
    (``_local_scalar_dense``), ``nonzero`` (its output size), a boolean-mask index. ``check_text_inputs`` is left
    out: it reads values only of host tensors (on a GPU it asserts asynchronously)."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func._overloadpacket
        sync = packet in (torch.ops.aten._local_scalar_dense, torch.ops.aten.nonzero) or (
            packet is torch.ops.aten.index
            and any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in args[1] if t is not None)
        )
        if sync:
            stack = traceback.extract_stack()[:-1]
            ours = [f for f in stack if f.filename.startswith(str(ROOT / "vlbert"))]
            if ours and not any(f.name == "check_text_inputs" for f in ours):
                self.reads.append(f"{Path(ours[-1].filename).name}:{ours[-1].lineno} {func}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("modality", ["text", "vl", "two-stream", "vl-bert"])
def test_a_training_step_reads_nothing_back_from_the_device(modality):
    """With the collator's unpadded layout and MLM positions, forward and backward of a training step (sdpa, the
    kernel of these machines) never wait on the device: zero host syncs; VL-BERT's pathway, which adds its [END]
    token after the regions, extends the collator's layout on the device (0886c57: it read the mask). Without them
    the model reads the mask: the check sees those reads."""
    ids, mask, labels = ragged_text()
    batch = dict(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids), labels=labels)
    masks = [mask]
    if modality != "text":
        feats, boxes, region_mask = ragged_regions()
        batch.update(region_features=feats, region_boxes=boxes, region_mask=region_mask)
        masks.append(region_mask)
        streams = TWO_STREAM if modality == "two-stream" else VL_BERT if modality == "vl-bert" else {}
        model = VLBertForPreTraining(vl_config(attn_implementation="sdpa", attention_probs_dropout_prob=0.0, **streams))
    else:
        batch["next_sentence_label"] = torch.tensor([0, 1, 0, 1])
        model = vlbert.BertForPreTraining(text_config(attn_implementation="sdpa", attention_probs_dropout_prob=0.0))
    model.train()
    given = {"layout": unpadded_layout(*masks), "masked_lm_positions": masked_positions(labels)}
    with DeviceReads() as mode:
        model(**batch, **given).loss.backward()
    assert mode.reads == []
    if modality == "two-stream":  # each stream's own layout (its collator's), cross-attention on the two
        streams = {"layout": stream_layouts(*masks), "masked_lm_positions": given["masked_lm_positions"]}
        with DeviceReads() as mode:
            model(**batch, **streams).loss.backward()
        assert mode.reads == []
    with DeviceReads() as mode:
        model(**batch).loss.backward()
    # the unpadding (one per stream for two streams) and the masked positions
    assert len(mode.reads) == (3 if modality == "two-stream" else 2), mode.reads


@pytest.mark.slow
def test_the_whole_model_compiles_in_one_graph_and_equals_eager():
    """``torch.compile(model, fullgraph=True)`` of the training forward: one graph, no break (``fullgraph`` raises
    at a break, naming its reason), and the compiled forward + backward equal eager's (dropout 0 so both draw
    nothing). On the CPU the graph goes through everything of inductor's path but its code generation
    (AOTAutograd's functionalisation, inductor's decompositions and the forward/backward partition, then run op by
    op: the ``aot_eager_decomp_partition`` backend), which is where this model's code could break; inductor's C++
    kernels would cost a minute of compilation on a cold cache for what torch's own tests cover. The GPU test
    compiles with inductor: tests/gpu/test_cuda.py."""
    ids, mask, labels = ragged_text()
    batch = dict(
        input_ids=ids,
        attention_mask=mask,
        token_type_ids=torch.zeros_like(ids),
        labels=labels,
        next_sentence_label=torch.tensor([0, 1, 0, 1]),
        layout=unpadded_layout(mask),
        masked_lm_positions=masked_positions(labels),
    )
    torch.manual_seed(0)
    model = vlbert.BertForPreTraining(
        text_config(num_hidden_layers=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ).train()
    hidden, loss, grads = run(model, batch)
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager_decomp_partition")
    c_hidden, c_loss, c_grads = run(compiled, batch)
    torch.testing.assert_close(c_loss, loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c_hidden, hidden, atol=1e-5, rtol=1e-5)
    for name in grads:
        torch.testing.assert_close(c_grads[name], grads[name], atol=1e-5, rtol=1e-4, msg=name)


def tiny_trainer(tmp_path, corpus, tokenizer, precision, **training):
    return tiny_text_trainer(
        tmp_path,
        corpus,
        tokenizer,
        max_length=32,
        model=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
        **{
            "max_steps": 45,
            "batch_size": 8,
            "warmup_steps": 5,
            "learning_rate": 3e-3,
            "log_every": 15,
            "mixed_precision": precision,
            **training,
        },
    )


def test_bf16_weights_with_float32_masters_train_as_float32(tmp_path, small_token_corpus, tokenizer):
    """training.mixed_precision=bf16-params (FSDP2 on one rank): 45 steps track float32 (loss and MLM accuracy of
    the last log windows within bf16's noise), the forward computes with bf16 weights while the optimizer steps the
    float32 (sharded) parameters, and checkpoints hold those: float32 values, which resume exactly."""
    from safetensors.torch import load_file

    runs = {}
    for precision in ("no", "bf16-params"):
        trainer = tiny_trainer(tmp_path / precision, small_token_corpus, tokenizer, precision)
        trainer.train()
        runs[precision] = [
            json.loads(line)
            for line in (tmp_path / precision / "log.jsonl").read_text().splitlines()
            if json.loads(line)["split"] == "train"
        ]
        if precision == "bf16-params":
            assert {p.dtype for p in trainer._optimizer().param_groups[0]["params"]} == {torch.float32}
            with trainer.whole_weights():  # what the forward computes with
                assert {p.dtype for p in trainer.unwrapped.parameters()} == {torch.bfloat16}
    first = runs["no"][0]
    # it learns (the comparison below is not of two flat lines; noisy at batch 8)
    assert min(r["loss"] for r in runs["no"]) < first["loss"] - 1.0
    assert len(runs["no"]) == len(runs["bf16-params"]) == 3
    for fp32, bf16 in zip(runs["no"], runs["bf16-params"], strict=True):  # here: within 0.003 and equal accuracies
        assert abs(bf16["loss"] - fp32["loss"]) < 0.01 * fp32["loss"], (fp32, bf16)
        assert abs(bf16["mlm_accuracy"] - fp32["mlm_accuracy"]) <= 0.03, (fp32, bf16)

    # checkpoints: float32 masters; a resumed run ends where the uninterrupted one did
    whole = tiny_trainer(tmp_path / "whole", small_token_corpus, tokenizer, "bf16-params", max_steps=6)
    whole.train()
    part = tiny_trainer(tmp_path / "part", small_token_corpus, tokenizer, "bf16-params", max_steps=6, save_every=3)
    part.config.max_steps = 3  # stopped after step 3 (the schedule was built for 6), then checkpointed
    part.train()
    part.save_checkpoint()
    saved = load_file(str(tmp_path / "part" / "checkpoints" / "step-3" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}
    assert any((t != t.bfloat16().float()).any() for t in saved.values())  # not rounded weights
    resumed = tiny_trainer(tmp_path / "part", small_token_corpus, tokenizer, "bf16-params", max_steps=6, save_every=3)
    assert resumed.resume()
    resumed.train()
    for a, b in zip(whole.unwrapped.parameters(), resumed.unwrapped.parameters(), strict=True):
        assert a.dtype == torch.float32 and torch.equal(full_tensor(a), full_tensor(b))


def test_a_kernel_registered_as_unpadded_always_gets_the_unpadded_tokens():
    """A kernel that reads cu_seqlens, registered with layout="unpadded", gets the unpadded tokens even when padding
    is under the 5% below which padded kernels run the batch dense: one padded position in forty, float64, equal
    to eager (1e-6). Registered with the default layout (padded) the same function would see the dense batch."""
    from vlbert.layers.attention import _explicit

    def per_sequence(q, k, v, unpadding, dropout_p, training, output_attentions=False):
        assert unpadding.num_tokens == q.shape[0]
        bounds = unpadding.cu_seqlens.tolist()
        rows = [
            _explicit(*(t[a:b].transpose(0, 1)[None] for t in (q, k, v)), None, 0.0, False, False)[0]
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        return torch.cat([r[0].transpose(0, 1) for r in rows]), None

    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 90, (4, 10), generator=g)
    mask = torch.ones(4, 10, dtype=torch.long)
    mask[2, 9] = 0  # 1 of 40 positions is padding
    register_attention("test_unpadded", per_sequence, layout="unpadded")
    try:
        torch.manual_seed(0)
        model = vlbert.BertModel(text_config(attn_implementation="eager")).double().eval()
        reference = model(ids, attention_mask=mask).last_hidden_state
        model.encoder.attn_implementation = "test_unpadded"
        unpadding, kernel = model.encoder.unpadding(mask, 4, 10, "test_unpadded")
        assert kernel == "test_unpadded" and unpadding.num_tokens == 39
        out = model(ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(out[mask.bool()], reference[mask.bool()], atol=1e-6, rtol=0)
        assert model.encoder.unpadding(mask, 4, 10, "sdpa")[0].num_tokens == 40  # a padded kernel: dense
    finally:
        del ATTENTION_FUNCTIONS["test_unpadded"]


def test_flash_is_chosen_only_where_it_runs(monkeypatch, caplog):
    """The selection of the kernel table: varlen (flash) on CUDA in bf16 with compute capability 8.0+, a head size
    that is a multiple of 8 and at most 256, and (with dropout) FlashAttention-2; otherwise sdpa with one log line
    naming the reason; eager for the probabilities; CPU keeps sdpa; an explicit varlen falls back the same way."""
    import vlbert.layers.attention as attention
    from vlbert.layers.attention import AttentionRequest, select_attention

    cuda = torch.device("cuda")
    capability = [(9, 0)]
    monkeypatch.setattr(attention, "cuda_capability", lambda device: capability[0])
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    monkeypatch.setattr(attention, "flash_attention_impl", lambda: None)
    monkeypatch.setattr(attention, "_explained", set())

    def chosen(name=None, dtype=torch.bfloat16, head_dim=64, dropout=0.1, probs=False, device=cuda):
        return select_attention(name, AttentionRequest(device, dtype, head_dim, dropout, probs))

    assert chosen() == "varlen" and chosen("varlen") == "varlen"
    assert chosen(dtype=torch.float32) == "sdpa"
    assert chosen(device=torch.device("cpu")) == "sdpa" and chosen("varlen", device=torch.device("cpu")) == "varlen"
    assert chosen(probs=True) == "eager"
    for head_dim in (26, 264, 260):
        assert chosen(head_dim=head_dim) == "sdpa", head_dim
    assert chosen(head_dim=256) == "varlen" and chosen(head_dim=8) == "varlen"
    capability[0] = (7, 5)
    caplog.clear()
    with caplog.at_level("WARNING", logger="vlbert.layers.attention"):
        assert chosen() == "sdpa" and chosen() == "sdpa" and chosen("varlen") == "sdpa"
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "attention: varlen cannot run here (flash attention needs compute capability 8.0 or newer, "
        "this GPU has 7.5); using sdpa"
    ], said
    capability[0] = (8, 0)
    monkeypatch.setattr(attention, "flash_attention_impl", lambda: "FA3")
    assert chosen(dropout=0.1) == "sdpa" and chosen(dropout=0.0) == "varlen"
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: False)
    assert chosen(dropout=0.0) == "sdpa"


@pytest.mark.parametrize("modality", ["text", "vl"])
def test_gradient_checkpointing_gives_the_plain_step(modality):
    """model.gradient_checkpointing recomputes each layer in the backward: with dropout on (the random state is
    replayed) the loss and every gradient equal the plain step's."""
    ids, mask, labels = ragged_text()
    batch = dict(input_ids=ids, attention_mask=mask, labels=labels)
    if modality == "vl":
        feats, boxes, region_mask = ragged_regions()
        batch.update(
            region_features=feats, region_boxes=boxes, region_mask=region_mask, itm_label=torch.tensor([1, 0, 1, 1])
        )
    else:
        batch["next_sentence_label"] = torch.tensor([0, 1, 0, 1])
    results = []
    for checkpointing in (False, True):
        config = (vl_config if modality == "vl" else text_config)(gradient_checkpointing=checkpointing)
        torch.manual_seed(0)
        model = (VLBertForPreTraining if modality == "vl" else vlbert.BertForPreTraining)(config).train()
        torch.manual_seed(1)
        results.append(run(model, batch))
    (h0, l0, g0), (h1, l1, g1) = results
    torch.testing.assert_close(l1, l0, atol=0, rtol=0)
    assert g0.keys() == g1.keys() and len(g0) > 10
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=1e-7, rtol=1e-6, msg=name)


def test_bf16_params_accumulate_micro_batches_in_float32(tmp_path, small_token_corpus, tokenizer):
    """bf16-params with 4 micro-batches: the float32 gradient the optimizer sees is the float32 sum of the 4
    micro-batch gradients (each the bf16 model's, of loss / 4) within float32 rounding, not bf16's: summing the
    same gradients in bf16, as bf16 .grad accumulation did, is off by orders of magnitude more."""
    trainer = tiny_text_trainer(
        tmp_path / "run",
        small_token_corpus,
        tokenizer,
        max_length=32,
        model=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        ),
        max_steps=1,
        batch_size=8,
        warmup_steps=0,
        learning_rate=1e-3,
        mixed_precision="bf16-params",
        grad_accum_steps=4,
        group_by_length=False,
    )
    model = trainer.unwrapped
    batches = [trainer._to_device(b) for b in itertools.islice(trainer.train_batches(0, 0, 0, 1), 4)]
    grads = []
    for batch in batches:  # each micro-batch's gradient alone, as the bf16 model computes it
        model.zero_grad(set_to_none=True)
        (model(**batch).loss / 4).backward()
        grads.append([full_tensor(p.grad).bfloat16() for p in model.parameters()])  # computed in bf16
    model.zero_grad(set_to_none=True)
    exact = [sum(g[i].double() for g in grads) for i in range(len(grads[0]))]
    in_bf16 = [sum(g[i] for g in grads[1:]) + grads[0][i] for i in range(len(grads[0]))]  # bf16 += bf16

    seen = {}
    clip = trainer._clip_gradients

    def capture():
        seen["masters"] = [full_tensor(p.grad).clone() for p in trainer.unwrapped.parameters()]
        return clip()

    trainer._clip_gradients = capture
    trainer.train()
    scale = max(float(e.abs().max()) for e in exact)
    ours = max(float((m.double() - e).abs().max()) for m, e in zip(seen["masters"], exact, strict=True))
    bf16 = max(float((b.double() - e).abs().max()) for b, e in zip(in_bf16, exact, strict=True))
    assert ours <= 4 * 2.0**-24 * scale, (ours, scale)  # float32 rounding of a sum of 4
    assert bf16 > 100 * ours, (bf16, ours)


ROOFLINE = ROOT.parent / "shared" / "gpu" / "roofline.py"


@pytest.mark.skipif(not ROOFLINE.is_file(), reason="../shared/gpu/roofline.py is not beside the checkout")
def test_the_shared_roofline_proxy_traces_this_checkout(monkeypatch, capsys):
    """The H100 step the project quotes (docs/performance.md) comes from ../shared/gpu/roofline.py, which imports
    tools/benchmark.py as ``benchmark`` and traces its BBC News batch through the model: moving the benchmark must
    not break it. A small batch keeps the trace short; the bf16-params step makes no host sync."""
    spec = importlib.util.spec_from_file_location("roofline_proxy", ROOFLINE)
    roofline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roofline)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the proxy puts tools/ first; undone after the test
    monkeypatch.setattr(sys, "argv", ["roofline.py", "--impl", "vlbert", "--batch-size", "8", "--bf16-params"])
    roofline.main()
    out = capsys.readouterr().out
    assert "predicted H100 step" in out and "host syncs: 0" in out, out


def test_a_compiled_encoder_layer_traces_in_one_graph_and_falls_back_to_eager(caplog):
    """training.compile's regional compilation (vlbert/training/device.py): one encoder layer on the collator's
    unpadded layout (sdpa, training mode, dropout on) traces as one graph with no break (dynamo's explain), so every
    layer of a model reuses it; and when compilation fails (a backend that raises) every layer runs eagerly,
    giving eager's outputs, after one warning."""
    from vlbert.models.bert import BertLayer
    from vlbert.training.device import compile_layers

    ids, mask, _ = ragged_text()
    fields = {"layout": unpadded_layout(mask)}
    unpadding = fields["layout"].unpadding(mask)
    torch.manual_seed(0)
    layer = BertLayer(text_config()).train()
    x = torch.randn(unpadding.num_tokens, 32)
    explained = torch._dynamo.explain(layer)(x, unpadding, "sdpa")
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons

    def broken(graph, inputs):
        raise RuntimeError("no compiler on this machine")

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = vlbert.BertModel(text_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    expected = model(ids, attention_mask=mask, **fields).last_hidden_state
    layers = compile_layers(model, backend=broken)
    assert len(layers) == 2 and all(m._compiled_call_impl is not None for m in layers)
    with caplog.at_level("WARNING", logger="vlbert.training.device"):
        got = model(ids, attention_mask=mask, **fields).last_hidden_state
        again = model(ids, attention_mask=mask, **fields).last_hidden_state
    assert torch.equal(got, expected) and torch.equal(again, expected)
    said = [r.getMessage() for r in caplog.records if r.name == "vlbert.training.device"]
    assert said == [
        "training.compile: compiling the encoder layers failed (RuntimeError: no compiler on this "
        "machine); training eager"
    ], said
    assert all(m._compiled_call_impl is None for m in layers)


def test_the_pair_collators_layout_is_what_the_pair_model_encodes():
    """NLVR2's collator (two images per statement) gives the unpadded layout of the 2B rows (statement i ; image j)
    that :class:`VLBertForImagePairClassification` encodes: its training step with that layout reads nothing back
    from the device (0886c57: the layout read from the mask) and gives the logits and loss of the mask's layout."""
    from types import SimpleNamespace

    from vlbert.models.vl_classification import VLBertForImagePairClassification
    from vlbert.processing.collator import GroundedCollator

    g = torch.Generator().manual_seed(0)

    def image(r):
        return {"region_features": torch.randn(r, 16, generator=g), "region_boxes": torch.rand(r, 4, generator=g)}

    items = [
        {"input_ids": list(range(2, 2 + t)), "images": [image(a), image(b)], "labels": label, "index": i}
        for i, (t, a, b, label) in enumerate([(5, 3, 1, 0), (3, 2, 4, 1), (6, 4, 4, 1)])
    ]
    batch = GroundedCollator(SimpleNamespace(pad_token_id=0), images_per_text=2)(items)
    batch.pop("index")
    layout = {"layout": batch.pop("layout")}
    torch.manual_seed(0)
    model = VLBertForImagePairClassification(
        vl_config(attn_implementation="sdpa", num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    )
    reference = model(**batch)
    with DeviceReads() as mode:
        out = model(**batch, **layout)
        out.loss.backward()
    assert mode.reads == []
    torch.testing.assert_close(out.logits, reference.logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.loss, reference.loss, atol=1e-6, rtol=0)


def test_masked_region_targets_travel_as_the_masked_rows_only():
    """MRC-kl's class distributions go to the GPU as the masked regions' rows [M, ...] (the collator's order,
    ``masked_region_positions``), not as [B, R, ...] copies of every region; MRFR's targets as those rows or, as the
    collator sends them, as their positions in the unzeroed features the batch carries (the model zeroes the masked
    regions' features itself): the same losses and metrics as the padded targets over zeroed features (float64)."""
    ids, mask, _ = ragged_text()
    feats, boxes, region_mask = ragged_regions()
    g = torch.Generator().manual_seed(5)
    masked = region_mask.bool() & (torch.rand(region_mask.shape, generator=g) < 0.4)
    masked[:, 0] = True
    probs = torch.rand(*region_mask.shape, 6, generator=g).softmax(-1).double()
    torch.manual_seed(0)
    model = VLBertForPreTraining(
        vl_config(num_region_classes=6, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ).double()
    batch = dict(
        input_ids=ids,
        attention_mask=mask,
        region_features=feats.masked_fill(masked[..., None], 0).double(),
        region_boxes=boxes.double(),
        region_mask=region_mask,
        masked_regions=masked,
        masked_region_positions=masked.reshape(-1).nonzero().squeeze(1),
        layout=unpadded_layout(mask, region_mask),
    )
    for key, padded in (("region_targets", feats.double()), ("region_labels", probs)):
        full = model(**batch, **{key: padded})
        rows = model(**batch, **{key: padded[masked]})
        assert rows.losses.keys() == full.losses.keys() and len(rows.losses) == 1
        for name in full.losses:
            torch.testing.assert_close(rows.losses[name], full.losses[name], atol=1e-12, rtol=0)
        assert padded[masked].numel() < 0.5 * padded.numel()
        if key == "region_targets":  # positions into the features as given: gathered on the device
            given = {**batch, "region_features": feats.double(), key: batch["masked_region_positions"]}
            gathered = model(**given)
            torch.testing.assert_close(gathered.losses["mrfr"], full.losses["mrfr"], atol=1e-12, rtol=0)
            torch.testing.assert_close(gathered.metrics, full.metrics, atol=1e-12, rtol=0)
