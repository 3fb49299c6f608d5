"""The design card's core path on the project's own output, every guard on (issue 50): a text BERT pretrained by
``tools/pretrain.py --modality text``, shared with a region pathway by ``tools/pretrain.py --modality vl
--init-from`` it, fine-tuned by ``tools/finetune_vqa.py --init-from`` that, answering through
``tools/predict.py``. Each tool runs in-process through its ``main(argv)``, tiny, on the session's `easy`
regions (and four training images extracted with the same detector), with no ``allow_other_detector``."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, replace

import pytest
import torch
from helpers.builders import EASY_DETECTOR, tool

from vlbert.commands import run_tool
from vlbert.models import pretrained

TINY_TEXT = [
    "--set",
    "model.hidden_size=32",
    "--set",
    "model.num_hidden_layers=2",
    "--set",
    "model.num_attention_heads=2",
    "--set",
    "model.intermediate_size=48",
    "--set",
    "model.max_position_embeddings=64",
    "--set",
    "data.max_seq_length=32",
    "--set",
    "data.eval_fraction=0.0",
]
QUIET = [
    "--set",
    "training.batch_size=4",
    "--set",
    "training.warmup_steps=0",
    "--set",
    "training.learning_rate=1e-3",
    "--set",
    "training.eval_every=0",
    "--set",
    "training.progress_bar=false",
    "--max-steps",
    "2",
]
TRAIN_IMAGES = 4  # train/0..3: a caption each, and the first 38 training questions
EVAL_QUESTIONS = 20  # the first test questions, all about test/0 and test/1 (regions in the `easy` fixture)


@pytest.fixture
def shards(easy, tmp_path):
    """A shard directory as tools/extract_regions.py leaves it (detector.json naming EASY_DETECTOR): the `easy`
    regions of the test images under their easy-VQA ids, and the first training images extracted here."""
    from PIL import Image
    from vlbert.detectors.shards import write_detector_info, write_shards

    from vlbert.data.easy_vqa import image_paths

    extractor = EASY_DETECTOR.build()
    train_ids = [f"train/{n}" for n in range(TRAIN_IMAGES)]
    paths = image_paths("train")
    train = extractor.extract_batch([Image.open(paths[i]).convert("RGB") for i in train_ids], train_ids)
    test = [replace(easy.store[k], image_id=easy_id) for k, easy_id in easy.easy_ids.items()]
    write_shards(list(train) + test, tmp_path / "shards")
    write_detector_info(
        tmp_path / "shards",
        {"detector": extractor.name, "fingerprint": EASY_DETECTOR.fingerprint(), "config": asdict(EASY_DETECTOR)},
    )
    return tmp_path / "shards"


def loaded_states(monkeypatch) -> list[tuple[str, str, dict]]:
    """Record (model class, source, state dict just after loading) for every checkpoint a model loads."""
    seen = []
    original = pretrained.PreTrainedModel.load_converted_state_dict

    def spy(self, state, source="checkpoint", strict=False, **options):
        info = original(self, state, source, strict, **options)
        seen.append((type(self).__name__, str(source), {k: v.detach().clone() for k, v in self.state_dict().items()}))
        return info

    monkeypatch.setattr(pretrained.PreTrainedModel, "load_converted_state_dict", spy)
    return seen


def saved_state(run_dir, cls) -> dict:
    return cls.from_pretrained(run_dir).state_dict()


def test_text_run_then_vl_pretraining_then_vqa_then_predict(small_corpus, shards, easy, tmp_path, monkeypatch, caplog):
    from vlbert.data.vqa import easy_vqa_examples
    from vlbert.inference import pipeline
    from vlbert.models.bert import BertForPreTraining
    from vlbert.models.vl import VLBertForPreTraining

    text, vl, vqa = tmp_path / "text", tmp_path / "vl", tmp_path / "vqa"
    assert (
        run_tool(
            tool("pretrain"),
            [
                "--modality",
                "text",
                "--output-dir",
                str(text),
                "--set",
                f"data.corpus={small_corpus}",
                *TINY_TEXT,
                *QUIET,
            ],
        )
        == 0
    )
    assert "detector" not in json.loads((text / "processor.json").read_text())  # a text run: no regions

    seen = loaded_states(monkeypatch)
    caplog.set_level(logging.INFO, logger="vlbert.models.pretrained")
    region_data = ["--set", f"data.shards={shards}"]
    assert (
        run_tool(
            tool("pretrain"),
            [
                "--modality",
                "vl",
                "--init-from",
                str(text),
                "--output-dir",
                str(vl),
                *region_data,
                "--set",
                f"data.max_images={TRAIN_IMAGES}",
                "--set",
                "data.eval_fraction=0.0",
                *QUIET,
            ],
        )
        == 0
    )
    # The VL model started from the text run's BERT: every tensor of its encoder and MLM head equal to the text
    # run's; the region pathway new, said in one line.
    ((name, source, start),) = seen
    text_state = saved_state(text, BertForPreTraining)
    shared = [k for k in text_state if k in start]
    assert name == "VLBertForPreTraining" and source == str(text)
    assert any(k.startswith("bert.encoder.") for k in shared) and any(k.startswith("masked_lm.") for k in shared)
    for k in shared:
        assert torch.equal(start[k], text_state[k]), k
    assert {k for k in start if k not in text_state and k.startswith("bert.")} == {
        k for k in start if k.startswith("bert.region_embeddings.")
    }
    said = [r.getMessage() for r in caplog.records if "is a text BERT" in r.getMessage()]
    assert len(said) == 1 and "region_embeddings (11)" in said[0], said
    vl_state = saved_state(vl, VLBertForPreTraining)
    assert any(not torch.equal(vl_state[k], text_state[k]) for k in shared if k.startswith("bert.encoder."))  # trained

    assert (
        run_tool(
            tool("finetune_vqa"),
            [
                "--init-from",
                str(vl),
                "--output-dir",
                str(vqa),
                *region_data,
                "--set",
                "data.max_train_examples=38",
                "--set",
                f"data.max_eval_examples={EVAL_QUESTIONS}",
                *QUIET,
            ],
        )
        == 0
    )
    # The VQA model started from the VL run's weights, its region pathway included.
    (name, source, start) = seen[-1]
    assert name == "VLBertForVQA" and source == str(vl)
    for k, v in vl_state.items():
        if k.startswith("bert."):
            assert torch.equal(start[k], v), k
    info = {run: json.loads((run / "processor.json").read_text()) for run in (vl, vqa)}
    assert info[vl]["detector"]["fingerprint"] == info[vqa]["detector"]["fingerprint"] == EASY_DETECTOR.fingerprint()

    # predict reads the image files through the run's detector and answers as the run's own evaluation did.
    rows = [json.loads(line) for line in (vqa / "predictions.jsonl").read_text().splitlines()]
    image_of = {ex.question_id: ex.image_id for ex in easy_vqa_examples("test")[:EVAL_QUESTIONS]}
    files = {easy_id: easy.files[k] for k, easy_id in easy.easy_ids.items()}
    questions = tmp_path / "questions.jsonl"
    questions.write_text(
        "".join(
            json.dumps(
                {
                    "question_id": r["question_id"],
                    "question": r["question"],
                    "image": str(files[image_of[r["question_id"]]]),
                }
            )
            + "\n"
            for r in rows
        )
    )
    assert (
        run_tool(tool("predict"), [str(vqa), "--input", str(questions), "--output", str(tmp_path / "out.jsonl")]) == 0
    )
    answers = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    labels = info[vqa]["labels"]
    assert len(answers) == len(rows) == EVAL_QUESTIONS
    assert all(a["answer"] in labels for a in answers)
    assert [a["answer"] for a in answers] == [r["answer"] for r in rows]
    # ... and with the scores the model gives the regions it was evaluated on (the shards'), not another detector's.
    pipe = pipeline(vqa)
    stored = {easy_id: easy.store[k] for k, easy_id in easy.easy_ids.items()}
    for a in answers[:: EVAL_QUESTIONS // 2]:
        top = pipe(stored[image_of[a["question_id"]]], a["text"], top_k=1)[0]
        assert top["answer"] == a["answer"] and top["score"] == pytest.approx(a["score"], abs=1e-4)
