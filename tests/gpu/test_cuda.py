"""On a CUDA GPU (skipped without one): a few steps of text and VL pretraining through the real trainer in bf16
give finite per-step losses equal to the CPU float32 run of the same config within bf16's tolerance.

The CPU reference runs in a child process with ``CUDA_VISIBLE_DEVICES`` empty (the trainer takes the GPU whenever
one is visible); dropout is off so both runs compute the same function on the same batches and masks (drawn on the
host from per-sample seeds). Both runs also train the same objective at every step: the VL mix draws each step's
objective from ``data.objectives`` in the order its entries are written (:meth:`vlbert.objectives.ObjectiveMix.draw`),
so the child's YAML keeps the config's key order, and the two logs' objectives are compared before their losses."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[2]
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
STEPS = 4


def train_losses(out: Path) -> list[float]:
    return [r["loss"] for r in train_records(out)]


def train_records(out: Path) -> list[dict]:
    """The training lines of ``out/log.jsonl``, one dict per logged step."""
    return [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if r["split"] == "train"]


def train_objectives(out: Path) -> list[list[str]]:
    """Per logged training step, the objectives whose losses the line holds (the step's objective in a VL mix)."""
    from vlbert.objectives import OBJECTIVES

    return [sorted(k for k in r if k in OBJECTIVES) for r in train_records(out)]


def cpu_reference(config: dict, out: Path) -> list[float]:
    """The same run in float32 on the CPU, in a child process that sees no GPU. The YAML keeps ``config``'s key order
    (``sort_keys=False``): ``yaml.safe_dump`` sorts keys by default, which reorders ``data.objectives`` and with it
    the objective drawn at each step."""
    path = out.with_suffix(".yaml")
    import yaml

    cpu_config = {**config, "training": {**config["training"], "output_dir": str(out), "mixed_precision": "no"}}
    path.write_text(yaml.safe_dump(cpu_config, sort_keys=False))
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "pretrain.py"), "--modality", config["modality"], "--config", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return train_losses(out)


def assert_close_in_bf16(gpu: list[float], cpu: list[float]) -> None:
    assert len(gpu) == len(cpu) == STEPS
    assert all(math.isfinite(x) for x in gpu)
    for g, c in zip(gpu, cpu, strict=True):
        assert abs(g - c) <= 0.03 * abs(c) + 0.02, (gpu, cpu)  # bf16 keeps 8 bits of mantissa


def test_text_pretraining_in_bf16_on_cuda_equals_cpu_float32(small_corpus, tmp_path):
    from vlbert.recipes import RECIPES, run

    config = {
        "modality": "text",
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            "max_position_embeddings": 64,
            **NO_DROPOUT,
        },
        "data": {
            "corpus": str(small_corpus),
            "max_seq_length": 64,
            "eval_fraction": 0.0,
            "corpus_cache_dir": str(tmp_path / "corpora"),
        },
        "training": {
            "max_steps": STEPS,
            "batch_size": 8,
            "learning_rate": 1e-3,
            "warmup_steps": 1,
            "log_every": 1,
            "progress_bar": False,
            "num_workers": 0,
        },
    }
    cpu = cpu_reference(config, tmp_path / "cpu")
    run(
        RECIPES["text-pretraining"],
        {**config, "training": {**config["training"], "output_dir": str(tmp_path / "gpu"), "mixed_precision": "bf16"}},
    )
    assert_close_in_bf16(train_losses(tmp_path / "gpu"), cpu)


def test_vl_pretraining_in_bf16_on_cuda_equals_cpu_float32(tmp_path):
    from vlbert.recipes import RECIPES, run

    config = {
        "modality": "vl",
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            **NO_DROPOUT,
        },
        "detector": {"input_size": 96, "max_proposals": 16},
        "data": {
            "max_images": 48,
            "cache_dir": str(tmp_path / "regions"),
            "eval_fraction": 0.25,
            "objectives": {"mlm": 1, "mrfr": 1, "mrc_kl": 1, "itm": 1},
        },
        "training": {
            "max_steps": STEPS,
            "batch_size": 8,
            "learning_rate": 1e-3,
            "warmup_steps": 1,
            "log_every": 1,
            "progress_bar": False,
            "num_workers": 0,
        },
    }
    cpu = cpu_reference(config, tmp_path / "cpu")  # extracts the regions into the shared cache first
    run(
        RECIPES["vl-pretraining"],
        {**config, "training": {**config["training"], "output_dir": str(tmp_path / "gpu"), "mixed_precision": "bf16"}},
    )
    assert train_objectives(tmp_path / "gpu") == train_objectives(tmp_path / "cpu")  # the same objective each step
    assert_close_in_bf16(train_losses(tmp_path / "gpu"), cpu)


# ---------------------------------------------------------------- the GPU path as the trainer runs it (issue 38)
# What a CPU machine cannot show: the flash kernels' numbers, their dropout, the fallbacks on real hardware,
# bf16-params (FSDP2: float32 shards) on the device, the tools' default run, compile and NCCL. (Placement and host
# traffic of the step are checked everywhere by tests/gpu/test_gpu_trainer.py on a fake GPU.)


def _flash_capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)


needs_flash = pytest.mark.skipif(not _flash_capable(), reason="flash attention needs compute capability 8.0+")


def _ragged(b=4, t=24, r=0, seed=0):
    """A ragged text (+ regions) batch for a tiny model: input_ids, masks and labels on the GPU."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 90, (b, t), generator=g)
    mask = (torch.arange(t) < torch.tensor([t, t - 7, 5, t - 1][:b])[:, None]).long()
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    batch = {"input_ids": ids * mask, "attention_mask": mask, "labels": labels}
    if r:
        batch.update(
            region_features=torch.randn(b, r, 16, generator=g),
            region_boxes=torch.rand(b, r, 4, generator=g).sort(-1).values,
            region_mask=(torch.arange(r) < torch.tensor([r, 2, r - 1, 1][:b])[:, None]).long(),
            itm_label=torch.tensor([1, 0, 1, 1][:b]),
        )
    else:
        batch["next_sentence_label"] = torch.tensor([0, 1, 0, 1][:b])
    return {k: v.cuda() for k, v in batch.items()}


def _model(kernel, head_dim, regions, dropout=0.0, **model):
    import vlbert
    from vlbert.models.vl import VLBertForPreTraining

    values = {
        "vocab_size": 90,
        "hidden_size": 2 * head_dim,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "attn_implementation": kernel,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": dropout,
    }
    torch.manual_seed(0)
    if regions:
        return VLBertForPreTraining(
            vlbert.VLBertConfig(**values, region_feature_dim=16, num_region_classes=0, **model)
        ).cuda()
    return vlbert.BertForPreTraining(vlbert.BertConfig(**values)).cuda()


@needs_flash
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("regions", [0, 6])
@pytest.mark.parametrize("collator_layout", [False, True])
def test_flash_varlen_equals_eager_in_bf16(head_dim, regions, collator_layout):
    """Under bf16 autocast, varlen (flash) gives eager's real-position outputs, loss and every gradient within
    bf16's tolerance; with the layout from the collator or read from the mask."""
    from vlbert.layers.unpadded import unpadded_layout

    batch = _ragged(r=regions)
    if collator_layout:
        masks = [batch["attention_mask"].cpu()] + ([batch["region_mask"].cpu()] if regions else [])
        batch["layout"] = unpadded_layout(*masks).to("cuda")
    _assert_varlen_equals_eager_in_bf16(batch, head_dim, regions)


def _assert_varlen_equals_eager_in_bf16(batch, head_dim, regions, **model_config):
    """One bf16-autocast training forward + backward of the same model with eager and with varlen: the loss and every
    gradient within bf16's tolerance."""
    results = {}
    for kernel in ("eager", "varlen"):
        model = _model(kernel, head_dim, regions, **model_config).train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**batch)
        out.loss.backward()
        results[kernel] = (
            out.loss.float(),
            {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None},
        )
    (le, ge), (lv, gv) = results["eager"], results["varlen"]
    assert torch.isfinite(lv) and abs(float(lv - le)) <= 0.02 * abs(float(le)) + 1e-3
    assert ge.keys() == gv.keys()
    for name in ge:
        scale = float(ge[name].abs().max()) + 1e-6
        assert float((gv[name] - ge[name]).abs().max()) <= 0.05 * scale, name


@needs_flash
@pytest.mark.parametrize("collator_layout", [False, True])
def test_modernbert_flash_sliding_window_equals_eager_in_bf16(collator_layout):
    """ModernBERT's local layers on flash varlen (``window_size_left`` / ``window_size_right``) against eager's band
    mask: sequences of 40 tokens, a window of +-8, bf16 autocast; loss and every gradient within bf16's tolerance."""
    import vlbert
    from vlbert.layers.unpadded import unpadded_layout

    batch = _ragged(t=40)
    del batch["next_sentence_label"]  # (MLM only)
    batch["labels"][:, 30] = batch["input_ids"][:, 30]  # a target beyond the first window
    batch["labels"][batch["attention_mask"] == 0] = -100
    if collator_layout:
        batch["layout"] = unpadded_layout(batch["attention_mask"].cpu()).to("cuda")
    results = {}
    for kernel in ("eager", "varlen"):
        torch.manual_seed(0)
        config = vlbert.ModernBertConfig(
            vocab_size=96,
            hidden_size=128,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=2,
            max_position_embeddings=64,
            local_attention=16,
            pad_token_id=0,
            attn_implementation=kernel,
        )
        model = vlbert.ModernBertForMaskedLM(config).cuda().train()
        assert model.bert.encoder.kernels(torch.zeros(1, 1, 128, device="cuda", dtype=torch.bfloat16), False) == {
            None: kernel,
            8: kernel,
        }
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**batch)
        out.loss.backward()
        results[kernel] = (out.loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()})
    (le, ge), (lv, gv) = results["eager"], results["varlen"]
    assert torch.isfinite(lv) and abs(float(lv - le)) <= 0.02 * abs(float(le)) + 1e-3
    for name in ge:
        scale = float(ge[name].abs().max()) + 1e-6
        assert float((gv[name] - ge[name]).abs().max()) <= 0.05 * scale, name


@needs_flash
@pytest.mark.parametrize("collator_layout", [False, True])
def test_two_stream_flash_varlen_equals_eager_in_bf16(collator_layout):
    """LXMERT's encoder (issue 42): flash varlen for the text and region self-attention and the cross-attention both
    ways (cu_seqlens_q != cu_seqlens_k), each stream on the collator's layout (stream_layouts) or its own
    mask, with a row whose regions are all masked out (its text attends to no region: flash's zero output for a
    sequence without keys, eager's attention to zero padding), equals eager in bf16: loss and every gradient."""
    from vlbert.layers.unpadded import stream_layouts

    batch = _ragged(r=6)
    batch["region_mask"][3] = 0
    if collator_layout:
        batch["layout"] = stream_layouts(batch["attention_mask"].cpu(), batch["region_mask"].cpu()).to("cuda")
    _assert_varlen_equals_eager_in_bf16(
        batch,
        64,
        6,
        encoder="two-stream",
        l_layers=1,
        r_layers=1,
        x_layers=1,
        region_embedding="lxmert",
        region_location_dim=4,
    )


@needs_flash
def test_flash_dropout_reproduces_keeps_the_rate_and_its_backward_matches_its_mask():
    """The flash path with attention dropout: the same CUDA seed gives the same output; q = k = 0 makes every
    probability 1/L, v = identity makes the output the dropped probabilities themselves, so the share of non-zero
    entries is the keep rate; the backward equals an explicit attention's with the mask flash returns."""
    from vlbert.layers.attention import _FlashVarlen

    p, length, heads, d = 0.25, 64, 4, 64
    cu = torch.tensor([0, length, 2 * length], dtype=torch.int32, device="cuda")
    q = torch.zeros(2 * length, heads, d, device="cuda", dtype=torch.bfloat16)
    eye = torch.eye(length, d, device="cuda", dtype=torch.bfloat16)
    v = eye[:, None, :].expand(length, heads, d).repeat(2, 1, 1).contiguous()
    outs = []
    for _ in range(2):
        torch.cuda.manual_seed(7)
        outs.append(_FlashVarlen.apply(q, q, v, cu, cu, length, length, p))
    assert torch.equal(outs[0], outs[1])
    kept = float((outs[0][:, :, :length] != 0).float().mean())
    assert abs(kept - (1 - p)) < 0.02, kept
    # backward against the explicit attention with flash's own mask (return_debug_mask: dropped entries negative)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (
        torch.randn(length, heads, d, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
        for _ in range(3)
    )
    cu1 = cu[:2]
    out, lse, seed, offset, debug = torch.ops.aten._flash_attention_forward(
        q, k, v, cu1, cu1, length, length, p, False, True
    )
    keep = (debug[0, :, :length, :length] >= 0).float()  # [heads, L, L]
    grad_out = torch.randn_like(out)
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        grad_out, q, k, v, out, lse, cu1, cu1, length, length, p, False, seed, offset
    )
    qf, kf, vf = (t.detach().float().transpose(0, 1).requires_grad_() for t in (q, k, v))
    probs = torch.softmax(qf @ kf.transpose(-1, -2) / d**0.5, -1) * keep / (1 - p)
    ref = (probs @ vf).transpose(0, 1)
    ref.backward(grad_out.float())
    for mine, theirs in ((dq, qf.grad), (dk, kf.grad), (dv, vf.grad)):
        theirs = theirs.transpose(0, 1)
        assert float((mine.float() - theirs).abs().max()) <= 0.05 * float(theirs.abs().max())


def test_fallbacks_run_on_this_gpu():
    """A head size flash cannot take (26) and float32 run sdpa, equal to eager; with the capability reported as 7.5
    the default also runs sdpa."""
    from unittest import mock

    import vlbert.layers.attention as attention

    batch = _ragged()
    for head_dim, autocast in ((13, True), (32, False)):
        model = _model(None, head_dim, 0).eval()
        assert (
            model.bert.encoder.select_attention(
                torch.zeros(1, device="cuda", dtype=torch.bfloat16 if autocast else torch.float32)
            )
            == "sdpa"
        )
    with mock.patch.object(attention, "cuda_capability", lambda device: (7, 5)):
        model = _model(None, 32, 0).eval()
        assert model.bert.encoder.select_attention(torch.zeros(1, device="cuda", dtype=torch.bfloat16)) == "sdpa"
        with torch.autocast("cuda", dtype=torch.bfloat16):
            fallback = model(**batch).loss.float()
        model.bert.encoder.attn_implementation = "eager"
        with torch.autocast("cuda", dtype=torch.bfloat16):
            eager = model(**batch).loss.float()
    assert abs(float(fallback - eager)) <= 0.02 * abs(float(eager))


def _gpu_text_config(corpus, out, **training):
    return {
        "modality": "text",
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            "max_position_embeddings": 64,
            **NO_DROPOUT,
        },
        "data": {
            "corpus": str(corpus),
            "max_seq_length": 64,
            "eval_fraction": 0.0,
            "corpus_cache_dir": str(Path(out).parent / "corpora"),
        },
        "training": {
            "output_dir": str(out),
            "max_steps": 50,
            "batch_size": 8,
            "learning_rate": 1e-3,
            "warmup_steps": 5,
            "log_every": 10,
            "progress_bar": False,
            **training,
        },
    }


@pytest.mark.parametrize("accumulation", [1, 4])
def test_bf16_params_on_cuda_track_float32(small_corpus, tmp_path, accumulation):
    """50 steps of bf16-params (FSDP2: bf16 compute over float32 shards) on the GPU track float32 on the GPU (log
    windows within bf16's noise), float32 weights and optimizer state on the device."""
    from vlbert.recipes import RECIPES, run

    windows = {}
    for precision in ("no", "bf16-params"):
        out = tmp_path / precision
        run(
            RECIPES["text-pretraining"],
            _gpu_text_config(small_corpus, out, mixed_precision=precision, grad_accum_steps=accumulation),
        )
        windows[precision] = train_losses(out)
    assert len(windows["no"]) == len(windows["bf16-params"]) == 5
    for fp32, bf16 in zip(windows["no"], windows["bf16-params"], strict=True):
        assert math.isfinite(bf16) and abs(bf16 - fp32) <= 0.03 * fp32, windows


def test_a_poisoned_step_is_skipped_on_cuda(small_corpus, tmp_path):
    """training.on_nonfinite=skip with bf16-params on the GPU: a step whose forward is poisoned (NaN embeddings)
    leaves every float32 weight (FSDP2's shards) as it was (the fused AdamW reads found_inf on the device), and the
    run goes on: one skipped step, finite losses after it."""
    from vlbert.recipes import RECIPES, run
    from vlbert.training.hooks import TrainerHook

    def float32_weights(trainer):
        return [p.detach().to_local().clone() for p in trainer.unwrapped.parameters()]

    class Poison(TrainerHook):
        before = handle = None

        def before_step(self, trainer):
            if trainer.step == 2:
                self.before = float32_weights(trainer)
                self.handle = trainer.unwrapped.bert.embeddings.register_forward_hook(lambda m, i, o: o * float("nan"))

        def after_step(self, trainer):
            if trainer.step == 3:
                self.handle.remove()
                assert all(torch.equal(a, b) for a, b in zip(self.before, float32_weights(trainer), strict=True))

    config = _gpu_text_config(small_corpus, tmp_path / "run", max_steps=6, on_nonfinite="skip", log_every=1)
    metrics = run(RECIPES["text-pretraining"], config, hooks=[Poison()])
    assert metrics["skipped_steps"] == 1
    assert all(math.isfinite(x) for x in train_losses(tmp_path / "run")[3:])


def random_minilm_overrides() -> list[str]:
    """``--set`` overrides that start the VL default run from a random initialisation of the packaged MiniLM's
    architecture (read from its config.json, which travels) instead of its weights: ``init_from=null`` and the
    ``model`` entries that ``init_from: minilm`` would have decided."""
    from vlbert.tokenization import packaged_minilm_dir

    config = json.loads((packaged_minilm_dir() / "config.json").read_text())
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_position_embeddings")
    return ["init_from=null", *(f"model.{key}={config[key]}" for key in keys)]


@pytest.mark.parametrize("modality", ["text", "vl"])
def test_the_default_tools_train_on_the_gpu_with_dropout(modality, tmp_path):
    """tools/pretrain.py --modality text|vl as a user runs it (defaults: bf16-params, flash, dropout on), a few
    steps: finite losses, step time and MFU in every log line. The VL default, which a user starts from the
    packaged MiniLM's weights, starts here from a random initialisation of the same architecture on every machine:
    what is tested is the GPU path, not the weights, and the weights (87 MiB) cannot travel to the GPU machine
    (../shared/gpu/README.md, prepare.sh: only MiniLM's tokenizer and config.json do)."""
    out = tmp_path / modality
    overrides = ["training.log_every=5"]
    if modality == "vl":
        overrides += random_minilm_overrides()
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "pretrain.py"),
            "--modality",
            modality,
            "--output-dir",
            str(out),
            "--max-steps",
            "20",
            *(arg for override in overrides for arg in ("--set", override)),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if r["split"] == "train"]
    assert len(lines) == 4 and all(math.isfinite(r["loss"]) for r in lines)
    assert all(r["step_time_s"] > 0 and 0 < r["mfu"] < 1 for r in lines)


def test_compile_on_cuda_equals_eager(small_corpus, tmp_path):
    """training.compile on the GPU (true: each encoder layer compiled, as the default ``auto`` does on CUDA): the
    same losses as eager within bf16's tolerance, dropout off."""
    from vlbert.recipes import RECIPES, run

    losses = {}
    for compiled in (False, True):
        out = tmp_path / str(compiled)
        run(RECIPES["text-pretraining"], _gpu_text_config(small_corpus, out, max_steps=20, compile=compiled))
        losses[compiled] = train_losses(out)
    for a, b in zip(losses[False], losses[True], strict=True):
        assert abs(a - b) <= 0.03 * a, losses


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_over_nccl_equal_one_at_twice_the_batch(small_corpus, tmp_path):
    """Two GPUs over NCCL with bf16-params (FSDP2: float32 reduce-scatter of the gradients): per-step losses of 2
    GPUs at batch b equal 1 GPU at 2b within bf16's tolerance."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    one, two = tmp_path / "one", tmp_path / "two"
    from vlbert.recipes import RECIPES, run

    run(RECIPES["text-pretraining"], _gpu_text_config(small_corpus, one, max_steps=10, batch_size=8, log_every=1))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    import yaml

    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(_gpu_text_config(small_corpus, two, max_steps=10, batch_size=4, log_every=1)))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(port),
            str(ROOT / "tools" / "pretrain.py"),
            "--modality",
            "text",
            "--config",
            str(path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for a, b in zip(train_losses(one), train_losses(two), strict=True):
        assert abs(a - b) <= 0.03 * a + 0.01


class _Stop(Exception):
    pass


def _syncs_are_errors():
    """A trainer hook: after step 1 every synchronising CUDA call raises (``torch.cuda.set_sync_debug_mode``);
    it stops the run after step 3, before the end of training reads the losses back."""
    from vlbert.training.hooks import TrainerHook

    class SyncsAreErrors(TrainerHook):
        def after_step(self, trainer):
            if trainer.step == 1:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            elif trainer.step == 3:
                torch.cuda.set_sync_debug_mode("default")
                raise _Stop

    return SyncsAreErrors()


@pytest.mark.parametrize("modality", ["text", "vl"])
def test_steps_after_the_first_never_synchronise(small_corpus, tmp_path, modality):
    """The default GPU run of each pretraining recipe (bf16-params, flash, compiled layers, loader workers): steps 2
    and 3 run with ``torch.cuda.set_sync_debug_mode("error")``, so any host wait in them (a ``.item()``, a
    ``nonzero``, a blocking copy) raises. The fake GPU counts the same waits on every machine
    (tests/gpu/test_gpu_trainer.py)."""
    from vlbert.recipes import RECIPES, run

    config = _gpu_text_config(small_corpus, tmp_path / "run", max_steps=10, log_every=100)
    if modality == "vl":
        config = {
            "modality": "vl",
            "tokenizer": "minilm",
            "model": {k: v for k, v in config["model"].items() if k != "max_position_embeddings"},
            "detector": {"input_size": 96, "max_proposals": 16},
            "data": {"max_images": 48, "cache_dir": str(tmp_path / "regions"), "eval_fraction": 0.0},
            "training": config["training"],
        }
    try:
        with pytest.raises(_Stop):
            run(RECIPES[f"{modality}-pretraining"], config, hooks=[_syncs_are_errors()])
    finally:
        torch.cuda.set_sync_debug_mode("default")
