"""The GPU path of the trainer as the tools run it, checked on a CPU machine (issue 38).

Each test runs :func:`vlbert.recipes.run` from a run config, the way ``tools/pretrain.py`` does, inside
:class:`fake_cuda.FakeCuda`: a process with one (fake) CUDA GPU, where the trainer picks its defaults
(``mixed_precision: auto`` -> bf16 weights with float32 masters, ``attn_implementation`` unset, dropout on) and
everything placed on the GPU is a fake tensor. A hook stops the run after three optimizer steps and checks what a
GPU run cannot show without a profiler: where every parameter, gradient, master and optimizer state lives, which
attention kernel ran, and that a step which does not log reads nothing back from the device.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.builders import write_easy_vqa_shards
from helpers.fake_cuda import FLASH, FakeCuda, placement_errors

from vlbert.recipes import RECIPES, run
from vlbert.training.hooks import TrainerHook

N_IMAGES = 16


class _Stop(Exception):
    pass


class Probe(TrainerHook):
    """After step 1 (which creates the optimizer's state): placement; steps 2 and 3 are recorded (ops, host
    syncs, device-to-host copies); then the run is stopped."""

    def __init__(self, gpu: FakeCuda, steps: int = 3):
        self.gpu, self.steps = gpu, steps
        self.errors: list[str] = []
        self.precision = None
        self.device = None

    def after_step(self, trainer) -> None:
        if trainer.step == 1:
            self.precision, self.device = trainer.precision, trainer.accelerator.device
            self.config = trainer.unwrapped.config
            self.errors = placement_errors(trainer)
            self.master_dtypes = {p.dtype for g in trainer._optimizer().param_groups for p in g["params"]}
            with trainer.whole_weights():  # what the forward computes with (FSDP2 keeps float32 shards between)
                self.model_dtypes = {p.dtype for p in trainer.unwrapped.parameters()}
            self.gpu.clear()
        if trainer.step == self.steps:
            raise _Stop


def text_config(output_dir, corpus, accumulation: int, **model) -> dict:
    return {
        "modality": "text",
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
            **model,
        },
        "data": {
            "corpus": str(corpus),
            "max_seq_length": 64,
            "eval_fraction": 0.0,
            "corpus_cache_dir": str(Path(corpus).parent / "gpu-trainer-corpora"),
        },  # tokenised once
        "training": {
            "output_dir": str(output_dir),
            "max_steps": 10,
            "batch_size": 4,
            "learning_rate": 1e-3,
            "warmup_steps": 2,
            "log_every": 1000,
            "eval_every": 0,
            "progress_bar": False,
            "grad_accum_steps": accumulation,
            "num_workers": 0,
        },  # pinned memory needs a driver
    }


#: LXMERT's two-stream encoder (issue 42), one layer per stream.
TWO_STREAM = {
    "encoder": "two-stream",
    "l_layers": 1,
    "r_layers": 1,
    "x_layers": 1,
    "region_embedding": "lxmert",
    "region_location_dim": 4,
}


def vl_config(output_dir, shards, accumulation: int, **model) -> dict:
    return {
        "modality": "vl",
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            **model,
        },
        "data": {
            "shards": str(shards),
            "max_images": N_IMAGES,
            "eval_fraction": 0.0,
            "objectives": {"mlm": 1, "mrfr": 1, "mrc_kl": 1, "itm": 1},
        },
        "training": {
            "output_dir": str(output_dir),
            "max_steps": 10,
            "batch_size": 4,
            "learning_rate": 1e-3,
            "warmup_steps": 2,
            "log_every": 1000,
            "eval_every": 0,
            "progress_bar": False,
            "grad_accum_steps": accumulation,
            "num_workers": 0,
        },
    }


def run_on_fake_gpu(recipe: str, config: dict, capability=(9, 0)) -> tuple[Probe, FakeCuda]:
    with FakeCuda(capability) as gpu:
        probe = Probe(gpu)
        with pytest.raises(_Stop):
            run(RECIPES[recipe], config, hooks=[probe])
    return probe, gpu


@pytest.fixture(scope="module")
def region_shards(tmp_path_factory):
    """Region shards of 16 easy-VQA training images and 4 test images (the fine-tuning recipes' held-out data),
    extracted on the CPU (outside the fake GPU)."""
    return write_easy_vqa_shards(tmp_path_factory.mktemp("regions") / "shards", N_IMAGES, test=4)


def assert_gpu_step(probe: Probe, gpu: FakeCuda, flash: bool = True) -> None:
    assert probe.device.type == "cuda" and probe.precision == "bf16-params"
    assert probe.errors == [], "not on the GPU:\n" + "\n".join(probe.errors[:20])
    assert probe.master_dtypes == {torch.float32} and probe.model_dtypes == {torch.bfloat16}
    assert gpu.host_syncs == [], "host syncs in a step that does not log:\n" + "\n".join(gpu.host_syncs)
    assert gpu.device_to_host == [], "device-to-host copies:\n" + "\n".join(gpu.device_to_host)
    assert (gpu.ops[FLASH] > 0) == flash, dict(gpu.ops)
    assert_fed_ahead(gpu)


def assert_fed_ahead(gpu: FakeCuda, batches: int = 2) -> None:
    """The batches of steps 2 and 3 reached the GPU as the feed sends them (vlbert/training/feed.py): every copy
    on a side stream, never the compute stream; the compute stream waits (on the device) for each handed-over
    batch's copy event, recorded on that side stream, and records each of its tensors (so their memory is not
    reused under it); at least ``batches`` batches. (FSDP2's own streams, for its all-gathers and reduce-scatters,
    wait on the compute stream and it on them: none of them copies from the host.)"""
    streams = {copy.stream for copy in gpu.host_to_device}
    assert gpu.host_to_device and "compute" not in streams, [(c.line, c.stream) for c in gpu.host_to_device]
    waits = [entry for entry in gpu.stream_log if entry[0] == "wait" and entry[2] in streams]
    assert len(waits) >= batches and all(w[1] == "compute" and w[2] in streams for w in waits), gpu.stream_log
    records = [entry for entry in gpu.stream_log if entry[0] == "record"]
    assert len(records) >= len(waits) and all(r[1] == "compute" for r in records), gpu.stream_log


@pytest.mark.parametrize("accumulation", [1, 4])
def test_text_pretraining_step_lives_on_the_gpu(small_corpus, tmp_path, accumulation):
    probe, gpu = run_on_fake_gpu("text-pretraining", text_config(tmp_path / "run", small_corpus, accumulation))
    assert_gpu_step(probe, gpu)


@pytest.mark.parametrize("accumulation,model", [(4, {}), (1, TWO_STREAM)], ids=["single-stream", "two-stream"])
def test_vl_pretraining_step_lives_on_the_gpu(region_shards, tmp_path, accumulation, model):
    """Accumulation 1 of the single-stream model: the text test's path. The two-stream model (at accumulation 1):
    its collator gives each stream's layout (the recipe's switch), and every attention of steps 2 and 3 is flash
    varlen: per step 2 text and 2 region self-attentions (language/object layer, cross layer) and the cross-attention
    both ways, 6 forward and 6 backward kernels, no SDPA, no host sync (vlbert/models/two_stream.py)."""
    probe, gpu = run_on_fake_gpu("vl-pretraining", vl_config(tmp_path / "run", region_shards, accumulation, **model))
    assert_gpu_step(probe, gpu)
    if model:
        assert gpu.ops[FLASH] == gpu.ops["aten._flash_attention_backward"] == 2 * 6, dict(gpu.ops)
        assert not [op for op in gpu.ops if "scaled_dot_product" in op or "efficient_attention" in op], dict(gpu.ops)


def assert_regions_travel_once(gpu: FakeCuda, feature_dim: int) -> None:
    """Every host-to-device copy of region-feature rows (last dimension ``feature_dim``) is a batch's padded
    ``region_features`` [B, R, D]: no second copy of some of its rows (MRFR's targets are gathered on the device from
    the features the batch sends)."""
    rows = [c for c in gpu.host_to_device if c.shape[-1:] == (feature_dim,)]
    assert rows and all(len(c.shape) == 3 for c in rows), [(c.shape, c.dtype, c.line) for c in rows]


@pytest.mark.parametrize("objective", ["mrfr", "mrc_kl"])
def test_masked_region_steps_send_the_region_features_once(region_shards, tmp_path, objective):
    """Steps 2 and 3 of VL pretraining on masked-region batches alone: no host wait, and the region features reach
    the GPU once per batch, unzeroed; the masked regions are zeroed on the device and MRFR regresses the features
    it gathers there (9312472 and before: MRFR's targets travelled as a second host tensor [M, D], the masked rows
    of the features)."""
    config = vl_config(tmp_path / "run", region_shards, 1)
    config["data"]["objectives"] = {objective: 1}
    probe, gpu = run_on_fake_gpu("vl-pretraining", config)
    assert_gpu_step(probe, gpu)
    assert gpu.ops["aten.mse_loss" if objective == "mrfr" else "aten._log_softmax"] > 0, dict(gpu.ops)
    assert_regions_travel_once(gpu, probe.config.region_feature_dim)


def test_an_older_gpu_runs_sdpa_instead_of_flash(small_corpus, tmp_path):
    """A T4 (compute capability 7.5): flash attention cannot run there; the step runs SDPA."""
    probe, gpu = run_on_fake_gpu("text-pretraining", text_config(tmp_path / "run", small_corpus, 1), (7, 5))
    assert_gpu_step(probe, gpu, flash=False)
    assert (
        gpu.ops["aten._scaled_dot_product_efficient_attention"]
        + gpu.ops["aten._efficient_attention_forward"]
        + gpu.ops["aten.bmm"]
        > 0
    )


def test_a_head_size_flash_cannot_take_runs_sdpa(small_corpus, tmp_path):
    """TinyBERT's head size, 312 / 12 = 26, is not a multiple of 8: flash cannot take it."""
    config = text_config(tmp_path / "run", small_corpus, 1, hidden_size=52, num_attention_heads=2)
    probe, gpu = run_on_fake_gpu("text-pretraining", config)
    assert_gpu_step(probe, gpu, flash=False)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, tokenizer):
    """A one-layer text BERT (hidden 32) saved with the MiniLM tokenizer: the fine-tuning runs' ``init_from``."""
    import vlbert

    path = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = vlbert.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    vlbert.BertModel(config).save_pretrained(path, tokenizer=tokenizer)
    return path


def finetuning_config(task: str, output_dir, init, shards, tmp_path) -> dict:
    """A fine-tuning run of ``task`` from ``init`` at its defaults (bf16-params on the GPU, the recipe's collator
    and model); region tasks on easy-VQA with the module's shards, text classification on 16 rows."""
    training = {
        "output_dir": str(output_dir),
        "max_steps": 10,
        "batch_size": 4,
        "learning_rate": 1e-3,
        "warmup_steps": 2,
        "log_every": 1000,
        "eval_every": 0,
        "progress_bar": False,
        "num_workers": 0,
    }
    if task == "text":
        rows = [{"text": f"row {i} is about {'sport' if i % 2 else 'money'}", "label": "ab"[i % 2]} for i in range(16)]
        path = tmp_path / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        data = {
            "dataset": "custom",
            "type": "classification",
            "train": str(path),
            "eval": str(path),
            "max_seq_length": 32,
        }
    else:
        data = {
            "dataset": "easy-vqa",
            "shards": str(shards),
            "max_regions": 6,
            **(
                {"max_train_images": 8, "max_eval_images": 4, "shortlist": 2}
                if task == "retrieval"
                else {"max_train_examples": 16, "max_eval_examples": 4}
            ),
        }
    return {"task": task, "init_from": str(init), "data": data, "training": training}


#: host syncs (blocking host-to-device copies included) in steps 2 and 3 of each recipe's default run on 0886c57:
#: text 8 (the layout read from the mask: nonzero; labels checked on the host), vqa 2, retrieval 14 (3 layouts, the
#: [CLS]/[SEP] ids read back, 2 blocking copies a step), snli-ve 2; each now 0.
@pytest.mark.parametrize("task", ["text", "vqa", "retrieval", "snli-ve"])
def test_a_finetuning_step_makes_the_host_wait_for_nothing(task, region_shards, tiny_bert, tmp_path):
    """Steps 2 and 3 of each fine-tuning recipe's default GPU run (bf16 weights, float32 masters, flash attention):
    every parameter, gradient and master on the GPU, no host synchronisation and no blocking host-to-device copy
    (the collators give the unpadded layouts; text classification checks its labels on the device; retrieval's
    ITM pass over pairs drawn on the device runs padded), nothing read back."""
    probe, gpu = run_on_fake_gpu(task, finetuning_config(task, tmp_path / "run", tiny_bert, region_shards, tmp_path))
    assert_gpu_step(probe, gpu)
    assert gpu.host_to_device and not any(copy.blocking for copy in gpu.host_to_device)


def test_several_processes_weight_their_losses_without_a_host_wait():
    """With several processes each objective's loss is weighted by this rank's share of the global batch's
    predictions (training/distributed.py): the counts reach the GPU in one copy the host does not wait for
    (0886c57: one blocking copy per objective per micro-batch), a count already on the device stays there; and the
    weights are those of the global batch (two ranks holding the same micro-batch: weight 1 each, the global loss
    the per-objective means' sum)."""
    from types import SimpleNamespace

    from vlbert.models.outputs import ObjectiveOutput
    from vlbert.training.distributed import global_batch_loss

    acc = SimpleNamespace(num_processes=2, reduce=lambda t, reduction: t * 2)  # two ranks with the same batch
    names = ("mlm", "itm", "qa")

    def output(device):
        out = ObjectiveOutput()
        out.add("mlm", torch.tensor(2.0, device=device, requires_grad=True), "mlm_accuracy", torch.tensor(0.5), 7)
        out.add(
            "qa",
            torch.tensor(4.0, device=device, requires_grad=True),
            "qa_accuracy",
            torch.tensor(0.5),
            torch.tensor(3, device=device),
        )  # counted on the device
        return out

    backward, global_loss = global_batch_loss(output("cpu"), names, acc)
    assert float(backward.detach()) == 6.0 and float(global_loss) == 6.0  # itm absent from the global batch: weight 0
    with FakeCuda() as gpu:
        out = output("cuda")
        gpu.clear()
        backward, global_loss = global_batch_loss(out, names, acc)
    assert backward.device.type == global_loss.device.type == "cuda"
    assert gpu.host_syncs == [] and gpu.device_to_host == [], gpu.host_syncs + gpu.device_to_host
    assert [copy.blocking for copy in gpu.host_to_device] == [False]


class _Precision(TrainerHook):
    """Keeps the trainer and the dtype of the encoder's output in its steps."""

    def before_train(self, trainer) -> None:
        self.trainer, self.dtypes = trainer, []
        encoder = trainer.unwrapped.bert.encoder
        self.handle = encoder.register_forward_hook(lambda m, i, out: self.dtypes.append(out.last_hidden_state.dtype))

    def after_train(self, trainer, metrics) -> None:
        self.handle.remove()


def test_runs_of_any_precision_and_device_follow_each_other_in_one_process(
    small_corpus, small_token_corpus, tokenizer, tmp_path
):
    """accelerate keeps one state per process and refuses a second precision (``AcceleratorState has already been
    initialized``); each Trainer owns its precision and device, so one interpreter (a notebook calling run() again,
    the GPU suite in one process) runs ``bf16`` (autocast: the encoder computes in bf16 over float32 weights), then
    ``no`` (float32), then ``bf16-params`` (bf16 weights), with no reset between them; then a trainer on the fake
    GPU and one on the CPU again are each on their own device (accelerate's state restarted for the second), and
    the first trainer's autocast and device are still its own."""
    from helpers.builders import tiny_text_trainer

    def trainer(name, precision, **training):
        return tiny_text_trainer(
            tmp_path / name,
            small_token_corpus,
            tokenizer,
            max_length=32,
            hooks=training.pop("hooks", ()),
            model=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
            max_steps=1,
            batch_size=2,
            mixed_precision=precision,
            **training,
        )

    seen = {name: _Precision() for name in ("bf16", "no", "bf16-params")}
    trainer("bf16", "bf16", hooks=[seen["bf16"]]).train()
    config = text_config(tmp_path / "no", small_corpus, 1)  # a notebook's second run(), in another precision
    config["training"].update(max_steps=1, batch_size=2, mixed_precision="no")
    run(RECIPES["text-pretraining"], config, hooks=[seen["no"]])
    trainer("bf16-params", "bf16-params", hooks=[seen["bf16-params"]]).train()
    dtypes = {name: set(p.dtypes) for name, p in seen.items()}
    assert dtypes == {"bf16": {torch.bfloat16}, "no": {torch.float32}, "bf16-params": {torch.bfloat16}}, dtypes
    with FakeCuda():
        gpu = trainer("gpu", "auto")
    cpu = trainer("cpu", "no")
    first = seen["bf16"].trainer
    assert (gpu.device.type, gpu.precision, cpu.device.type, first.device.type) == ("cuda", "bf16-params", "cpu", "cpu")
    assert {p.device.type for p in cpu.unwrapped.parameters()} == {"cpu"}
    assert {p.dtype for p in first.unwrapped.parameters()} == {torch.float32}
    with first.autocast():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with seen["no"].trainer.autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_a_float32_cuda_run_uses_tf32_and_gpu_runs_compile_their_layers(small_token_corpus, tokenizer, tmp_path):
    """On the (fake) GPU: a float32 run (mixed_precision no) turns TF32 on for its matmuls (as transformers' tf32
    flag; its MFU is reported against the TF32 peak), a bf16-params run and a CPU run leave float32 as it was,
    ``training.tf32: false`` sets full float32 (also after a run that turned TF32 on); ``training.compile`` (auto) compiles each encoder layer on the GPU (regional
    compilation), nothing on the CPU, and ``false`` nothing anywhere; another value is refused (bad-input row
    102)."""
    from helpers.builders import tiny_text_trainer

    from vlbert.models.bert import BertLayer

    def build(name, **training):
        return tiny_text_trainer(
            tmp_path / name,
            small_token_corpus,
            tokenizer,
            max_length=32,
            model=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
            **training,
        )

    def compiled(trainer):
        return [m._compiled_call_impl is not None for m in trainer.unwrapped.modules() if isinstance(m, BertLayer)]

    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        seen = {}
        for name, training in {
            "bf16-params": {},
            "tf32-off": {"mixed_precision": "no", "tf32": False},
            "eager": {"compile": False},
            "float32": {"mixed_precision": "no"},
        }.items():
            with FakeCuda():
                trainer = build(name, **training)
            seen[name] = torch.get_float32_matmul_precision(), compiled(trainer)
        cpu = build("cpu", mixed_precision="no")
        assert seen == {
            "bf16-params": ("highest", [True, True]),
            "tf32-off": ("highest", [True, True]),
            "eager": ("highest", [False, False]),
            "float32": ("high", [True, True]),
        }, seen
        assert torch.backends.cudnn.allow_tf32 and compiled(cpu) == [False, False]
        # A float32 run with tf32 off after one with it on, in the same process: full float32 (it kept "high").
        with FakeCuda():
            build("on", mixed_precision="no")
            build("off", mixed_precision="no", tf32=False)
        assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
        # When a run ends, the flags it replaced come back (the run on the CPU carries a CUDA run's record).
        done = build("done", mixed_precision="no", max_steps=1, eval_every=0)
        done._tf32_replaced = ("medium", True)
        done.train()
        assert torch.get_float32_matmul_precision() == "medium" and torch.backends.cudnn.allow_tf32
        with pytest.raises(
            ValueError, match=r"training.compile must be a bool .*'auto', 'model', 'layers', got 'fast'"
        ):
            build("bad", compile="fast")
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


def test_an_itc_step_with_momentum_and_queue_makes_the_host_wait_for_nothing(region_shards, tmp_path):
    """Steps 2 and 3 of ITC alone with ALBEF's momentum model (sharded as the model under bf16-params: its update
    after each step is one foreach lerp of its float32 shards, its forwards gather bf16 weights), its queue (written at rows chosen on the device) and soft targets:
    no host synchronisation, nothing read back; the momentum copy and its queue live on the GPU."""
    config = vl_config(tmp_path / "run", region_shards, 1)
    config["data"]["objectives"] = {"itc": 1}
    config["data"]["itc"] = {"momentum": 0.995, "queue_size": 16, "alpha": 0.4, "alpha_ramp_steps": 2}
    probe, gpu = run_on_fake_gpu("vl-pretraining", config)
    assert_gpu_step(probe, gpu)
    assert gpu.ops["aten._foreach_lerp_"] == 2 and gpu.ops["aten.index_copy_"] == 3 * 2, dict(gpu.ops)  # 3 queues
