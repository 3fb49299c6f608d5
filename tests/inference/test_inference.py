"""Inference pipelines (vlbert.inference) and tools/predict.py: on the regions a run was evaluated on, each task's
pipeline gives the recipe's evaluation outputs; image files go through the run's own detector; another detector is
refused with both named; the benchmark result files cover every example."""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import asdict, replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers.builders import EASY_DETECTOR as DETECTOR  # the session's `easy` fixture
from helpers.builders import N_EASY_IMAGES as N_IMAGES
from helpers.builders import tool, write_jsonl
from vlbert.detectors.config import DetectorConfig
from vlbert.detectors.extract import extract_regions
from vlbert.detectors.shards import load_regions, shard_paths, write_detector_info, write_shards

from vlbert.commands import run_tool
from vlbert.data.easy_vqa import load_questions
from vlbert.inference import (
    PIPELINES,
    EntailmentPipeline,
    ImageIndex,
    ImagePairPipeline,
    ReferringPipeline,
    RetrievalPipeline,
    VLProcessor,
    VQAPipeline,
    pipeline,
)
from vlbert.recipes import RECIPES, TASKS, Task, run
from vlbert.run_files import PIPELINES_BY_EARLIER_NAME

TRAINING = {"max_steps": 2, "batch_size": 4, "warmup_steps": 1, "progress_bar": False, "log_every": 1}


def finetune(task: str, data: dict, out) -> dict:
    config = {
        "task": task,
        "init_from": "minilm",
        "detector": asdict(DETECTOR),
        "data": data,
        "training": {**TRAINING, "output_dir": str(out)},
    }
    return run(RECIPES[task], config)


@pytest.fixture(scope="module")
def vqa_run(easy):
    """A VQA run on the VQA v2 files of the 12 images' easy-VQA questions (train = eval)."""
    wanted = {v: k for k, v in easy.easy_ids.items()}
    questions = [q for q in load_questions("test") if q.image_id in wanted]
    records = [
        {"question_id": 1000 + n, "image_id": int(wanted[q.image_id]), "question": q.question}
        for n, q in enumerate(questions)
    ]
    (easy.root / "questions.json").write_text(json.dumps({"questions": records}))
    annotations = [
        {"question_id": r["question_id"], "answers": [{"answer": q.answer}] * 10}
        for r, q in zip(records, questions, strict=True)
    ]
    (easy.root / "annotations.json").write_text(json.dumps({"annotations": annotations}))
    out = easy.root / "vqa"
    files = {
        "train_questions": easy.root / "questions.json",
        "train_annotations": easy.root / "annotations.json",
        "eval_questions": easy.root / "questions.json",
        "eval_annotations": easy.root / "annotations.json",
    }
    finetune("vqa", {"dataset": "vqa-v2", "shards": str(easy.shards), **{k: str(v) for k, v in files.items()}}, out)
    return SimpleNamespace(dir=out, questions=records)


def test_a_run_saves_what_inference_needs(easy, vqa_run):
    info = json.loads((vqa_run.dir / "processor.json").read_text())
    assert info["task"] == "vqa" and info["max_text_length"] == 32 and info["max_regions"] == 16
    assert info["detector"]["fingerprint"] == DETECTOR.fingerprint()
    assert DetectorConfig(**info["detector"]["config"]) == DETECTOR
    assert info["detector"]["extractor"] == easy.store["0"].detector
    assert sorted(info["labels"]) == sorted(
        {a["answers"][0]["answer"] for a in json.loads((easy.root / "annotations.json").read_text())["annotations"]}
    )


def test_vqa_pipeline_answers_as_the_evaluation(easy, vqa_run):
    evaluated = {
        r["question_id"]: r["answer"]
        for r in map(json.loads, (vqa_run.dir / "predictions.jsonl").read_text().splitlines())
    }
    vqa = VQAPipeline(vqa_run.dir, device="cpu", batch_size=5)
    qs = vqa_run.questions
    answers = vqa([easy.store[str(q["image_id"])] for q in qs], [q["question"] for q in qs], top_k=3)
    assert {str(q["question_id"]): a[0]["answer"] for q, a in zip(qs, answers, strict=True)} == evaluated
    for a in answers:  # top-k: distinct answers, best first, sigmoid scores
        assert len({x["answer"] for x in a}) == 3 and a[0]["score"] >= a[1]["score"] >= a[2]["score"] > 0
    one = vqa(easy.store[str(qs[0]["image_id"])], qs[0]["question"])
    assert one[0]["answer"] == answers[0][0]["answer"] and abs(one[0]["score"] - answers[0][0]["score"]) < 1e-5
    # One image and several questions: the image is asked each question (it used to be one merged text pair).
    same_image = [q for q in qs if q["image_id"] == qs[0]["image_id"]][:3]
    assert len(same_image) == 3
    broadcast = vqa(easy.store[str(qs[0]["image_id"])], [q["question"] for q in same_image], top_k=3)
    expected = [answers[qs.index(q)] for q in same_image]
    assert [[x["answer"] for x in a] for a in broadcast] == [[x["answer"] for x in a] for a in expected]


def test_a_vqa_model_in_memory_answers_as_its_run(easy, vqa_run):
    """pipeline(model=VLBertForVQA, tokenizer=..., detector=...) answers from image files as the run directory's
    pipeline; without labels its answers are the answer indices; the task follows from the model's class."""
    from_run = pipeline(vqa_run.dir, device="cpu")
    in_memory = pipeline(
        model=from_run.model,
        tokenizer=from_run.tokenizer,
        detector=DETECTOR,
        labels=from_run.labels,
        max_text_length=from_run.processor.max_text_length,
        max_regions=from_run.processor.max_regions,
    )
    assert isinstance(in_memory, VQAPipeline)
    images = [str(easy.files[k]) for k in ("0", "1", "2")]
    questions = ["what color is the shape?", "what shape is this?", "is it a circle?"]
    expected = from_run(images, questions, top_k=2)
    assert in_memory(images, questions, top_k=2) == expected
    unnamed = pipeline(
        model=from_run.model,
        tokenizer=from_run.tokenizer,
        detector=DETECTOR,
        max_regions=from_run.processor.max_regions,
        max_text_length=from_run.processor.max_text_length,
    )
    assert [[from_run.labels[int(a["answer"])] for a in row] for row in unnamed(images, questions, top_k=2)] == [
        [a["answer"] for a in row] for row in expected
    ]
    with pytest.raises(ValueError, match="runs VLBertForSequenceClassification"):
        pipeline("visual-entailment", from_run.model, tokenizer=from_run.tokenizer)


def test_the_task_names_its_pipeline_and_older_runs_keep_theirs(vqa_run, tmp_path):
    info = json.loads((vqa_run.dir / "processor.json").read_text())
    assert TASKS["vqa"].pipeline is VQAPipeline and info["pipeline"] == VQAPipeline.name == "visual-question-answering"
    for name, task in TASKS.items():  # every task's pipeline is in the catalogue, its name given to the recipe
        assert PIPELINES[task.pipeline.name] is task.pipeline and RECIPES[name].pipeline == task.pipeline.name
    with pytest.raises(ValueError, match="does not hold under its name 'mine'"):
        Task(RECIPES["vqa"], type("Mine", (VQAPipeline,), {"name": "mine"}), "finetune/vqa-easy-vqa")
    old = tmp_path / "old"  # a run written before inference.json named the pipeline: its task did
    shutil.copytree(vqa_run.dir, old, ignore=shutil.ignore_patterns("checkpoints", "tensorboard", "processor.json"))
    (old / "inference.json").write_text(json.dumps({k: v for k, v in info.items() if k != "pipeline"}))
    assert type(pipeline(old, device="cpu")) is VQAPipeline
    renamed = tmp_path / "renamed"  # a run written before the pipelines were renamed: "pipeline": "vqa"
    shutil.copytree(old, renamed)
    (renamed / "inference.json").write_text(json.dumps({**info, "pipeline": "vqa"}))
    assert VLProcessor.from_pretrained(renamed).pipeline == "visual-question-answering"  # read with today's name
    assert type(pipeline(renamed, device="cpu")) is VQAPipeline
    assert type(pipeline("visual-question-answering", renamed, device="cpu")) is VQAPipeline
    with pytest.raises(ValueError, match="no pipeline for task 'vqa'"):  # code names today's pipelines only
        pipeline("vqa", renamed, device="cpu")
    assert set(PIPELINES_BY_EARLIER_NAME.values()) <= set(PIPELINES)


def test_image_files_are_extracted_with_the_runs_own_detector(easy, vqa_run):
    vqa = VQAPipeline(vqa_run.dir, device="cpu")
    from PIL import Image

    images = [easy.files["3"], Image.open(easy.files["4"]), np.asarray(Image.open(easy.files["5"]).convert("RGB"))]
    for image_id, regions in zip("345", vqa.regions(images), strict=True):
        stored = easy.store[image_id]
        assert regions.detector == stored.detector
        np.testing.assert_array_equal(regions.boxes, stored.boxes)
        # One image per detector call against 12: float16 rounding of the pooled features only.
        np.testing.assert_allclose(regions.features.astype(np.float32), stored.features.astype(np.float32), atol=1e-2)


def test_another_detector_is_refused_naming_both(easy, vqa_run):
    other = DetectorConfig(options={"input_size": 128, "max_proposals": 8})
    with pytest.raises(ValueError) as refused:
        VQAPipeline(vqa_run.dir, device="cpu", detector=other)
    assert DETECTOR.fingerprint() in str(refused.value) and other.fingerprint() in str(refused.value)
    assert "allow_other_detector" in str(refused.value)
    VQAPipeline(vqa_run.dir, device="cpu", detector=other, allow_other_detector=True)  # the explicit override

    vqa = VQAPipeline(vqa_run.dir, device="cpu")
    foreign = replace(easy.store["0"], detector="butd:resnet101-vg")
    with pytest.raises(
        ValueError,
        match=r"regions of butd:resnet101-vg, but the run was trained on regions of "
        + easy.store["0"].detector.replace("+", r"\+"),
    ):
        vqa(foreign, "what color is the shape?")


def test_predict_tool_writes_the_vqa_v2_results_file(easy, vqa_run, tmp_path):
    lines = [
        {"question_id": q["question_id"], "image": str(easy.files[str(q["image_id"])]), "question": q["question"]}
        for q in vqa_run.questions
    ]
    write_jsonl(tmp_path / "questions.jsonl", lines)
    assert (
        run_tool(
            tool("predict"),
            [
                str(vqa_run.dir),
                "--input",
                str(tmp_path / "questions.jsonl"),
                "--format",
                "vqa-v2",
                "--output",
                str(tmp_path / "results.json"),
                "--device",
                "cpu",
            ],
        )
        == 0
    )
    results = json.loads((tmp_path / "results.json").read_text())
    # The evaluation server's loader (VQA.loadRes) takes a list of {"question_id", "answer"} covering every question.
    assert isinstance(results, list) and all(set(r) == {"question_id", "answer"} for r in results)
    assert sorted(r["question_id"] for r in results) == sorted(q["question_id"] for q in vqa_run.questions)
    vqa = VQAPipeline(vqa_run.dir, device="cpu")
    expected = vqa([line["image"] for line in lines], [line["question"] for line in lines])
    assert [r["answer"] for r in results] == [a[0]["answer"] for a in expected]


def test_predict_tool_errors_are_one_line(vqa_run, tmp_path, capsys):
    assert run_tool(tool("predict"), [str(vqa_run.dir), "--text", "what color?"]) == 2
    assert "a visual-question-answering example needs image (flags: --image)" in capsys.readouterr().err
    assert run_tool(tool("predict"), [str(vqa_run.dir), "--image", "x.png", "--text", "?", "--format", "nlvr2"]) == 2
    assert "--format nlvr2 is for visual-reasoning runs" in capsys.readouterr().err
    assert run_tool(tool("predict"), [str(tmp_path), "--image", "x.png", "--text", "?"]) == 2
    assert "inference.json does not exist" in capsys.readouterr().err
    # An image the run would not read: refused, not silently dropped.
    assert run_tool(tool("predict"), [str(vqa_run.dir), "--image", "x.png", "--image2", "y.png", "--text", "?"]) == 2
    assert (
        "error: --image2 is not used: this visual-question-answering run reads one image (--image)"
        in capsys.readouterr().err
    )
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "inference.json").write_text(json.dumps({"task": "text-pretraining", "max_text_length": 16}))
    assert run_tool(tool("predict"), [str(tmp_path / "text"), "--image", "x.png", "--text", "a [MASK] circle"]) == 2
    assert "error: --image is not used: this text-fill-mask run reads no images" in capsys.readouterr().err


def test_nlvr2_pipeline_and_results_file_as_the_evaluation(easy, tmp_path):
    records = []
    for p in range(N_IMAGES // 2):
        shapes = [easy.truth[str(2 * p + j)][1] for j in (0, 1)]
        records += [
            {
                "identifier": f"dev-{p}-0-0",
                "sentence": "both images show a circle",
                "label": str(shapes == ["circle", "circle"]),
            },
            {"identifier": f"dev-{p}-0-1", "sentence": f"the left image shows a {shapes[0]}", "label": "True"},
        ]
    write_jsonl(tmp_path / "dev.json", records)
    out = tmp_path / "nlvr2"
    finetune(
        "nlvr2",
        {
            "dataset": "nlvr2",
            "train_file": str(tmp_path / "dev.json"),
            "eval_file": str(tmp_path / "dev.json"),
            "shards": str(easy.shards),
        },
        out,
    )
    evaluated = dict(csv.reader((out / "predictions.csv").read_text().splitlines()))
    assert set(evaluated) == {r["identifier"] for r in records}

    nlvr2 = ImagePairPipeline(out, device="cpu", batch_size=3)
    stem = [r["identifier"].rsplit("-", 1)[0] for r in records]
    results = nlvr2(
        [easy.store[f"{s}-img0"] for s in stem],
        [easy.store[f"{s}-img1"] for s in stem],
        [r["sentence"] for r in records],
    )
    assert {r["identifier"]: x["label"] for r, x in zip(records, results, strict=True)} == evaluated
    assert all(x["scores"][x["label"]] == x["score"] >= 0.5 for x in results)

    lines = [
        {
            "identifier": r["identifier"],
            "left": str(easy.files[str(2 * int(s.split("-")[1]))]),
            "right": str(easy.files[str(2 * int(s.split("-")[1]) + 1)]),
            "sentence": r["sentence"],
        }
        for r, s in zip(records, stem, strict=True)
    ]
    write_jsonl(tmp_path / "input.jsonl", lines)
    assert (
        run_tool(
            tool("predict"),
            [
                str(out),
                "--input",
                str(tmp_path / "input.jsonl"),
                "--format",
                "nlvr2",
                "--output",
                str(tmp_path / "predictions.csv"),
                "--device",
                "cpu",
            ],
        )
        == 0
    )
    written = list(csv.reader((tmp_path / "predictions.csv").read_text().splitlines()))
    assert [k for k, _ in written] == [r["identifier"] for r in records]
    assert {v for _, v in written} <= {"True", "False"}


def test_entailment_pipeline_labels_as_the_evaluation(easy, tmp_path):
    records = []
    for k, (color, shape) in easy.truth.items():
        other = "circle" if shape != "circle" else "triangle"
        records += [
            {
                "Flickr30K_ID": k,
                "sentence2": f"there is a {color} {shape}",
                "gold_label": "entailment",
                "pairID": f"{k}e",
            },
            {
                "Flickr30K_ID": k,
                "sentence2": f"there is a {color} {other}",
                "gold_label": "contradiction",
                "pairID": f"{k}c",
            },
            {
                "Flickr30K_ID": k,
                "sentence2": f"the {shape} is made of wood",
                "gold_label": "neutral",
                "pairID": f"{k}n",
            },
        ]
    write_jsonl(tmp_path / "ve.jsonl", records)
    out = tmp_path / "ve"
    finetune(
        "snli-ve",
        {
            "dataset": "snli-ve",
            "train_file": str(tmp_path / "ve.jsonl"),
            "eval_file": str(tmp_path / "ve.jsonl"),
            "shards": str(easy.shards),
        },
        out,
    )
    evaluated = {
        r["pairID"]: r["prediction"] for r in map(json.loads, (out / "predictions.jsonl").read_text().splitlines())
    }
    assert len(evaluated) == len(records)
    entailment = pipeline(out, device="cpu")
    assert isinstance(entailment, EntailmentPipeline)
    results = entailment([easy.store[r["Flickr30K_ID"]] for r in records], [r["sentence2"] for r in records])
    assert {r["pairID"]: x["label"] for r, x in zip(records, results, strict=True)} == evaluated
    assert all(abs(sum(x["scores"].values()) - 1) < 1e-5 for x in results)


def test_retrieval_pipeline_ranks_as_the_evaluation_and_its_index_reloads(easy, tmp_path):
    from vlbert.data.captions import load_karpathy_split
    from vlbert.evaluation.retrieval import evaluate_retrieval

    images = [
        {
            "filename": k,
            "split": "train" if int(k) < 6 else "test",
            "sentences": [{"raw": f"a {c} {s}"}, {"raw": f"the shape is a {s} colored {c}"}],
        }
        for k, (c, s) in easy.truth.items()
    ]
    (tmp_path / "captions.json").write_text(json.dumps({"images": images}))
    out = tmp_path / "retrieval"
    finetune(
        "retrieval",
        {
            "dataset": "karpathy",
            "captions_file": str(tmp_path / "captions.json"),
            "shards": str(easy.shards),
            "shortlist": 3,
        },
        out,
    )
    retrieval = RetrievalPipeline(out, device="cpu", batch_size=4)
    assert retrieval.shortlist == 3
    test = load_karpathy_split(tmp_path / "captions.json", "test")
    _, i2t, t2i = evaluate_retrieval(
        retrieval.model, test, easy.store, retrieval.processor, shortlist=3, return_scores=True
    )
    captions = [c for im in test for c in im.captions]
    ids = [im.image_id for im in test]

    index = retrieval.index_images([easy.store[i] for i in ids], image_ids=ids)
    found = retrieval.search(captions, index, top_k=len(ids))
    ranked = retrieval.captions([easy.store[i] for i in ids], captions, top_k=len(captions))
    # Each query's full ranking with the evaluation's scores (identical captions of look-alike images tie exactly,
    # so the scores, not the order among ties, are compared), best first.
    for matrix, results, key in ((t2i, found, lambda h: ids.index(h["image_id"])), (i2t, ranked, lambda h: h["index"])):
        for row, hits in zip(matrix, results, strict=True):
            assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
            torch.testing.assert_close(
                torch.tensor([h["score"] for h in hits]), row[[key(h) for h in hits]], atol=1e-4, rtol=0
            )
            assert sorted(key(h) for h in hits) == list(range(len(row)))

    # The ITM pipeline on a retrieval run scores with its re-ranker: P(match) = sigmoid(the cross-encoder's margin).
    itm = pipeline("image-text-matching", out, device="cpu")(easy.store[ids[0]], captions[:3])
    margins = retrieval.model.match_scores(**retrieval.processor.batch(captions[:3], [easy.store[ids[0]]] * 3, "cpu"))
    torch.testing.assert_close(torch.tensor([r["score"] for r in itm]), margins.detach().sigmoid(), atol=1e-5, rtol=0)

    index.save(tmp_path / "index")
    with pytest.raises(FileExistsError, match="is not empty"):
        index.save(tmp_path / "index")
    reloaded = ImageIndex.load(tmp_path / "index")
    again = retrieval.search(captions[:2], reloaded, top_k=3)
    assert [[h["image_id"] for h in hits] for hits in again] == [[h["image_id"] for h in f[:3]] for f in found[:2]]
    assert reloaded.image_ids == ids and torch.equal(reloaded.embeddings, index.embeddings)


def test_referring_pipeline_boxes_as_the_evaluation(easy, tmp_path):
    from vlbert.data.refcoco import easy_vqa_composites

    cache = tmp_path / "cache"
    config = {
        "task": "refcoco",
        "init_from": "minilm",
        "detector": asdict(DETECTOR),
        "data": {"cache_dir": str(cache), "train_images": 8, "eval_images": 6},
        "training": {**TRAINING, "output_dir": str(tmp_path / "out")},
    }
    run(RECIPES["refcoco"], config)
    evaluated = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    stores = {p.parent for p in cache.rglob("*.tar")}
    regions = load_regions([p for d in stores for p in shard_paths(d)])
    referring = ReferringPipeline(tmp_path / "out", device="cpu")
    assert referring.processor.info["boxes"] == "given"
    results = referring([regions[r["image_id"]] for r in evaluated], [r["expression"] for r in evaluated])
    assert [x["box"] for x in results] == [r["box"] for r in evaluated]
    assert [x["region"] for x in results] == [r["region"] for r in evaluated]

    examples, files, tiles = easy_vqa_composites("test", 6, cache / "refcoco-composite-images", 0)
    with pytest.raises(ValueError, match="trained on given candidate boxes"):
        referring(files[examples[0].image_id], examples[0].expression)
    extracted = referring.regions([files[examples[0].image_id]], boxes=[tiles[examples[0].image_id]])[0]
    np.testing.assert_array_equal(extracted.boxes, regions[examples[0].image_id].boxes)
    # One file given twice with two sets of boxes: each pools its own (both pooled the last set before).
    file, own = files[examples[0].image_id], tiles[examples[0].image_id]
    twice = referring.regions([file, file], boxes=[own, own[::-1][:2]])
    np.testing.assert_array_equal(twice[0].boxes, own)
    np.testing.assert_array_equal(twice[1].boxes, own[::-1][:2])  # a reversed view: any array of boxes will do
    a, b = twice[0].features.astype(np.float32), extracted.features.astype(np.float32)
    np.testing.assert_allclose(a, b, rtol=2e-3, atol=1e-3)  # float16 features of another batch
    np.testing.assert_allclose(twice[1].features.astype(np.float32), a[::-1][:2], rtol=2e-3, atol=1e-3)
    assert twice[0].image_id == twice[1].image_id == str(file)
    result = referring(files[examples[0].image_id], examples[0].expression, boxes=tiles[examples[0].image_id])
    picture = referring.draw(files[examples[0].image_id], result)
    x1, y1 = (int(v) for v in result["box"][:2])
    assert picture.size == (128, 128) and picture.getpixel((x1, y1)) == (255, 0, 0)


def test_fine_tuning_from_a_run_refuses_another_detectors_regions(easy, vqa_run, tmp_path):
    """The timm detector at another input size gives features of the same size: fine-tuning from a run trained on
    the first on regions of the second used to pass silently. Refused naming both; allowed when asked."""
    other = DetectorConfig(options={"input_size": 128, "max_proposals": 8})
    extractor = other.build()
    regions = list(extract_regions(extractor, list(easy.files.items()), batch_size=N_IMAGES, progress=False))
    assert regions[0].feature_dim == easy.store["0"].feature_dim
    write_shards(regions, tmp_path / "shards")
    write_detector_info(
        tmp_path / "shards", {"detector": extractor.name, "fingerprint": other.fingerprint(), "config": asdict(other)}
    )
    files = {
        k: str(easy.root / f"{k.split('_')[1]}.json")
        for k in ("train_questions", "train_annotations", "eval_questions", "eval_annotations")
    }
    config = {
        "task": "vqa",
        "init_from": str(vqa_run.dir),
        "detector": asdict(other),
        "data": {"dataset": "vqa-v2", "shards": str(tmp_path / "shards"), **files},
        "training": {**TRAINING, "max_steps": 1, "output_dir": str(tmp_path / "run")},
    }
    with pytest.raises(ValueError) as refused:
        run(RECIPES["vqa"], config)
    assert DETECTOR.fingerprint() in str(refused.value) and other.fingerprint() in str(refused.value)
    assert not (tmp_path / "run").exists()
    run(RECIPES["vqa"], {**config, "allow_other_detector": True})
    info = json.loads((tmp_path / "run" / "processor.json").read_text())
    assert info["detector"]["fingerprint"] == other.fingerprint()  # the new run records its own regions


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory) -> dict:
    """case -> (predict's flags, the name its one-line refusal must give), over files written once for the module
    (the 400-megapixel PNG alone takes about a second to write)."""
    from PIL import Image

    tmp = tmp_path_factory.mktemp("bad-inputs")
    (tmp / "notes.txt").write_text("not an image")
    (tmp / "a-folder.png").mkdir()
    good = tmp / "good.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(good)
    (tmp / "truncated.png").write_bytes(good.read_bytes()[:60])
    Image.new("1", (20000, 20000)).save(tmp / "huge.png")  # 400 megapixels: a decompression bomb, not a photo
    (tmp / "broken.jsonl").write_text('{"image": "good.png", "text": "what color?"}\n{"image": "good.png", "tex\n')
    (tmp / "no-text.jsonl").write_text('{"image": "good.png"}\n')
    (tmp / "missing-image.jsonl").write_text('{"image": "gone.png", "text": "what color?"}\n')
    (tmp / "no-id.jsonl").write_text('{"image": "good.png", "text": "what color?"}\n')
    img = ["--text", "what color?", "--image"]
    return {
        "missing-image": (img + [str(tmp / "gone.png")], "gone.png"),
        "directory-image": (img + [str(tmp / "a-folder.png")], "a-folder.png"),
        "not-an-image": (img + [str(tmp / "notes.txt")], "notes.txt"),
        "truncated-image": (img + [str(tmp / "truncated.png")], "truncated.png"),
        "huge-image": (img + [str(tmp / "huge.png")], "huge.png"),
        "broken-jsonl": (["--input", str(tmp / "broken.jsonl")], "broken.jsonl:2"),
        "jsonl-without-text": (["--input", str(tmp / "no-text.jsonl")], "no-text.jsonl:1"),
        "jsonl-missing-image": (["--input", str(tmp / "missing-image.jsonl")], "gone.png"),
        "missing-input": (["--input", str(tmp / "nowhere.jsonl")], "nowhere.jsonl"),
        "format-without-ids": (["--input", str(tmp / "no-id.jsonl"), "--format", "vqa-v2"], "question_id"),
        "top-k-zero": (img + [str(good), "--top-k", "0"], "--top-k"),
        "batch-size-zero": (img + [str(good), "--batch-size", "0"], "--batch-size"),
    }


BAD_INPUTS = [
    "missing-image",
    "directory-image",
    "not-an-image",
    "truncated-image",
    "huge-image",
    "broken-jsonl",
    "jsonl-without-text",
    "jsonl-missing-image",
    "missing-input",
    "format-without-ids",
    "top-k-zero",
    "batch-size-zero",
]


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_predict_refuses_bad_input_in_one_line_and_keeps_the_output(vqa_run, bad_inputs, tmp_path, capsys, case):
    argv, named = bad_inputs[case]
    output = tmp_path / "results.jsonl"
    output.write_text("an earlier run's results\n")
    capsys.readouterr()
    status = run_tool(tool("predict"), [str(vqa_run.dir), *argv, "--output", str(output)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and "Traceback" not in err and lines[-1].startswith("error: "), err
    assert named in lines[-1], lines[-1]
    assert output.read_text() == "an earlier run's results\n"


def test_images_in_other_modes_are_answered(vqa_run, tmp_path):
    """Greyscale, RGBA, palette and 16-bit images are converted, not refused."""
    from PIL import Image

    base = Image.new("RGB", (64, 64), (30, 30, 200))
    files = {
        "L": base.convert("L"),
        "RGBA": base.convert("RGBA"),
        "P": base.convert("P"),
        "I;16": Image.new("I;16", (64, 64), 3000),
        "LA": base.convert("LA"),
        "CMYK": base.convert("CMYK"),
    }
    vqa = VQAPipeline(vqa_run.dir, device="cpu")
    for mode, image in files.items():
        path = tmp_path / f"{mode.replace(';', '')}.{'jpg' if mode == 'CMYK' else 'png'}"
        image.save(path)
        answer = vqa(str(path), "what color is the shape?")
        assert answer[0]["answer"] in json.loads((vqa_run.dir / "processor.json").read_text())["labels"], mode


# ------------------------------------------------------------------------------------------- image-text matching
@pytest.fixture(scope="module")
def pretraining_run(easy, tmp_path_factory):
    """A VL pretraining run directory as tools/pretrain.py leaves it (a tiny VLBertForPreTraining, the MiniLM
    tokenizer, processor.json naming the run's detector), over the `easy` regions."""
    from vlbert.config import VLBertConfig
    from vlbert.models.vl import VLBertForPreTraining
    from vlbert.run_files import write_processor_record
    from vlbert.tokenization import load_tokenizer

    out = tmp_path_factory.mktemp("vl-pretraining")
    tokenizer = load_tokenizer()
    torch.manual_seed(0)
    config = VLBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        region_feature_dim=easy.store["0"].feature_dim,
        num_region_classes=0,
    )
    model = VLBertForPreTraining(config)
    with torch.no_grad():  # an ITM head that tells pairs apart (a fresh one scores every pair near 0.5)
        model.itm.weight.normal_(0, 2.0)
    model.save_pretrained(out, tokenizer=tokenizer)
    write_processor_record(
        out,
        {
            "task": "vl-pretraining",
            "max_text_length": 32,
            "max_regions": 16,
            "region_feature_dim": config.region_feature_dim,
            "detector": {
                "fingerprint": DETECTOR.fingerprint(),
                "config": asdict(DETECTOR),
                "extractor": easy.store["0"].detector,
            },
        },
    )
    return out


def test_image_text_matching_pipeline_scores_as_the_model(easy, pretraining_run):
    from vlbert.models.vl import VLBertForPreTraining

    itm = pipeline("image-text-matching", pretraining_run, device="cpu", batch_size=2)
    captions = [f"a {c} {s}" for c, s in (easy.truth[k] for k in ("0", "1", "2"))]
    one = itm(easy.store["0"], captions)  # one image, several captions: one result per caption, in order
    assert [r["text"] for r in one] == captions and [r["index"] for r in one] == [0, 1, 2]
    model = VLBertForPreTraining.from_pretrained(pretraining_run).eval()
    batch = itm.processor.batch(captions, [easy.store["0"]] * 3, "cpu")
    with torch.no_grad():  # the model's forward given ITM labels: the logits the trained head computes
        logits = model(**batch, itm_label=torch.ones(3, dtype=torch.long)).seq_relationship_logits
    torch.testing.assert_close(torch.tensor([r["score"] for r in one]), logits.softmax(-1)[:, 1], atol=1e-5, rtol=0)
    assert [r["match"] for r in one] == (logits.argmax(-1) == 1).tolist()
    assert len({round(r["score"], 4) for r in one}) > 1  # the pairs are told apart

    best = itm(easy.store["0"], captions, top_k=2)
    assert [r["text"] for r in best] == [r["text"] for r in sorted(one, key=lambda r: -r["score"])[:2]]
    images = itm([easy.files["0"], easy.store["1"]], captions[0])  # several images (a file: the run's detector)
    assert images[0]["image"] == str(easy.files["0"]) and "image" not in images[1]
    assert images[0]["score"] == pytest.approx(one[0]["score"], abs=1e-5)
    single = itm(easy.store["1"], captions[0])  # one image and one caption: one result
    assert isinstance(single, dict) and single["score"] == pytest.approx(images[1]["score"], abs=1e-5)
    with pytest.raises(ValueError, match="has no text"):
        itm(easy.store["0"])
    with pytest.raises(
        ValueError,
        match="is a 'vl-pretraining' run, but visual-question-answering takes runs whose pipeline is "
        "visual-question-answering",
    ):
        pipeline("visual-question-answering", pretraining_run)


def test_predict_tool_takes_the_image_text_matching_task(easy, pretraining_run, vqa_run, tmp_path, capsys):
    (tmp_path / "captions.txt").write_text("a red circle\n\na blue square\na green triangle\n")
    write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"id": "pair", "image": str(easy.files["0"]), "caption": "a blue square"},
            {"id": "rank", "image": str(easy.files["0"])},
        ],
    )
    argv = [str(pretraining_run), "--task", "image-text-matching", "--device", "cpu"]
    assert (
        run_tool(
            tool("predict"),
            argv
            + ["--input", str(tmp_path / "in.jsonl"), "--captions", str(tmp_path / "captions.txt"), "--top-k", "2"],
        )
        == 0
    )
    pair, ranked = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    expected = pipeline("image-text-matching", pretraining_run, device="cpu")(
        easy.store["0"], ["a red circle", "a blue square", "a green triangle"]
    )
    assert pair["id"] == "pair" and pair["score"] == pytest.approx(expected[1]["score"], abs=1e-5)
    assert pair["match"] == expected[1]["match"]
    best = sorted(expected, key=lambda r: -r["score"])[:2]
    assert [(r["caption"], r["index"]) for r in ranked["captions"]] == [(e["text"], e["index"]) for e in best]
    for bad, message in (
        (
            [str(vqa_run.dir), "--task", "image-text-matching", "--image", "x.png", "--text", "a"],
            "is a 'vqa' run, but image-text-matching takes vl-pretraining or retrieval runs",
        ),
        (argv + ["--image", "x.png", "--text", "a", "--top-k", "2"], "--top-k ranks the --captions FILE's captions"),
        (argv + ["--image", "x.png"], "needs a caption"),
        ([str(pretraining_run), "--task", "captioning", "--text", "a"], "no pipeline for task 'captioning'"),
    ):
        assert run_tool(tool("predict"), bad) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
