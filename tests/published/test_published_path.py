"""The README's path from a published model to answers about your own images, every guard on (issue 39): a
UNITER-shaped VQA checkpoint (UNITER's key names, float16) converted with its ans2label; regions of the user's
image files made by the BUTD detector, extracted by the ``butd`` backend with detectron2 hidden (random weights saved
as ``faster_rcnn_from_caffe_attr.pkl`` away from the working directory) or imported from a bottom-up-attention TSV
with ``--extracted-with butd-vg``; ``tools/finetune_vqa.py --dataset vqa-v2 --init-from`` it on VQA v2 files with
``allow_other_detector`` unset, on the checkpoint's own 100 regions and 60 wordpieces; answers through
``pipeline(run, detector_weights=...)``. Regions the checkpoint was not trained on are refused: timm's, and an import
that does not say what made it. Everything runs without detectron2."""

from __future__ import annotations

import json
import logging
import pickle
import re
import shutil

import numpy as np
import pytest
import torch
import transformers
from helpers.builders import EASY_DETECTOR, tool
from helpers.published_references import uniter_state
from vlbert.detectors.regions import Regions

from vlbert.commands import run_tool
from vlbert.data.easy_vqa import image_paths, load_questions
from vlbert.inference import pipeline
from vlbert.models.vqa import VLBertForVQA

ANSWERS = ["red", "blue", "green", "circle", "yes"]
N_IMAGES = 4
TSV_REGIONS = 30  # above the 16 a config used to cut to, below UNITER's 100


def cased_minilm(directory):
    """A cased tokenizer over the packaged MiniLM's 30,522 pieces: stands in for bert-base-cased offline."""
    from vlbert.tokenization import load_tokenizer

    vocab = load_tokenizer("minilm").get_vocab()
    transformers.BertTokenizerFast(vocab=vocab, do_lower_case=False).save_pretrained(str(directory))
    return directory


def convert_uniter_vqa(directory, feature_dim: int):
    """tools/convert_checkpoint.py over a UNITER VQA checkpoint (UNITER's keys, float16) and its ans2label.json."""
    directory.mkdir(parents=True)
    torch.save(uniter_state(vocab=30522, feature_dim=feature_dim, answers=len(ANSWERS)), directory / "vqa.pt")
    (directory / "uniter-tiny.json").write_text(json.dumps({"num_attention_heads": 4}))
    (directory / "ans2label.json").write_text(json.dumps({a: i for i, a in enumerate(ANSWERS)}))
    argv = [
        "--from",
        "uniter",
        str(directory / "vqa.pt"),
        "--labels",
        str(directory / "ans2label.json"),
        "--config",
        str(directory / "uniter-tiny.json"),
        "--tokenizer",
        str(cased_minilm(directory / "cased")),
        "--output-dir",
        str(directory / "uniter-vqa"),
    ]
    assert run_tool(tool("convert_checkpoint"), argv) == 0
    return directory / "uniter-vqa"


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The user's files: N_IMAGES easy-VQA images as PNG files named 0.png.., VQA v2 questions and annotations
    about them, a bottom-up-attention TSV of 2048-d regions for them, and the converted UNITER VQA model."""
    from vlbert.detectors.precomputed import write_butd_tsv

    root = tmp_path_factory.mktemp("user")
    questions = load_questions("test")
    chosen = list(dict.fromkeys(q.image_id for q in questions))[:N_IMAGES]
    (root / "images").mkdir()
    for k, image_id in enumerate(chosen):
        shutil.copy(image_paths("test")[image_id], root / "images" / f"{k}.png")
    number = {image_id: k for k, image_id in enumerate(chosen)}
    asked = [q for q in questions if q.image_id in number][:12]
    records = [
        {"question_id": 100 + n, "image_id": number[q.image_id], "question": q.question} for n, q in enumerate(asked)
    ]
    (root / "q.json").write_text(json.dumps({"questions": records}))
    (root / "a.json").write_text(
        json.dumps(
            {
                "annotations": [
                    {"question_id": r["question_id"], "answers": [{"answer": q.answer}] * 10}
                    for r, q in zip(records, asked, strict=True)
                ]
            }
        )
    )
    rng = np.random.default_rng(0)
    regions = []
    for k in range(N_IMAGES):
        xy = rng.uniform(0, 40, (TSV_REGIONS, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(4, 24, (TSV_REGIONS, 2))], 1).clip(0, 63).astype(np.float32)
        regions.append(
            Regions(
                str(k),
                64,
                64,
                boxes,
                rng.random((TSV_REGIONS, 2048), np.float32).astype(np.float16),
                rng.random(TSV_REGIONS, np.float32),
                None,
                "butd-tsv",
            )
        )
    write_butd_tsv(regions, root / "obj.tsv")
    return root, convert_uniter_vqa(root / "published", feature_dim=2048)


def finetune_argv(root, init_from, shards, out) -> list[str]:
    """The README's fine-tuning command on VQA v2 files (nothing switched off)."""
    return [
        "--dataset",
        "vqa-v2",
        "--init-from",
        str(init_from),
        "--output-dir",
        str(out),
        "--max-steps",
        "2",
        "--set",
        f"data.shards={shards}",
        "--set",
        f"data.train_questions={root / 'q.json'}",
        "--set",
        f"data.train_annotations={root / 'a.json'}",
        "--set",
        f"data.eval_questions={root / 'q.json'}",
        "--set",
        f"data.eval_annotations={root / 'a.json'}",
        "--set",
        "training.batch_size=4",
        "--set",
        "training.progress_bar=false",
    ]


def import_tsv(root, out, *extracted_with) -> None:
    args = ["--from-tsv", str(root / "obj.tsv"), "--output-dir", str(out), *extracted_with]
    assert run_tool(tool("extract_regions"), args) == 0


def assert_trained_on_the_checkpoints_settings(run_dir, caplog):
    info = json.loads((run_dir / "processor.json").read_text())
    assert info["max_regions"] == 100 and info["max_text_length"] == 60  # UNITER's, not the config's 16 and 32
    assert not [r for r in caplog.records if "keeps the first" in r.getMessage()]  # no image was cut


@pytest.fixture()
def quiet_cuts(monkeypatch):
    """Forget which region cuts this process already reported (vlbert.processing.regions says each once)."""
    import vlbert.processing.regions

    monkeypatch.setattr(vlbert.processing.regions, "_CUTS_REPORTED", set())


def test_imported_butd_features_fine_tune_a_converted_uniter_and_answer(tmp_path, user, quiet_cuts, caplog):
    from vlbert.detectors.store import RegionStore

    root, published = user
    import_tsv(root, tmp_path / "shards", "--extracted-with", "butd-vg")
    caplog.set_level(logging.WARNING)
    assert run_tool(tool("finetune_vqa"), finetune_argv(root, published, tmp_path / "shards", tmp_path / "run")) == 0
    assert_trained_on_the_checkpoints_settings(tmp_path / "run", caplog)
    # The pipeline's answers on the imported regions (all 30 of each image) are the run's own evaluation.
    evaluated = {
        r["question_id"]: r["answer"]
        for r in map(json.loads, (tmp_path / "run" / "predictions.jsonl").read_text().splitlines())
    }
    store = RegionStore(tmp_path / "shards")
    questions = json.loads((root / "q.json").read_text())["questions"]
    vqa = pipeline(tmp_path / "run", device="cpu")
    answers = vqa([store[str(q["image_id"])] for q in questions], [q["question"] for q in questions])
    assert {str(q["question_id"]): a[0]["answer"] for q, a in zip(questions, answers, strict=True)} == evaluated
    # It trained from UNITER's weights (2 small steps move them little), in UNITER's architecture.
    start, trained = VLBertForVQA.from_pretrained(published), VLBertForVQA.from_pretrained(tmp_path / "run")
    assert trained.config.region_embedding == "uniter" and trained.config.hidden_size == 32
    for key in ("bert.embeddings.word_embeddings.weight", "bert.region_embeddings.feature_proj.weight"):
        delta = (trained.state_dict()[key] - start.state_dict()[key]).abs().max()
        assert 0 < delta < 0.01, (key, delta)
    # Its detector is BUTD's, the weights found where the user keeps them: known by name only (no sha256 is
    # published), so a file of another name is refused.
    weights = tmp_path / "elsewhere" / "faster_rcnn_from_caffe_attr.pkl"
    weights.parent.mkdir()
    weights.write_bytes(b"weights")
    pipeline(tmp_path / "run", device="cpu", detector_weights=weights)
    shutil.copy(weights, tmp_path / "elsewhere" / "other.pkl")
    with pytest.raises(ValueError, match="weights file 'faster_rcnn_from_caffe_attr.pkl' vs 'other.pkl'"):
        pipeline(tmp_path / "run", device="cpu", detector_weights=tmp_path / "elsewhere" / "other.pkl")


def test_regions_the_checkpoint_was_not_trained_on_are_refused(tmp_path, user, easy, caplog, capsys):
    root, published = user
    finetune = tool("finetune_vqa")
    # An import that does not say what made it: one line naming --extracted-with. A config that cuts below the
    # checkpoint's regions says so in one warning line first.
    import_tsv(root, tmp_path / "unknown")
    caplog.set_level(logging.WARNING)
    argv = finetune_argv(root, published, tmp_path / "unknown", tmp_path / "run") + ["--set", "data.max_regions=16"]
    capsys.readouterr()
    assert run_tool(finetune, argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--extracted-with" in errors[0] and "imported without saying" in errors[0]
    cuts = [r.getMessage() for r in caplog.records if "cuts below" in r.getMessage()]
    assert len(cuts) == 1 and "data.max_regions=16 (init_from: 100)" in cuts[0]
    # The offline timm detector's regions (the session's easy-VQA shards, as tools/extract_regions.py leaves them):
    # another backend.
    with pytest.raises(ValueError, match="has regions of timm.* trained on regions of detectron2:butd-vg"):
        pipeline(published, device="cpu")(easy.store["0"], "what color is the shape?")
    with pytest.raises(ValueError, match="was trained on regions of detector .*backend butd vs timm"):
        finetune(finetune_argv(root, published, easy.shards, tmp_path / "run"))
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_fine_tuning_refuses_regions_of_another_feature_size(tmp_path, user):
    """BUTD's regions (2048-d) for a UNITER whose region pathway reads 24-d features: the detector check passes,
    the feature size does not."""
    root, _ = user
    import_tsv(root, tmp_path / "shards", "--extracted-with", "butd-vg")
    small = convert_uniter_vqa(tmp_path / "small", feature_dim=24)
    with pytest.raises(ValueError, match="regions have 2048-d features, but init_from .* reads 24-d"):
        tool("finetune_vqa")(finetune_argv(root, small, tmp_path / "shards", tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_import_and_extraction_refusals_are_one_line(tmp_path, user, capsys):
    root, _ = user
    (tmp_path / "fields.yaml").write_text("backend: detectron2\nconfig_file: butd-vg\nweight: x.pkl\n")
    (tmp_path / "weights.pth").write_bytes(b"not the weights you think")
    cases = {
        r"'butd' is neither a known detector \(butd-vg\) nor a file": [
            "--from-tsv",
            str(root / "obj.tsv"),
            "--extracted-with",
            "butd",
        ],
        "unknown detector fields weight": [
            "--from-tsv",
            str(root / "obj.tsv"),
            "--extracted-with",
            str(tmp_path / "fields.yaml"),
        ],
        "--extracted-with says what made imported features": [
            "--images",
            str(root / "images"),
            "--extracted-with",
            "butd-vg",
        ],
        "has sha256 .* but the detector records 000000000000": [
            "--images",
            str(root / "images"),
            "--weights",
            str(tmp_path / "weights.pth"),
            "--weights-sha256",
            "0" * 64,
        ],
    }
    for message, argv in cases.items():
        capsys.readouterr()
        assert run_tool(tool("extract_regions"), [*argv, "--output-dir", str(tmp_path / "out")]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and re.search(message, errors[0]), (message, errors)
        assert not (tmp_path / "out").exists()
    # A file of detector fields (a run config's detector section) names them for an import.
    (tmp_path / "fields.yaml").write_text("detector:\n  backend: timm\n  input_size: 96\n  max_proposals: 8\n")
    import_tsv(root, tmp_path / "out", "--extracted-with", str(tmp_path / "fields.yaml"))
    info = json.loads((tmp_path / "out" / "detector.json").read_text())
    assert info["config"]["options"]["input_size"] == 96 and info["fingerprint"] == EASY_DETECTOR.fingerprint()


def test_region_cuts_are_said_once(quiet_cuts, caplog):
    from vlbert.processing.regions import region_item

    regions = Regions(
        "a",
        10,
        10,
        np.tile([[0, 0, 5, 5]], (6, 1)).astype(np.float32),
        np.zeros((6, 3), np.float16),
        np.ones(6, np.float32),
        None,
        "x",
    )
    caplog.set_level(logging.WARNING)
    assert len(region_item(regions, 4)["region_features"]) == 4
    assert len(region_item(regions, 6)["region_features"]) == 6  # nothing cut: nothing said
    region_item(regions, 4)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "max_regions=4 keeps the first 4 of image 'a''s 6 regions" in said[0]


# ------------------------------------------------------------------------------------------- the README's path
def test_the_readme_path_with_a_plain_pip_install(tmp_path, user, monkeypatch, quiet_cuts, caplog, capsys):
    """The README's commands with nothing but `pip install -e .`: BUTD regions from image files (the ``butd``
    backend, detectron2 hidden), a converted UNITER fine-tuned on them, answers from image files."""
    import sys

    import vlbert.detectors.butd_model as butd_model
    from vlbert.detectors.butd_model import ButdArchitecture, ButdSettings, random_butd_state

    monkeypatch.setitem(sys.modules, "detectron2", None)  # not installed
    root, _ = user
    published = convert_uniter_vqa(tmp_path / "published", feature_dim=512)
    # A CPU-sized BUTD model (one block a stage at a quarter of the width: 512-d features, 16 classes, 8
    # attributes; its sizes are read from the file as the real pkl's are) at 96-160 pixels with 24 proposals. The
    # sizes live in the module's settings, so the command and detector.json are the README's.
    monkeypatch.setattr(
        butd_model,
        "BUTD_VG_SETTINGS",
        ButdSettings.from_config_file(
            overrides={
                "INPUT.MIN_SIZE_TEST": 96,
                "INPUT.MAX_SIZE_TEST": 160,
                "MODEL.RPN.PRE_NMS_TOPK_TEST": 200,
                "MODEL.RPN.POST_NMS_TOPK_TEST": 24,
            }
        ),
    )
    models, work = tmp_path / "models", tmp_path / "work"
    models.mkdir()
    work.mkdir()
    monkeypatch.chdir(work)
    tiny = ButdArchitecture((1, 1, 1), 1, 16, 16, 12, 16, (8, 16, 32))
    weights = models / "faster_rcnn_from_caffe_attr.pkl"
    weights.write_bytes(pickle.dumps({"model": random_butd_state(tiny), "__author__": "test"}))
    (models / "objects_vocab.txt").write_text("".join(f"object{i}\n" for i in range(16)))
    (models / "attributes_vocab.txt").write_text("".join(f"attribute{i}\n" for i in range(8)))
    args = [
        "--images",
        str(root / "images"),
        "--backend",
        "butd",
        "--weights",
        str(weights),
        "--class-names",
        str(models / "objects_vocab.txt"),
        "--attribute-names",
        str(models / "attributes_vocab.txt"),
        "--output-dir",
        str(tmp_path / "shards"),
        "--batch-size",
        "8",
        "--device",
        "cpu",
    ]
    assert run_tool(tool("extract_regions"), args) == 0
    caplog.set_level(logging.WARNING)
    assert run_tool(tool("finetune_vqa"), finetune_argv(root, published, tmp_path / "shards", tmp_path / "run")) == 0
    assert_trained_on_the_checkpoints_settings(tmp_path / "run", caplog)

    # The weights move (another machine): the run says where to point it; there it answers from image files,
    # as it answers from the regions the tool extracted.
    kept = tmp_path / "kept" / "faster_rcnn_from_caffe_attr.pkl"
    kept.parent.mkdir()
    shutil.move(weights, kept)
    with pytest.raises(FileNotFoundError, match="detector_weights=PATH"):
        pipeline(tmp_path / "run", device="cpu")(str(root / "images" / "0.png"), "what color is the shape?")
    vqa = pipeline(tmp_path / "run", device="cpu", detector_weights=kept)
    from vlbert.detectors.store import RegionStore

    question = "what color is the shape?"
    from_file = vqa(str(root / "images" / "0.png"), question, top_k=len(ANSWERS))
    from_shards = vqa(RegionStore(tmp_path / "shards")["0"], question, top_k=len(ANSWERS))
    scores = {r["answer"]: r["score"] for r in from_shards}
    assert {r["answer"] for r in from_file} == set(scores)
    for r in from_file:
        assert abs(r["score"] - scores[r["answer"]]) < 1e-2
    capsys.readouterr()
    argv = [
        str(tmp_path / "run"),
        "--image",
        str(root / "images" / "0.png"),
        "--text",
        question,
        "--detector-weights",
        str(kept),
    ]
    assert run_tool(tool("predict"), argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["answer"] == from_file[0]["answer"]
    # Other weights under the same name: their sha256 is not the one detector.json recorded.
    other = tmp_path / "other" / "faster_rcnn_from_caffe_attr.pkl"
    other.parent.mkdir()
    other.write_bytes(kept.read_bytes() + b"\n")
    with pytest.raises(ValueError, match="are not the ones the regions were extracted with .*weights sha256"):
        pipeline(tmp_path / "run", device="cpu", detector_weights=other)
