"""End-to-end text pretraining on real text with a tiny BERT: outputs, HF-loadable checkpoint, exact resume,
and refusals of bad configuration before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from helpers.builders import tool
from helpers.tool_errors import one_line_error

import vlbert
from vlbert.commands import run_tool
from vlbert.recipes import RECIPES, run
from vlbert.training.trainer import Trainer


def run_text_pretraining(config: dict, resume: bool = False, overwrite: bool = False) -> dict:
    return run(RECIPES["text-pretraining"], config, resume, overwrite)


def tiny_run_config(corpus, output_dir, **training):
    return {
        "modality": "text",
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
        },
        "data": {"corpus": str(corpus), "max_seq_length": 64, "eval_fraction": 0.1},
        "training": {
            "output_dir": str(output_dir),
            "max_steps": 8,
            "batch_size": 8,
            "learning_rate": 1e-3,
            "warmup_steps": 2,
            "log_every": 1,
            "progress_bar": False,
            **training,
        },
    }


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "log.jsonl").read_text().splitlines()]


def test_run_writes_outputs_and_a_transformers_checkpoint(small_corpus, tmp_path):
    out = tmp_path / "run"
    metrics = run_text_pretraining(tiny_run_config(small_corpus, out, save_every=4))
    train_log = [r for r in read_log(out) if r["split"] == "train"]
    assert [r["step"] for r in train_log] == list(range(1, 9))
    assert all({"loss", "mlm", "nsp", "mlm_accuracy", "nsp_accuracy", "tokens_per_s"} <= set(r) for r in train_log)
    assert train_log[-1]["loss"] < train_log[0]["loss"]
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["step"] == 8
    # metrics.json carries the final evaluation the log wrote, and the log's training lines say where time went.
    final_eval = [r for r in read_log(out) if r["split"] == "eval"][-1]
    assert all(saved[k] == pytest.approx(final_eval[k]) for k in ("eval_mlm_accuracy", "eval_nsp_accuracy"))
    assert all(0 <= r["data_wait_fraction"] < 1 and r["step_time_s"] > 0 for r in train_log)
    assert 0 < saved["eval_mlm_accuracy_majority_baseline"] < 1
    assert metrics["eval_mlm_loss"] == pytest.approx(saved["eval_mlm_loss"])
    assert (out / "config.yaml").is_file() and (out / "checkpoints" / "step-4" / "training_state.pt").is_file()
    assert any((out / "tensorboard").iterdir())
    # The final model loads in transformers with nothing missing and gives the same logits.
    hf, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours = vlbert.BertForPreTraining.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok(
        ["The markets rose today.", "A new phone was launched."],
        ["Shares gained.", "It sold out."],
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        a = hf.eval()(**enc)
        b = ours(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(b.prediction_logits[real], a.prediction_logits[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(b.seq_relationship_logits, a.seq_relationship_logits, atol=1e-5, rtol=0)
    # The run's fill-mask pipeline gives transformers' fill-mask pipeline's fillers and scores.
    from vlbert.inference import pipeline

    ours_fill = pipeline(out, device="cpu")("the markets [MASK] today.", top_k=3)  # one mask: a list, as theirs
    theirs = transformers.pipeline("fill-mask", model=str(out), tokenizer=str(out), device="cpu")(
        "the markets [MASK] today.", top_k=3
    )
    assert [x["token_str"] for x in ours_fill] == [x["token_str"] for x in theirs]
    assert [x["score"] for x in ours_fill] == pytest.approx([x["score"] for x in theirs], abs=1e-5)


class Crash(RuntimeError):
    pass


def test_resume_after_crash_reproduces_losses(small_corpus, tmp_path, monkeypatch):
    reference = tmp_path / "reference"
    run_text_pretraining(tiny_run_config(small_corpus, reference, save_every=3))
    expected = {r["step"]: r["loss"] for r in read_log(reference) if r["split"] == "train"}

    crashed = tmp_path / "crashed"
    original_log = Trainer.log

    def crash_after_step_5(self, record, split):
        original_log(self, record, split)
        if record.get("step") == 5 and split == "train":
            raise Crash("simulated crash")

    monkeypatch.setattr(Trainer, "log", crash_after_step_5)
    with pytest.raises(Crash):
        run_text_pretraining(tiny_run_config(small_corpus, crashed, save_every=3))
    monkeypatch.setattr(Trainer, "log", original_log)
    assert [r["step"] for r in read_log(crashed)][-1] == 5
    run_text_pretraining(tiny_run_config(small_corpus, crashed, save_every=3), resume=True)
    got = {r["step"]: r["loss"] for r in read_log(crashed) if r["split"] == "train"}
    assert sorted(got) == sorted(expected)
    assert max(abs(got[s] - expected[s]) for s in expected) <= 1e-6


@pytest.mark.parametrize(
    "change, message",
    [
        ({"data": {"corpus": "/no/such/corpus.txt"}}, "does not exist"),
        ({"training": {"learning_rate": -1.0}}, "learning_rate must be a float > 0"),
        ({"training": {"max_stepz": 3}}, "unknown training config key"),
        ({"model": {"vocab_size": 100}}, "vocab_size"),
        ({"data": {"max_seq_length": 128}}, "max_position_embeddings"),
        ({"modell": {}}, "unknown run config key"),
    ],
)
def test_bad_configuration_fails_before_writing(small_corpus, tmp_path, change, message):
    config = tiny_run_config(small_corpus, tmp_path / "out")
    for section, values in change.items():
        if isinstance(config.get(section), dict):
            config[section] = {**config[section], **values}
        else:
            config[section] = values
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        run_text_pretraining(config)
    assert not (tmp_path / "out").exists()


def test_empty_corpus_is_refused(tmp_path):
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        run_text_pretraining(tiny_run_config(tmp_path / "empty.txt", tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_cli_runs_with_flags(small_corpus, tmp_path, capsys):
    """``tools/pretrain.py``'s command with flags and ``--set`` overrides, in this process (the script itself as a
    process: tests/commands/test_cli.py)."""
    out = tmp_path / "cli"
    argv = ["--modality", "text", "--output-dir", str(out), "--max-steps", "2", "--log-every", "1", "--seed", "3"]
    for override in (
        f"data.corpus={small_corpus}",
        "model.num_hidden_layers=1",
        "model.hidden_size=32",
        "model.num_attention_heads=2",
        "model.intermediate_size=64",
        "training.batch_size=4",
        "data.max_eval_batches=2",
        "training.progress_bar=false",
    ):
        argv += ["--set", override]
    assert run_tool(tool("pretrain"), argv) == 0
    assert "final metrics" in capsys.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["step"] == 2
    assert (out / "model.safetensors").is_file() and (out / "vocab.txt").is_file()


def test_a_run_directory_is_never_overwritten_silently(small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    run_text_pretraining(tiny_run_config(small_corpus, out, max_steps=2))
    before = (out / "log.jsonl").read_text()
    with pytest.raises(FileExistsError, match="--resume .* --overwrite"):
        run_text_pretraining(tiny_run_config(small_corpus, out, max_steps=2))
    assert (out / "log.jsonl").read_text() == before
    argv = ["--modality", "text", "--output-dir", str(out), "--set", f"data.corpus={small_corpus}"]
    assert "already holds a run" in one_line_error(capsys, "pretrain", argv)
    assert (out / "log.jsonl").read_text() == before
    run_text_pretraining(tiny_run_config(small_corpus, out, max_steps=3), overwrite=True)
    assert [r["step"] for r in read_log(out) if r["split"] == "train"] == [1, 2, 3]
    # A directory of someone's own files is no run: refused with any flag, and nothing in it replaced or deleted.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "predictions.json").write_text("[1, 2]")
    argv = ["--modality", "text", "--output-dir", str(mine), "--set", f"data.corpus={small_corpus}"]
    for flags in ([], ["--overwrite"], ["--resume"]):
        assert "holds files that no run wrote (predictions.json)" in one_line_error(capsys, "pretrain", argv + flags)
    assert [p.name for p in mine.iterdir()] == ["predictions.json"] and (
        mine / "predictions.json"
    ).read_text() == "[1, 2]"


def test_init_from_minilm_alias_for_text_pretraining(small_corpus, tmp_path):
    config = tiny_run_config(small_corpus, tmp_path / "minilm", max_steps=1)
    config.update(init_from="minilm", model={})
    metrics = run_text_pretraining(config)
    assert metrics["step"] == 1
    assert json.loads((tmp_path / "minilm" / "config.json").read_text())["hidden_size"] == 384


@pytest.mark.slow
@pytest.mark.integration
def test_sigterm_checkpoints_and_resume_continues_the_same_losses(small_corpus, tmp_path):
    """SIGTERM (cluster preemption) mid-run: the step in progress finishes, a checkpoint is written, the tool
    exits with 143, and --resume gives the uninterrupted run's per-step losses. The stopped run is a process of its
    own, forked from this one (helpers.distributed.tool_process: the signal's target, without an interpreter's
    start; tests/commands/test_cli.py runs a ``tools/`` script as a real process)."""
    import signal

    from helpers.builders import like_a_worker, tool, wait_for_log_lines
    from helpers.distributed import tool_process

    steps = 40
    empty = tmp_path / "empty.yaml"
    empty.write_text("modality: text\n")

    def argv(out):
        sizes = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
        return [
            "--modality",
            "text",
            "--config",
            str(empty),
            "--output-dir",
            str(out),
            "--max-steps",
            str(steps),
            "--log-every",
            "1",
            *[f"--set=model.{k}={v}" for k, v in sizes.items()],
            *[
                f"--set={key}"
                for key in (
                    f"data.corpus={small_corpus}",
                    "tokenizer=minilm",
                    "model.max_position_embeddings=64",
                    "data.max_seq_length=64",
                    "data.eval_fraction=0.0",
                    "training.batch_size=4",
                    "training.learning_rate=1e-3",
                    "training.warmup_steps=1",
                    "training.progress_bar=false",
                )
            ],
        ]

    reference, stopped = tmp_path / "reference", tmp_path / "stopped"
    with like_a_worker():  # the reference and the resume run in this process (theirs is not under test)
        assert tool("pretrain")(argv(reference)) in (0, None)
    proc = tool_process("pretrain", argv(stopped), stderr=tmp_path / "stopped.err")
    wait_for_log_lines(proc, stopped / "log.jsonl", 10)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(120)
    stderr = (tmp_path / "stopped.err").read_text()
    assert code == 143, stderr[-2000:]
    assert "--resume" in stderr
    stopped_at = len(read_log(stopped))
    assert stopped_at < steps and (stopped / "checkpoints" / f"step-{stopped_at}" / "training_state.pt").is_file()
    with like_a_worker():
        assert tool("pretrain")(argv(stopped) + ["--resume"]) in (0, None)
    a = {r["step"]: r["loss"] for r in read_log(reference)}
    b = {r["step"]: r["loss"] for r in read_log(stopped)}
    assert sorted(b) == list(range(1, steps + 1))
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-6


def test_overwrite_leaves_nothing_of_the_old_run(tmp_path, monkeypatch):
    """--overwrite used to keep the old final model, config, tokenizer, inference.json and predictions beside the
    new log: an interrupted overwrite then looked finished. Now the directory is emptied, finished-run markers
    first."""
    from vlbert.training.run_directory import prepare_output_dir

    out = tmp_path / "run"
    out.mkdir()
    old = [
        "log.jsonl",
        "metrics.json",
        "config.yaml",
        "model.safetensors",
        "config.json",
        "vocab.txt",
        "tokenizer.json",
        "inference.json",
        "predictions.csv",
        "predictions.jsonl",
    ]
    for name in old:
        (out / name).write_text("old")
    (out / "checkpoints" / "step-2").mkdir(parents=True)
    deleted = []
    original = type(out).unlink
    monkeypatch.setattr(type(out), "unlink", lambda self, *a, **k: (deleted.append(self.name), original(self, *a, **k)))
    prepare_output_dir(out, resume=False, overwrite=True)
    assert list(out.iterdir()) == []
    assert deleted[:3] == ["metrics.json", "model.safetensors", "inference.json"]
