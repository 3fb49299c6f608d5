"""The tools' error rule (vlbert/commands/__init__.py): every refusal of what the user supplied reaches the user as one
line, ``error: ...``, with exit status 2 and no traceback, and nothing is written; a bug keeps its traceback. Each
case is a row of docs/bad-input.md that a tool reaches (row numbers in the ids), run in-process through the same
``run_tool`` the tools' ``__main__`` uses. Also: ``--init-from`` with a config whose ``model`` section describes
another architecture."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers.builders import tool
from helpers.tool_errors import TINY_MODEL, one_line_error

from vlbert.commands import is_user_error, run_tool

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def text_config(tmp_path_factory, small_corpus):
    """A tiny text-pretraining config file on the small corpus (its preparation cached for the module)."""
    root = tmp_path_factory.mktemp("tool-errors")
    config = {
        "modality": "text",
        "tokenizer": "minilm",
        "model": TINY_MODEL,
        "data": {
            "corpus": str(small_corpus),
            "max_seq_length": 64,
            "max_eval_batches": 1,
            "corpus_cache_dir": str(root / "corpora"),
        },
        "training": {"max_steps": 1, "batch_size": 4, "progress_bar": False},
    }
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_yaml_syntax_error_names_file_line_and_column(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  hidden_size: 256\n  layers: [1, 2\ndata:\n  corpus: x\n")
    line = one_line_error(capsys, "pretrain", ["--config", str(bad), "--output-dir", str(tmp_path / "out")])
    assert f"{bad}:4:" in line and "line 3, column 11" in line and "flow sequence" in line
    assert not (tmp_path / "out").exists()


def _text_cases(tmp: Path, small_corpus: Path) -> dict[str, tuple[list[str], str]]:
    (tmp / "empty.txt").write_text("\n\n")
    (tmp / "bad.txt").write_bytes(b"caf\xe9 au lait. Une phrase.")
    (tmp / "body.jsonl").write_text('{"body": "a document"}\n')
    pickled = tmp / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps({"model_type": "bert", **TINY_MODEL, "vocab_size": 30522}))
    torch.save(
        {"bert.embeddings.word_embeddings.weight": torch.zeros(2, 2), "x": object()}, pickled / "pytorch_model.bin"
    )
    gpt2 = tmp / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    corrupt = tmp / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text(json.dumps({"model_type": "bert", **TINY_MODEL, "vocab_size": 30522}))
    (corrupt / "model.safetensors").write_bytes(b"\x00\x01 not safetensors")
    empty_dir = tmp / "no-weights"
    empty_dir.mkdir()
    (empty_dir / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp / "empty-base.yaml").write_text("_base_:  # ../bases/text.yaml\ntraining:\n  max_steps: 1\n")
    (tmp / "dir-base.yaml").write_text(f"_base_: {ROOT / 'configs' / 'detectors'}\n")
    damaged = tmp / "damaged-run"
    damaged.mkdir()
    (damaged / "inference.json").write_text('{"format_version": 1, "task": "vqa", "max_regi')
    return {
        "78-attention-kernel": (
            ["--set", "model.attn_implementation=flash_attention_9"],
            "'flash_attention_9' is not a registered attention kernel",
        ),
        "79-empty-base": (["--config", str(tmp / "empty-base.yaml")], "_base_ must be a config file's path"),
        "79-base-directory": (["--config", str(tmp / "dir-base.yaml")], "is a directory; name a YAML file in it"),
        "72-damaged-init-from": (["--init-from", str(damaged)], f"{damaged / 'inference.json'}:1:"),
        "1-empty-corpus": (["--set", f"data.corpus={tmp / 'empty.txt'}"], "is empty"),
        "2-missing-corpus": (["--set", f"data.corpus={tmp / 'missing.txt'}"], "does not exist"),
        "3-not-utf8": (["--set", f"data.corpus={tmp / 'bad.txt'}"], "UTF-8"),
        "4-no-text-field": (["--set", f"data.corpus={tmp / 'body.jsonl'}"], "has no field 'text'"),
        "6-longer-than-positions": (["--set", "data.max_seq_length=128"], "exceeds the model's max_position"),
        "7-tokenizer-vocabulary": (["--set", "model.vocab_size=100"], "vocab_size"),
        "24-pickled-checkpoint": (["--init-from", str(pickled)], "could not be read as plain tensors"),
        "25-other-architecture": (["--init-from", str(gpt2)], "gpt2"),
        "27-corrupt-safetensors": (["--init-from", str(corrupt)], "corrupt safetensors"),
        "28-no-weights": (["--init-from", str(empty_dir)], "has no weights"),
        "28-no-directory": (["--init-from", str(tmp / "nowhere")], "nowhere"),
        "29-unknown-key": (["--set", "training.max_stepz=3"], "unknown training config key(s) ['max_stepz']"),
        "30-negative-learning-rate": (
            ["--set", "training.learning_rate=-1"],
            "training.learning_rate must be a float > 0, got -1",
        ),
        "31-wrong-type": (["--set", "training.max_steps=ten"], "training.max_steps must be an int >= 1, got 'ten'"),
        "new-fractional-int": (
            ["--set", "training.grad_accum_steps=1.5"],
            "training.grad_accum_steps must be an int >= 1, got 1.5",
        ),
        "32-set-without-equals": (["--set", "training.max_steps"], "--set expects key=value"),
        "40-fp16": (["--set", "training.mixed_precision=fp16"], "mixed_precision must be"),
        "new-modality-mismatch": (["--modality", "vl"], "is a text config"),
        "new-init-from-conflict": (
            ["--init-from", "minilm", "--set", "model.hidden_size=32"],
            "--set model.hidden_size=32 conflicts with the architecture",
        ),
        "96-text-objective-pair": (
            ["--set", "data.objectives={mlm: 1, wwm: 1}"],
            "data.objectives has both mlm and wwm, which choose the same wordpieces to mask",
        ),
        "96-vl-objective-for-text": (
            ["--set", "data.objectives={itm: 1}"],
            "['itm'] are not text pretraining objectives",
        ),
    }


CASES = [
    "1-empty-corpus",
    "2-missing-corpus",
    "3-not-utf8",
    "4-no-text-field",
    "6-longer-than-positions",
    "7-tokenizer-vocabulary",
    "24-pickled-checkpoint",
    "25-other-architecture",
    "27-corrupt-safetensors",
    "28-no-weights",
    "28-no-directory",
    "29-unknown-key",
    "30-negative-learning-rate",
    "31-wrong-type",
    "32-set-without-equals",
    "40-fp16",
    "new-modality-mismatch",
    "new-init-from-conflict",
    "new-fractional-int",
    "78-attention-kernel",
    "79-empty-base",
    "79-base-directory",
    "72-damaged-init-from",
    "96-text-objective-pair",
    "96-vl-objective-for-text",
]


@pytest.mark.parametrize("case", CASES)
def test_text_pretraining_refusals_are_one_line(capsys, tmp_path, small_corpus, text_config, case):
    argv, expected = _text_cases(tmp_path, small_corpus)[case]
    out = tmp_path / "out"
    line = one_line_error(capsys, "pretrain", ["--config", str(text_config), "--output-dir", str(out), *argv])
    assert expected in line, line
    assert not out.exists()  # nothing written: the config is checked before the output directory exists


def test_an_existing_run_is_one_line_and_untouched(capsys, tmp_path, text_config):  # row 35
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text('{"kept": 1}')
    line = one_line_error(capsys, "pretrain", ["--config", str(text_config), "--output-dir", str(out)])
    assert "already holds a run" in line and "--resume" in line
    assert (out / "metrics.json").read_text() == '{"kept": 1}'


def test_region_tool_refusals_are_one_line(capsys, tmp_path):  # rows 12, 13, 50-style and flags
    def npz(name, boxes):
        path = tmp_path / "npz" / f"{name}.npz"
        path.parent.mkdir(exist_ok=True)
        np.savez(
            path,
            boxes=np.asarray(boxes, dtype=np.float32),
            features=np.zeros((len(boxes), 4), np.float32),
            image_h=60,
            image_w=80,
            scores=np.ones(len(boxes), np.float32),
        )
        return path

    outside = npz("outside", [[0, 0, 500, 50]])
    line = one_line_error(capsys, "extract_regions", ["--from-npz", str(outside), "--output-dir", str(tmp_path / "s")])
    assert "lies outside the 80x60 image" in line
    flipped = npz("flipped", [[50, 10, 20, 40]])
    line = one_line_error(capsys, "extract_regions", ["--from-npz", str(flipped), "--output-dir", str(tmp_path / "t")])
    assert "x2 < x1" in line
    line = one_line_error(
        capsys, "extract_regions", ["--images", str(tmp_path / "none"), "--output-dir", str(tmp_path / "u")]
    )
    assert "no such file or directory" in line
    line = one_line_error(
        capsys,
        "extract_regions",
        [
            "--images",
            "skimage",
            "--output-dir",
            str(tmp_path / "v"),
            "--backend",
            "detectron2",
            "--opts",
            "MODEL.DEVICE",
        ],
    )
    assert "KEY VALUE pairs" in line


def test_vl_config_refusals_are_one_line(capsys, tmp_path):  # rows 38, 52
    line = one_line_error(
        capsys,
        "pretrain",
        ["--modality", "vl", "--output-dir", str(tmp_path / "a"), "--set", "data.objectives={mim: 1}"],
    )
    assert "unknown objective(s) ['mim']" in line
    line = one_line_error(
        capsys,
        "pretrain",
        ["--modality", "vl", "--output-dir", str(tmp_path / "a"), "--set", "data.objectives={mlm: 1, nsp: 1}"],
    )
    assert "data.objectives has ['nsp'], which a vision-language pretraining model cannot run" in line
    line = one_line_error(
        capsys,
        "pretrain",
        [
            "--modality",
            "vl",
            "--output-dir",
            str(tmp_path / "b"),
            "--set",
            "data.sources=[{name: x, format: parquet, path: p, shards: s}]",
        ],
    )
    assert "format must be one of" in line
    line = one_line_error(
        capsys,
        "pretrain",
        ["--modality", "vl", "--output-dir", str(tmp_path / "a"), "--set", "data.objectives={wra: 1}"],
    )  # row 80
    assert "wra runs on itm batches" in line and "add itm, e.g. {itm: 1, wra: 1}" in line, line
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_finetune_without_a_task_is_one_line(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("task: jigsaw\n")
    line = one_line_error(capsys, "finetune", ["--config", str(config)])
    assert "names task 'jigsaw'" in line


def test_a_bug_keeps_its_traceback():
    def buggy(argv):
        return np.zeros(3).reshape(2, 2)  # numpy's ValueError, raised outside vlbert: not the user's input

    with pytest.raises(ValueError, match="reshape"):
        run_tool(buggy, [])

    from vlbert.training.run_config import set_dotted

    with pytest.raises(ValueError) as raised:
        set_dotted({}, "no-equals-sign")  # vlbert's own check of the user's input
    assert is_user_error(raised.value) and not is_user_error(KeyError("x"))
    assert is_user_error(FileNotFoundError(2, "No such file or directory", "/x/y"))


def test_init_from_a_checkpoint_with_the_default_config(tmp_path, caplog):
    """``--init-from minilm`` with the default text config: the checkpoint's architecture (L6 H384) wins over the
    config's model section (L4 H256), reported in one warning line; the other entries still apply."""
    from vlbert.models.bert import BertForPreTraining
    from vlbert.recipes.init_from import load_model
    from vlbert.recipes.runner import RunContext
    from vlbert.tokenization import resolve_model_path
    from vlbert.training.run_config import load_run_config

    config = load_run_config(ROOT / "configs" / "text" / "default.yaml", ["model.hidden_dropout_prob=0.0"])
    ctx = RunContext(config, None, None, None, None, str(resolve_model_path("minilm")), ("model.hidden_dropout_prob",))
    with caplog.at_level(logging.WARNING):
        model = load_model(BertForPreTraining, ctx)
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.intermediate_size) == (384, 6, 1536)
    assert c.hidden_dropout_prob == 0.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "decides" in r.getMessage()]
    assert len(warnings) == 1 and "hidden_size=256 (checkpoint: 384)" in warnings[0]
    assert "num_hidden_layers=4 (checkpoint: 6)" in warnings[0]
    ctx = RunContext(config, None, None, None, None, str(resolve_model_path("minilm")), ("model.hidden_size",))
    with pytest.raises(ValueError, match=r"--set model.hidden_size=256 conflicts .* \(hidden_size=384\)"):
        load_model(BertForPreTraining, ctx)


def test_flags_are_values_not_yaml(tmp_path, monkeypatch):
    """--output-dir and the other flags are taken as given (only --set is YAML): '#' used to start a YAML comment
    and 'x: y' to make a mapping."""
    import vlbert.commands

    seen = {}

    def fake_run(recipe, config, resume, overwrite, command_line_keys=()):
        seen.update(config=config, keys=command_line_keys)
        return {}

    monkeypatch.setattr(vlbert.commands, "run", fake_run)
    for name in ("runs/a #b", "runs/x: y", "runs/[1, 2]", "007"):
        tool("pretrain")(
            ["--modality", "text", "--output-dir", name, "--seed", "3", "--set", "training.learning_rate=5e-4"]
        )
        assert seen["config"]["training"]["output_dir"] == name
        assert seen["config"]["training"]["seed"] == 3 and seen["config"]["training"]["learning_rate"] == 5e-4
        assert "training.output_dir" in seen["keys"]


def test_explain_reads_images_with_the_runs_detector(capsys, tmp_path):
    """tools/explain.py regions: the run's own detector and region count (it always used the default run's
    detector and 16 regions); a missing --easy-vqa-image or a --word absent from the text is one line."""
    from dataclasses import asdict, replace

    from PIL import Image
    from vlbert.detectors.config import DetectorConfig

    import vlbert
    from vlbert.data.easy_vqa import image_paths
    from vlbert.tokenization import load_tokenizer

    detector = DetectorConfig(options={"input_size": 64, "max_proposals": 5})
    dim = (
        detector.build()
        .extract_batch([Image.open(image_paths("test")["test/3"]).convert("RGB")], ["test/3"])[0]
        .feature_dim
    )
    run_dir = tmp_path / "run"
    config = vlbert.VLBertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        region_feature_dim=dim,
        num_region_classes=0,
    )
    vlbert.VLBertForPreTraining(config).save_pretrained(run_dir, tokenizer=load_tokenizer("minilm"))
    (run_dir / "inference.json").write_text(
        json.dumps(
            {
                "task": "vl-pretraining",
                "max_regions": 4,
                "max_text_length": 16,
                "detector": {"fingerprint": detector.fingerprint(), "config": asdict(detector), "extractor": "x"},
            }
        )
    )
    base = [
        "regions",
        "--model",
        str(run_dir),
        "--text",
        "a blue circle",
        "--out",
        str(tmp_path / "png"),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    assert "needs --easy-vqa-image" in one_line_error(capsys, "explain", base + ["--word", "blue"])
    line = one_line_error(capsys, "explain", base + ["--easy-vqa-image", "test/3", "--word", "red"])
    assert "--word 'red' is not a wordpiece of --text" in line and "'blue'" in line
    capsys.readouterr()
    assert run_tool(tool("explain"), base + ["--easy-vqa-image", "test/3", "--word", "blue"]) == 0
    printed = json.loads(capsys.readouterr().out.splitlines()[0])
    assert printed["word"] == "blue" and len(printed["attention_to_regions"]) == 4  # the run's max_regions
    cached = list((tmp_path / "cache").iterdir())
    assert len(cached) == 1 and detector.fingerprint() in cached[0].name  # extracted with the run's detector
    # a two-stream (LXMERT) model: the picture is its last cross-modality layer's text-over-regions map
    two = tmp_path / "two-stream"
    vlbert.VLBertForPreTraining(
        replace(
            config,
            encoder="two-stream",
            l_layers=1,
            r_layers=1,
            x_layers=1,
            region_embedding="lxmert",
            region_location_dim=4,
        )
    ).save_pretrained(two, tokenizer=load_tokenizer("minilm"))
    (two / "inference.json").write_text((run_dir / "inference.json").read_text())
    assert (
        run_tool(tool("explain"), [*base[:2], str(two), *base[3:], "--easy-vqa-image", "test/3", "--word", "blue"]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    shares = json.loads(out[0])["attention_to_regions"]
    assert len(shares) == 4 and abs(sum(shares) - 1) < 0.01


def test_every_detector_field_has_its_extract_regions_flag(capsys):
    """docs/configuration.md: extract_regions.py's flags are the detector section's fields, every backend's options
    from the table (detectors/backends.py); ``overrides`` is ``--opts``."""
    from dataclasses import fields

    from vlbert.detectors.backends import DETECTOR_BACKENDS

    with pytest.raises(SystemExit):
        tool("extract_regions")(["--help"])
    text = capsys.readouterr().out
    assert "--backend {" + ",".join(DETECTOR_BACKENDS) + "}" in text
    names = ["weights", "weights_sha256", *(f.name for e in DETECTOR_BACKENDS.values() for f in fields(e.options))]
    for name in names:
        flag = "--opts" if name == "overrides" else "--" + name.replace("_", "-")
        assert flag in text, flag


def test_a_mistyped_init_from_says_the_directory_does_not_exist_before_any_hub_lookup(
    capsys, tmp_path, monkeypatch, text_config
):  # row 112
    """``--init-from runs/vqa-ezy`` beside ``runs/vqa-easy``: one line saying the directory does not exist and
    naming the near one, before the hub is asked for it (it was blamed on the network: the tokenizer was tried as
    a hub id first); with ``--overwrite``, the run in --output-dir is kept (it was deleted before the refusal)."""
    import huggingface_hub

    asked = []

    def no_hub(*args, **kwargs):
        asked.append(args)
        raise OSError("offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "vqa-easy").mkdir(parents=True)
    config = yaml.safe_load(text_config.read_text())
    del config["tokenizer"]  # the tokenizer would come from init_from
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "runs" / "old"
    out.mkdir()
    (out / "metrics.json").write_text('{"kept": 1}')
    line = one_line_error(
        capsys,
        "pretrain",
        ["--config", "config.yaml", "--init-from", "runs/vqa-ezy", "--output-dir", str(out), "--overwrite"],
    )
    assert line.startswith("error: runs/vqa-ezy does not exist") and "did you mean runs/vqa-easy?" in line, line
    assert not asked and (out / "metrics.json").read_text() == '{"kept": 1}'
