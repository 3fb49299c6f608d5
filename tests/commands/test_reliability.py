"""Files users hand us, read the way they really arrive (cut off, hand-edited, from another tool), and converters
that refuse what they cannot know: every case is one ``error:`` line with exit status 2 naming the file (with line
and column where the parser gives them) and the fix, and nothing is written. Rows 72-80 of docs/bad-input.md."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers.builders import tool
from helpers.published import VB_SIZES, write_tokenizer, write_uniter
from helpers.tool_errors import one_line_error

from vlbert.common.user_files import UserFileError
from vlbert.families.base import load_torch_file


@pytest.fixture(scope="module")
def uniter_vqa(tmp_path_factory):
    """A UNITER-shaped VQA checkpoint with 3 answers, its config and a cased tokenizer of its vocabulary."""
    tmp = tmp_path_factory.mktemp("uniter-vqa")
    _, path = write_uniter(tmp, answers=3)
    return path, tmp / "uniter-tiny.json", write_tokenizer(tmp / "tok", 60, cased=True)


def test_cut_off_and_mistyped_json_given_to_the_converter(capsys, tmp_path, uniter_vqa):  # rows 72, 73
    path, config, tok = uniter_vqa
    base = ["--from", "uniter", str(path), "--tokenizer", str(tok), "--output-dir", str(tmp_path / "out")]
    cut = tmp_path / "ans2label.json"
    cut.write_text('{"yes": 0, "no": 1, "2"')
    line = one_line_error(capsys, "convert_checkpoint", [*base, "--config", str(config), "--labels", str(cut)])
    assert f"{cut}:1:" in line and "label map" in line and "cut off" in line, line
    strings = tmp_path / "ans2label-strings.json"
    strings.write_text('{"yes": "0", "no": "1", "2": "2"}')
    line = one_line_error(capsys, "convert_checkpoint", [*base, "--config", str(config), "--labels", str(strings)])
    assert str(strings) in line and "'yes' has index '0'" in line and "as numbers" in line, line
    cut_config = tmp_path / "uniter-base.json"
    cut_config.write_text('{"num_attention_heads": 4,\n "hidden_size"')
    line = one_line_error(capsys, "convert_checkpoint", [*base, "--config", str(cut_config)])
    assert f"{cut_config}:2:" in line and "uniter config" in line, line
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_random_bytes_are_refused_as_checkpoints_whatever_the_unpickler_raises(tmp_path):  # row 74
    """torch's weights-only unpickler raises IndexError, KeyError, ... on some random bytes: all are one refusal."""
    g = torch.Generator().manual_seed(0)
    for i in range(40):
        path = tmp_path / f"random-{i}.pt"
        path.write_bytes(
            bytes(
                torch.randint(
                    0, 256, (int(torch.randint(1, 400, (1,), generator=g)),), generator=g, dtype=torch.uint8
                ).tolist()
            )
        )
        with pytest.raises(ValueError, match="is not a plain state dict of tensors"):
            load_torch_file(path)


def _visualbert_dir(tmp_path, num_labels=3):
    # transformers' VisualBERT is looked up here, not at import: that lookup costs every xdist worker 2-3 s
    config = transformers.VisualBertConfig(**VB_SIZES["small"], num_labels=num_labels)
    cls = transformers.VisualBertForQuestionAnswering
    torch.manual_seed(0)
    source = tmp_path / "visualbert"
    cls(config).save_pretrained(source)
    return source


def test_a_converter_refuses_what_it_cannot_know(capsys, tmp_path):  # rows 75, 76
    source = _visualbert_dir(tmp_path)
    tok = write_tokenizer(tmp_path / "tok", VB_SIZES["small"]["vocab_size"], cased=False)
    out = tmp_path / "out"
    argv = ["--from", "visualbert", str(source), "--tokenizer", str(tok), "--output-dir", str(out)]
    saved = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "architectures"}))
    line = one_line_error(capsys, "convert_checkpoint", argv)
    assert "name no VisualBERT head" in line and "VisualBertForQuestionAnswering" in line, line
    (source / "config.json").unlink()
    line = one_line_error(capsys, "convert_checkpoint", argv)
    assert "has no config.json with num_attention_heads" in line and "--config" in line, line
    assert not out.exists()
    (source / "config.json").write_text(json.dumps(saved))  # as transformers wrote it: converts, 4 heads
    assert tool("convert_checkpoint")(argv + ["--labels", str(_labels(tmp_path))]) == 0
    assert json.loads((out / "config.json").read_text())["num_attention_heads"] == 4


def _labels(tmp_path):
    path = tmp_path / "labels.txt"
    path.write_text("a\nb\nc\n")
    return path


def test_non_finite_tensors_are_named_and_need_allow_nonfinite(capsys, tmp_path):  # row 77
    state, path = write_uniter(tmp_path, name="diverged.pt")
    key = "uniter.encoder.layer.1.attention.self.query.weight"
    state[key] = state[key].clone()
    state[key][0, 0] = float("nan")
    torch.save(state, path)
    tok = write_tokenizer(tmp_path / "tok", 60, cased=True)
    argv = [
        "--from",
        "uniter",
        str(path),
        "--tokenizer",
        str(tok),
        "--config",
        str(tmp_path / "uniter-tiny.json"),
        "--output-dir",
        str(tmp_path / "out"),
    ]
    line = one_line_error(capsys, "convert_checkpoint", argv)
    assert key in line and "NaN or inf" in line and "--allow-nonfinite" in line, line
    assert not (tmp_path / "out").exists()
    assert tool("convert_checkpoint")(argv + ["--allow-nonfinite"]) == 0


def test_truncated_benchmark_files_name_the_place(tmp_path):  # row 72
    from vlbert.data.vqa import load_vqa_v2

    questions = tmp_path / "v2_OpenEnded_mscoco_val2014_questions.json"
    questions.write_text('{"questions": [{"question_id": 1, "image_id": 9, "question": "What is')
    with pytest.raises(UserFileError, match=rf"{questions}:1:\d+: not valid JSON for the VQA v2 questions file"):
        load_vqa_v2(questions)


def test_explain_on_a_text_model_says_it_needs_regions(capsys, minilm_dir):  # row 80
    line = one_line_error(capsys, "explain", ["alignment-share", "--model", str(minilm_dir), "--images", "2"])
    assert "is a text model" in line and "vision-language run" in line, line


def test_a_collective_that_cannot_complete_is_one_line(monkeypatch):  # row 81
    """What gloo raises when a peer never joins (measured: 2 processes, timeout 3 s) becomes one line with the fix."""
    from vlbert.commands import is_user_error, one_line
    from vlbert.training.processes import ProcessGroupError, collective_failure

    gloo = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
        "3000ms for recv operation to complete"
    )
    assert collective_failure(gloo) is None  # one process: not a collective's failure
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    failure = collective_failure(gloo)
    assert isinstance(failure, ProcessGroupError) and not is_user_error(failure)
    assert one_line(failure).startswith("rank 1: a collective between the processes could not complete (")
    assert "--resume" in one_line(failure) and collective_failure(RuntimeError("shape mismatch")) is None


@pytest.fixture(scope="module")
def lxmert_dir(tmp_path_factory):
    """A tiny transformers LxmertForPreTraining (4 heads) saved as save_pretrained writes it, its state dict, and
    an uncased tokenizer of its vocabulary."""
    from helpers.lxmert import LXMERT_SIZES as SIZES

    tmp = tmp_path_factory.mktemp("lxmert-refusals")
    torch.manual_seed(0)
    hf = transformers.LxmertForPreTraining(transformers.LxmertConfig(**SIZES["small"]))
    hf.save_pretrained(tmp / "hf")
    state = {k: v.clone() for k, v in hf.state_dict().items() if not k.endswith("position_ids")}
    return tmp / "hf", state, write_tokenizer(tmp / "tok", SIZES["small"]["vocab_size"], cased=False)


def test_lxmert_and_vl_bert_files_are_refused_naming_the_tensor_and_the_family(capsys, tmp_path, lxmert_dir):
    """Rows 103-105. An LXMERT transformers directory without config.json (its 4 heads would convert as 1), an LXMERT
    or VL-BERT checkpoint lacking one tensor or holding one outside the layout, airsplay's Epoch20_LXRT.pth or an
    LXMERT directory given --from vl-bert: each one line naming the tensor / the family, nothing written."""
    import shutil

    from helpers.vl_bert_files import write_model_file
    from helpers.vl_bert_reference import vl_bert_state
    from safetensors.torch import save_file

    source, state, tok = lxmert_dir
    out = tmp_path / "out"

    def refused(path, family, *more):
        return one_line_error(
            capsys,
            "convert_checkpoint",
            [str(path), "--from", family, "--tokenizer", str(tok), "--output-dir", str(out), *more],
        )

    bare = tmp_path / "no-config"
    shutil.copytree(source, bare)
    (bare / "config.json").unlink()
    line = refused(bare, "lxmert")
    assert "has no config.json with num_attention_heads" in line and "--config" in line, line
    key = "lxmert.encoder.x_layers.0.visual_attention.att.query.weight"
    for layout, expected in (
        ({k: v for k, v in state.items() if k != key}, f"lacks the tensor '{key}'"),
        (
            {**state, "lxmert.encoder.extra.weight": torch.zeros(2)},
            "'lxmert.encoder.extra.weight' is not part of LXMERT's layout",
        ),
    ):
        damaged = tmp_path / "damaged"
        shutil.copytree(source, damaged, dirs_exist_ok=True)
        save_file(layout, damaged / "model.safetensors")
        line = refused(damaged, "lxmert")
        assert expected in line and "lxmert" in line.replace("LXMERT", "lxmert"), line
    airsplay = {
        ("module.bert." + k[len("lxmert.") :] if k.startswith("lxmert.") else "module." + k): v
        for k, v in state.items()
    }
    torch.save(airsplay, tmp_path / "Epoch20_LXRT.pth")
    for path in (tmp_path / "Epoch20_LXRT.pth", source):
        line = refused(path, "vl-bert")
        assert "it is a lxmert checkpoint: pass --from lxmert" in line, line
    vl_bert = vl_bert_state(layers=1)
    write_model_file(
        tmp_path / "partial.model",
        {k: v for k, v in vl_bert.items() if k != "module.image_feature_extractor.obj_downsample.1.weight"},
    )
    line = refused(tmp_path / "partial.model", "vl-bert")
    assert "vl-bert checkpoint lacks the tensor 'module.image_feature_extractor.obj_downsample.1.weight'" in line
    assert not out.exists()


def test_damaged_vl_bert_files_are_one_line_whatever_the_unpickler_raises(capsys, tmp_path):  # row 108
    """VL-BERT's .model files are torch 1.x pickles (no zip): cut off or with bytes flipped, torch's weights-only
    unpickler raises IndexError, KeyError, UnpicklingError, ...; the converter's one loader makes each one line."""
    from helpers.vl_bert_files import OPTIMIZER
    from helpers.vl_bert_reference import vl_bert_state

    path = tmp_path / "vl-bert-base-prec.model"
    state = vl_bert_state(hidden=8, layers=1, intermediate=8, vocab=12, positions=8, feature_dim=4, classes=3)
    torch.save({"state_dict": state, "optimizer": OPTIMIZER}, path, _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(40):
        cut = data[: int(torch.randint(1, len(data), (1,), generator=g))]
        flipped = bytearray(data[: len(cut)])
        for k in torch.randint(0, len(cut), (3,), generator=g).tolist():
            flipped[k] = int(torch.randint(0, 256, (1,), generator=g))
        path.write_bytes(bytes(flipped))
        try:
            torch.load(path, weights_only=True)
        except Exception as e:  # noqa: BLE001 - what the unpickler raises, to check the cases cover several types
            seen.add(type(e).__name__)
        line = one_line_error(
            capsys, "convert_checkpoint", [str(path), "--from", "vl-bert", "--output-dir", str(tmp_path / "out")]
        )
        assert "is not a plain VL-BERT checkpoint" in line and "fetch it again" in line, line
    assert {"IndexError", "KeyError"} & seen, seen  # what escaped the reader's own torch.load before
