"""The published fine-tuning recipes (configs/finetune/uniter-base-*.yaml, visualbert-*.yaml): each resolves with its
``_base_``, keeps the values it cites from the reference's config file, and runs 2 steps through its tool on fixture
files in the benchmark's real format (a tiny model, the shared regions of 8 easy-VQA images)."""

from __future__ import annotations

import json
import pickle
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.builders import tool, write_jsonl
from vlbert.detectors.store import RegionStore

from vlbert.inference import pipeline
from vlbert.recipes import RECIPES
from vlbert.training.run_config import dataclass_from_section, load_run_config
from vlbert.training.trainer import TrainingConfig

ROOT = Path(__file__).resolve().parents[2] / "configs" / "finetune"
#: config -> (its tool, values it must hold after _base_ resolution: UNITER's / VisualBERT's own).
RECIPE_CONFIGS = {
    "uniter-base-vqa-v2": (
        "finetune_vqa",
        {"training.learning_rate": 8e-5, "training.max_steps": 6000, "training.warmup_steps": 600},
    ),
    "uniter-base-flickr30k-retrieval": (
        "finetune_retrieval",
        {"training.learning_rate": 5e-5, "training.max_steps": 20000},
    ),
    "uniter-base-nlvr2": ("finetune_nlvr2", {"training.learning_rate": 3e-5, "training.max_steps": 8000}),
    "uniter-base-snli-ve": ("finetune", {"training.learning_rate": 8e-5, "training.max_steps": 4000}),
    "uniter-base-refcoco+": ("finetune", {"training.learning_rate": 6e-5, "training.max_steps": 10000}),
    "visualbert-vqa": ("finetune_vqa", {"training.learning_rate": 2e-5, "data.max_text_length": 128}),
    "visualbert-nlvr2": ("finetune_nlvr2", {"training.learning_rate": 2e-5, "data.max_regions": 144}),
    "lxmert-vqa-v2": (
        "finetune_vqa",
        {"training.learning_rate": 5e-5, "training.batch_size": 32, "data.max_text_length": 20, "data.max_regions": 36},
    ),
    "lxmert-gqa": (
        "finetune_vqa",
        {
            "training.learning_rate": 1e-5,
            "training.batch_size": 32,
            "data.dataset": "gqa",
            "detector.options.max_boxes": 36,
        },
    ),
}
UNITER_SHARED = {
    "data.max_text_length": 60,
    "data.max_regions": 100,
    "training.adam_beta2": 0.98,
    "training.max_grad_norm": 2.0,
    "detector.options.max_boxes": 100,
    "detector.options.score_threshold": 0.2,
}


def dotted(config: dict, key: str):
    for name in key.split("."):
        config = config[name]
    return config


@pytest.mark.parametrize("name", sorted(RECIPE_CONFIGS))
def test_recipe_resolves_with_its_base_and_keeps_the_cited_values(name):
    config = load_run_config(ROOT / f"{name}.yaml")
    expected = {**(UNITER_SHARED if name.startswith("uniter") else {}), **RECIPE_CONFIGS[name][1]}
    assert {k: dotted(config, k) for k in expected} == expected
    recipe = RECIPES[config["task"]]
    data = dataclass_from_section(recipe.data_config, config["data"], "data")
    TrainingConfig.from_dict(config["training"]).validate()
    assert data.dataset not in ("easy-vqa", "") and config["init_from"].startswith("models/")


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """8 easy-VQA images' regions under the ids each benchmark's files name them by (COCO / Flickr30K numbers, Karpathy
    file names, NLVR2 ``<stem>-img<k>``), a tiny VL model with the MiniLM tokenizer to start from, and each
    benchmark's files in its public format."""
    from PIL import Image
    from vlbert.detectors.config import DetectorConfig
    from vlbert.detectors.shards import write_detector_info, write_shards

    from vlbert.config import VLBertConfig
    from vlbert.data.easy_vqa import color_and_shape, image_paths
    from vlbert.models.vl import VLBertModel
    from vlbert.tokenization import load_tokenizer

    root = tmp_path_factory.mktemp("recipes")
    truth = list(color_and_shape("train").items())[:8]
    paths = image_paths("train")
    detector = DetectorConfig(options={"input_size": 96, "max_proposals": 8})
    regions = detector.build().extract_batch(
        [Image.open(paths[i]).convert("RGB") for i, _ in truth], [str(k) for k in range(8)]
    )
    numbers = [1000 + k for k in range(8)]
    ids = (
        [str(n) for n in numbers]
        + [f"{n}.jpg" for n in numbers]
        + [f"dev-{p}-0-img{j}" for p in range(4) for j in (0, 1)]
    )
    write_shards([replace(regions[k % 8], image_id=i) for k, i in enumerate(ids)], root / "shards")
    attrs = [a for _, a in truth]
    # the same regions with the record tools/extract_regions.py writes: a run on them rebuilds its detector to answer
    write_shards([replace(regions[k], image_id=str(n)) for k, n in enumerate(numbers)], root / "detected")
    write_detector_info(
        root / "detected",
        {"detector": regions[0].detector, "fingerprint": detector.fingerprint(), "config": asdict(detector)},
    )

    questions = [
        {"question_id": 10 * n + q, "image_id": n, "question": text}
        for n, (c, s) in zip(numbers, attrs, strict=True)
        for q, text in enumerate(("what color is it?", "what shape?"))
    ]
    (root / "q.json").write_text(json.dumps({"questions": questions}))
    (root / "a.json").write_text(
        json.dumps(
            {
                "annotations": [
                    {"question_id": r["question_id"], "answers": [{"answer": a[r["question_id"] % 10]}] * 10}
                    for r, a in zip(questions, [a for a in attrs for _ in (0, 1)], strict=True)
                ]
            }
        )
    )
    (root / "karpathy.json").write_text(
        json.dumps(
            {
                "images": [
                    {
                        "filename": f"{n}.jpg",
                        "split": "train" if k < 5 else "test",
                        "sentences": [{"raw": f"a {c} {s}"}],
                    }
                    for k, (n, (c, s)) in enumerate(zip(numbers, attrs, strict=True))
                ]
            }
        )
    )
    write_jsonl(
        root / "nlvr2.jsonl",
        [
            {
                "identifier": f"dev-{p}-0-0",
                "sentence": "both images show a circle",
                "label": "True" if p % 2 else "False",
            }
            for p in range(4)
        ],
    )
    write_jsonl(
        root / "ve.jsonl",
        [
            {
                "Flickr30K_ID": str(n),
                "sentence2": f"there is a {c} {s}",
                "gold_label": "entailment" if k % 2 else "contradiction",
            }
            for k, (n, (c, s)) in enumerate(zip(numbers, attrs, strict=True))
        ],
    )
    refs = [
        {
            "ref_id": k,
            "ann_id": 100 + k,
            "image_id": n,
            "split": "train" if k < 6 else "val",
            "sentences": [{"sent": f"the {c} {s}"}],
        }
        for k, (n, (c, s)) in enumerate(zip(numbers, attrs, strict=True))
    ]
    (root / "gqa.json").write_text(
        json.dumps(
            {  # GQA's balanced-split layout, image ids as strings
                str(10 * n + q): {"imageId": str(n), "question": text, "answer": a[q]}
                for n, a in zip(numbers, attrs, strict=True)
                for q, text in enumerate(("what color is it?", "what shape?"))
            }
        )
    )
    (root / "refs.p").write_bytes(pickle.dumps(refs, protocol=2))
    (root / "instances.json").write_text(
        json.dumps(
            {
                "images": [{"id": n, "width": regions[0].width, "height": regions[0].height} for n in numbers],
                "annotations": [
                    {"id": 100 + k, "bbox": [0, 0, regions[0].width / 2, regions[0].height / 2]} for k in range(8)
                ],
            }
        )
    )

    tokenizer = load_tokenizer()
    torch.manual_seed(0)
    model = VLBertModel(
        VLBertConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=48,
            max_position_embeddings=160,
            type_vocab_size=2,
            region_feature_dim=regions[0].feature_dim,
        )
    )
    model.save_pretrained(root / "tiny", tokenizer=tokenizer)
    two_stream = VLBertModel(
        replace(
            model.config,
            encoder="two-stream",
            l_layers=1,
            r_layers=1,
            x_layers=1,
            region_embedding="lxmert",
            region_location_dim=4,
        )
    )
    two_stream.save_pretrained(root / "tiny-lxmert", tokenizer=tokenizer)
    return SimpleNamespace(
        root=root,
        shards=root / "shards",
        detected=root / "detected",
        tiny=root / "tiny",
        tiny_lxmert=root / "tiny-lxmert",
        files={str(n): paths[i] for n, (i, _) in zip(numbers, truth, strict=True)},
    )


DATA_FILES = {
    "vqa": (
        "train_questions=q.json",
        "train_annotations=a.json",
        "eval_questions=q.json",
        "eval_annotations=a.json",
        "min_answer_count=1",
    ),
    "retrieval": ("captions_file=karpathy.json", "max_eval_images=3", "shortlist=3"),
    "nlvr2": ("train_file=nlvr2.jsonl", "eval_file=nlvr2.jsonl"),
    "snli-ve": ("train_file=ve.jsonl", "eval_file=ve.jsonl"),
    "refcoco": ("refs_file=refs.p", "instances_file=instances.json"),
    "lxmert-gqa": ("train_questions=gqa.json", "eval_questions=gqa.json", "min_answer_count=1"),
}


@pytest.mark.parametrize("name", sorted(RECIPE_CONFIGS))
def test_recipe_runs_two_steps_through_its_tool(fixtures, name, tmp_path):
    tool_name = RECIPE_CONFIGS[name][0]
    task = load_run_config(ROOT / f"{name}.yaml")["task"]
    sets = [
        f"data.{item.split('=')[0]}={fixtures.root / item.split('=')[1]}"
        if item.split("=")[1].endswith((".json", ".jsonl", ".p"))
        else f"data.{item}"
        for item in DATA_FILES.get(name, DATA_FILES[task])
    ]
    init = fixtures.tiny_lxmert if name.startswith("lxmert") else fixtures.tiny  # LXMERT: the two-stream encoder
    argv = [
        "--config",
        str(ROOT / f"{name}.yaml"),
        "--init-from",
        str(init),
        "--output-dir",
        str(tmp_path / "run"),
        "--max-steps",
        "2",
        "--set",
        f"data.shards={fixtures.detected if name == 'lxmert-gqa' else fixtures.shards}",
        "--set",
        "training.batch_size=2",
        "--set",
        "training.grad_accum_steps=1",
        "--set",
        "training.warmup_steps=1",
        "--set",
        "training.eval_every=0",
        "--set",
        "training.progress_bar=false",
        "--set",
        "training.log_every=1",
    ]
    for item in sets:
        argv += ["--set", item]
    if tool_name == "finetune":
        argv += ["--task", task]
    assert tool(tool_name)(argv) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["step"] == 2
    info = json.loads((tmp_path / "run" / "processor.json").read_text())
    assert info["task"] == task and info["max_regions"] == load_run_config(ROOT / f"{name}.yaml")["data"]["max_regions"]
    if name == "lxmert-gqa":
        check_gqa_answers(tmp_path / "run", fixtures, tmp_path)


def check_gqa_answers(run, fixtures, tmp_path):
    """A GQA run writes the GQA challenge's submission file with tools/predict.py (the image's regions extracted by
    the run's own detector), and pipeline() gives the same answers from the image's stored regions."""
    questions = [(qid, q) for qid, q in json.loads((fixtures.root / "gqa.json").read_text()).items()][:2]
    image = questions[0][1]["imageId"]  # one image, its two questions: one extraction
    lines = [
        {"question_id": qid, "image": str(fixtures.files[image]), "question": q["question"]} for qid, q in questions
    ]
    write_jsonl(tmp_path / "gqa.jsonl", lines)
    assert (
        tool("predict")(
            [
                str(run),
                "--input",
                str(tmp_path / "gqa.jsonl"),
                "--format",
                "gqa",
                "--output",
                str(tmp_path / "submit.json"),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "submit.json").read_text())
    assert [set(r) for r in results] == [{"questionId", "prediction"}] * 2
    assert [r["questionId"] for r in results] == [line["question_id"] for line in lines]
    regions = RegionStore(fixtures.detected)[image]
    expected = pipeline(run, device="cpu")([regions] * 2, [line["question"] for line in lines])
    assert [r["prediction"] for r in results] == [a[0]["answer"] for a in expected]
