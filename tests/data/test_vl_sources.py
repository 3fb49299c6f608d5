"""Image-text data from the public caption formats with region shards on disk: one reader test per format with its
bad inputs, the region store against the in-memory reader, and VL pretraining end to end from a COCO captions JSON +
a bottom-up-attention TSV (real easy-VQA images through the extractor, written in those formats)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.builders import tool

from vlbert.commands import run_tool
from vlbert.data.captions import load_caption_jsonl, load_caption_tsv, load_coco_captions, load_karpathy_split
from vlbert.processing import VLProcessor

ROOT = Path(__file__).resolve().parents[2]


def test_coco_captions_json(tmp_path):
    data = {
        "images": [{"id": 391895, "file_name": "COCO_val2014_000000391895.jpg"}, {"id": 7, "file_name": "x.jpg"}],
        "annotations": [
            {"image_id": 391895, "caption": "A man riding a bike."},
            {"image_id": 391895, "caption": "A cyclist on a road."},
            {"image_id": 7, "caption": "  "},
        ],
    }
    (tmp_path / "c.json").write_text(json.dumps(data))
    [image] = load_coco_captions(tmp_path / "c.json", "COCO_val2014_{image_id:012d}")  # blank captions dropped
    assert image.image_id == "COCO_val2014_000000391895" and len(image.captions) == 2
    assert load_coco_captions(tmp_path / "c.json", "{stem}")[0].image_id == "COCO_val2014_000000391895"
    with pytest.raises(ValueError, match="does not fit the record's fields"):
        load_coco_captions(tmp_path / "c.json", "{cocoid}")
    (tmp_path / "k.json").write_text(json.dumps({"images": []}))
    with pytest.raises(ValueError, match="no 'annotations' list; is it a COCO captions file"):
        load_coco_captions(tmp_path / "k.json")
    with pytest.raises(FileNotFoundError):
        load_coco_captions(tmp_path / "none.json")


def test_karpathy_tsv_and_jsonl(tmp_path):
    karpathy = {
        "images": [
            {"split": "restval", "filename": "a.jpg", "cocoid": 1, "sentences": [{"raw": "a dog"}]},
            {"split": "test", "filename": "b.jpg", "cocoid": 2, "sentences": [{"raw": "a cat"}]},
        ]
    }
    (tmp_path / "k.json").write_text(json.dumps(karpathy))
    assert [i.image_id for i in load_karpathy_split(tmp_path / "k.json", "train", "{cocoid}")] == ["1"]
    (tmp_path / "cc.tsv").write_text("a dog on grass\t000001.jpg\na red bus\t000002.jpg\n")
    images = load_caption_tsv(tmp_path / "cc.tsv", "{stem}")
    assert [(i.image_id, i.captions) for i in images] == [("000001", ("a dog on grass",)), ("000002", ("a red bus",))]
    (tmp_path / "bad.tsv").write_text("a caption without a key\n")
    with pytest.raises(ValueError, match=r"bad.tsv:1: 1 columns; a caption TSV has 2"):
        load_caption_tsv(tmp_path / "bad.tsv")
    (tmp_path / "vg.jsonl").write_text(
        '{"image_id": 10, "caption": "white clouds"}\n\n{"image_id": 10, "caption": "blue sky"}\n'
    )
    assert load_caption_jsonl(tmp_path / "vg.jsonl", "vg{image_id}")[0].captions == ("white clouds", "blue sky")
    (tmp_path / "bad.jsonl").write_text('{"image_id": 10}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: needs 'image_id' and 'caption'"):
        load_caption_jsonl(tmp_path / "bad.jsonl")
    (tmp_path / "worse.jsonl").write_text("not json\n")
    with pytest.raises(ValueError, match=r"worse.jsonl:1, column \d+: not valid JSON for the caption file"):
        load_caption_jsonl(tmp_path / "worse.jsonl")


def test_region_store_equals_the_reader_and_stays_on_disk(tmp_path):
    from vlbert.detectors.regions import Regions
    from vlbert.detectors.shards import load_regions, shard_paths, write_shards
    from vlbert.detectors.store import NamespacedRegions, RegionStore

    rng = np.random.default_rng(0)
    regions = [
        Regions(
            f"img.{i}",
            60,
            80,
            np.array([[0, 0, 80, 60], [5, 5, 20, 30]] * (1 + i % 3), np.float32),
            rng.standard_normal((2 * (1 + i % 3), 8)),
            np.ones(2 * (1 + i % 3)),
            rng.dirichlet(np.ones(5), 2 * (1 + i % 3)),
            "test",
            attribute_probs=rng.random((2 * (1 + i % 3), 3)) / 3 if i % 2 else None,
        )
        for i in range(25)
    ]
    write_shards(regions, tmp_path, max_samples_per_shard=7)
    reference = load_regions(shard_paths(tmp_path))
    store = RegionStore(tmp_path)
    assert (tmp_path / "index.npz").is_file() and len(store) == 25 and "img.3" in store and "img.99" not in store
    for image_id, r in reference.items():
        s = store[image_id]
        assert store.num_regions(image_id) == s.num_regions == r.num_regions
        for name in ("boxes", "features", "scores", "class_probs", "attribute_probs"):
            a, b = getattr(s, name), getattr(r, name)
            assert (a is None and b is None) or np.array_equal(a, b)
    with pytest.raises(KeyError):
        store["img.99"]
    again = RegionStore(tmp_path)  # from the cached index
    assert list(again) == list(store) and np.array_equal(again["img.4"].features, reference["img.4"].features)
    mixed = NamespacedRegions({"a": store, "b": reference})
    assert "a/img.1" in mixed and "c/img.1" not in mixed and mixed.num_regions("b/img.2") == 6 and len(mixed) == 50


def write_easy_vqa_as_coco_and_butd_tsv(tmp_path, count=24, extra_caption=False):
    """The first easy-VQA training images: regions through the embedded extractor, written as a bottom-up-attention
    TSV under LXMERT-style ids; their captions as a COCO captions JSON under integer ids."""
    from vlbert.detectors.config import DetectorConfig
    from vlbert.detectors.extract import extract_regions
    from vlbert.detectors.precomputed import write_butd_tsv

    from vlbert.data.easy_vqa import color_and_shape, image_paths

    truth = color_and_shape("train")
    ids = list(truth)[:count]
    paths = image_paths("train")
    extractor = DetectorConfig(options={"input_size": 64, "max_proposals": 6}).build()
    regions = list(extract_regions(extractor, [(i, paths[i]) for i in ids], progress=False))
    for n, r in enumerate(regions):
        r.image_id = f"COCO_train2014_{n + 1:012d}"
    write_butd_tsv(regions, tmp_path / "train_obj36.tsv")
    annotations = [
        {"image_id": n + 1, "caption": f"There is a {c} {s}."} for n, (c, s) in enumerate(truth[i] for i in ids)
    ]
    if extra_caption:
        annotations.append({"image_id": 999, "caption": "an image nobody extracted"})
    (tmp_path / "captions_train2014.json").write_text(
        json.dumps(
            {
                "images": [{"id": n + 1, "file_name": f"COCO_train2014_{n + 1:012d}.jpg"} for n in range(count)],
                "annotations": annotations,
            }
        )
    )
    assert (
        run_tool(
            tool("extract_regions"),
            ["--from-tsv", str(tmp_path / "train_obj36.tsv"), "--output-dir", str(tmp_path / "shards")],
        )
        == 0
    )
    # The same regions as one .npz per image (py-bottom-up-attention / converted UNITER features), whose cls_prob
    # has the detector's background class in column 0, so the shards carry class distributions for MRC.
    (tmp_path / "npz").mkdir()
    for r in regions:
        probs = np.concatenate([np.full((r.num_regions, 1), 0.1), 0.9 * r.class_probs.astype(np.float32)], axis=1)
        np.savez(
            tmp_path / "npz" / f"{r.image_id}.npz",
            x=r.features,
            bbox=r.boxes,
            image_h=r.height,
            image_w=r.width,
            cls_prob=probs,
            num_bbox=r.num_regions,
        )
    assert (
        run_tool(
            tool("extract_regions"), ["--from-npz", str(tmp_path / "npz"), "--output-dir", str(tmp_path / "shards-npz")]
        )
        == 0
    )
    return regions


def vl_config(tmp_path, sources, out="run", **data):
    return {
        "modality": "vl",
        "tokenizer": "minilm",
        "model": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64},
        "data": {"sources": sources, "eval_fraction": 0.2, **data, "objectives": {"mlm": 1, "mrfr": 1, "itm": 1}},
        "training": {
            "output_dir": str(tmp_path / out),
            "max_steps": 4,
            "batch_size": 4,
            "learning_rate": 1e-3,
            "warmup_steps": 1,
            "log_every": 1,
            "eval_every": 4,
            "progress_bar": False,
        },
    }


def test_vl_pretraining_from_coco_captions_and_a_butd_tsv(tmp_path):
    from vlbert.recipes import RECIPES, run

    regions = write_easy_vqa_as_coco_and_butd_tsv(tmp_path, extra_caption=True)
    coco = {
        "name": "coco",
        "format": "coco",
        "path": str(tmp_path / "captions_train2014.json"),
        "shards": str(tmp_path / "shards"),
        "image_id_format": "COCO_train2014_{image_id:012d}",
    }
    with pytest.raises(
        ValueError,
        match=r"source 'coco': 1 captions of 1 images have no regions .*"
        r"COCO_train2014_000000000999.*data.missing_regions: skip",
    ):
        run(RECIPES["vl-pretraining"], vl_config(tmp_path, [coco], out="refused"))
    metrics = run(RECIPES["vl-pretraining"], vl_config(tmp_path, [coco], missing_regions="skip"))
    assert metrics["captions_without_regions_coco"] == 1
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["split"] == "train"] == [1, 2, 3, 4]
    assert any(r["split"] == "eval" for r in log)
    assert regions[0].feature_dim == 1320

    # Two sources mixed with weights: image ids are namespaced, so equal ids in two stores do not collide.
    (tmp_path / "vg.jsonl").write_text(
        "".join(
            json.dumps({"image_id": f"COCO_train2014_{n:012d}", "caption": c}) + "\n"
            for n, c in ((1, "a shape"), (2, "a small shape"), (3, "one shape"))
        )
    )
    vg = {
        "name": "vg",
        "format": "jsonl",
        "path": str(tmp_path / "vg.jsonl"),
        "shards": str(tmp_path / "shards"),
        "weight": 2.0,
    }
    run(
        RECIPES["vl-pretraining"],
        vl_config(tmp_path, [{**coco, "weight": 0.5}, vg], out="mixed", missing_regions="skip"),
    )
    log = [json.loads(line) for line in (tmp_path / "mixed" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["split"] == "train"] == [1, 2, 3, 4]
    import random

    from vlbert.data.vl_pretraining import Caption
    from vlbert.recipes.vl_pretraining import _weighted

    pairs = [Caption(str(i), [1], str(i)) for i in range(10)]
    assert len(_weighted(pairs, 2.0, random.Random(0))) == 20 and len(_weighted(pairs, 0.5, random.Random(0))) == 5


def test_bad_sources_are_refused_before_anything_runs(tmp_path):
    from vlbert.recipes.vl_pretraining import VLDataConfig

    with pytest.raises(ValueError, match="format must be one of"):
        VLDataConfig(sources=[{"name": "x", "format": "parquet", "path": "p", "shards": "s"}])
    with pytest.raises(ValueError, match="needs path .* and shards"):
        VLDataConfig(sources=[{"name": "x", "format": "coco", "path": "p"}])
    with pytest.raises(ValueError, match="unknown data.sources\\[0\\] key\\(s\\) \\['captions'\\]"):
        VLDataConfig(sources=[{"name": "x", "format": "coco", "captions": "p"}])
    with pytest.raises(ValueError, match="names must differ"):
        VLDataConfig(sources=[{"name": "x", "format": "easy-vqa"}, {"name": "x", "format": "easy-vqa"}])
    with pytest.raises(ValueError, match="missing_regions must be one of 'error', 'skip', got 'ignore'"):
        VLDataConfig(missing_regions="ignore")


@pytest.mark.parametrize("name", ["uniter-base", "visualbert-coco", "albef-regions"])
def test_published_vl_configs_run_on_small_data_in_their_formats(tmp_path, name):
    """The shipped COCO/VG configs, with their sources pointed at small files in the same formats (and a small
    model from the offline MiniLM instead of bert-base-uncased, which needs the network)."""
    from vlbert.recipes import RECIPES, run
    from vlbert.recipes.vl_pretraining import VLDataConfig
    from vlbert.training.run_config import dataclass_from_section, load_run_config
    from vlbert.training.trainer import TrainingConfig

    config = load_run_config(ROOT / "configs" / "vl" / f"{name}.yaml")
    TrainingConfig.from_dict(config["training"]).validate()
    data = dataclass_from_section(VLDataConfig, config["data"], "data")
    assert data.sources[0].format == "coco" and config["model"]["region_feature_dim"] == 2048

    write_easy_vqa_as_coco_and_butd_tsv(tmp_path, count=12)
    (tmp_path / "vg.jsonl").write_text(
        "".join(json.dumps({"image_id": n, "caption": f"shape number {n}"}) + "\n" for n in range(1, 13))
    )
    for source in config["data"]["sources"]:
        source["path"] = str(tmp_path / ("captions_train2014.json" if source["format"] == "coco" else "vg.jsonl"))
        source["shards"] = str(tmp_path / "shards-npz")  # with class distributions (MRC-kl)
        source["image_id_format"] = "COCO_train2014_{image_id:012d}"
    config.update({"init_from": "minilm", "tokenizer": "minilm"})
    shipped = config["model"]
    config["model"] = {**shipped, "num_hidden_layers": 1, "region_feature_dim": 1320}  # MiniLM's sizes, their pathway
    config["data"].update({"eval_fraction": 0.2, "max_regions": 8})
    config["training"].update(
        {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 2,
            "batch_size": 4,
            "grad_accum_steps": 1,
            "warmup_steps": 1,
            "num_workers": 0,
            "log_every": 1,
            "eval_every": 0,
            "save_every": 0,
            "progress_bar": False,
        }
    )
    run(RECIPES["vl-pretraining"], config)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["split"] == "train"] == [1, 2]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["region_embedding"] == shipped.get("region_embedding", "uniter")  # VisualBERT trains its own


def test_lxmert_json_questions_train_the_qa_unit(easy, tokenizer, tmp_path):
    """LXMERT's pretraining JSON: captions, and questions whose answers (normalised as LXMERT's answer table does)
    label the ``qa`` unit; a two-stream run draws ``qa`` and logs its loss, and inference.json keeps the answers."""
    from vlbert.data.captions import load_lxmert_json
    from vlbert.data.vl_pretraining import Caption, VLPretrainingDataset
    from vlbert.recipes import RECIPES, run

    records = [
        {
            "img_id": k,
            "sentf": {"mscoco": [f"a {c} {s}"], "vqa": ["what color is it?", "what shape is it?"]},
            "labelf": {"vqa": [{c.capitalize() + ".": 1.0}, {"the " + s: 0.9, "one": 0.0}]},
        }
        for k, (c, s) in easy.truth.items()
    ]
    (tmp_path / "mscoco_train.json").write_text(json.dumps(records))
    image = load_lxmert_json(tmp_path / "mscoco_train.json")[0]
    color, shape = easy.truth["0"]
    assert image.image_id == "0" and image.answers == ((), ((color, 1.0),), ((shape, 0.9), ("1", 0.0)))
    caption, question = (
        Caption("0", [1], text, answers) for text, answers in zip(("c", "q"), image.answers[::2], strict=True)
    )
    data = VLPretrainingDataset(
        [caption, question, Caption("1", [1], "x")], easy.store, VLProcessor(tokenizer), qa_answers=["1", shape]
    )
    assert "answer_label" not in data[0] and data[1]["answer_label"] == 1  # "1" scores 0: never drawn
    (tmp_path / "bad.json").write_text(json.dumps([{"img_id": "0", "sentf": {"vqa": ["why?"]}, "labelf": {"vqa": []}}]))
    with pytest.raises(ValueError, match=r"labelf\['vqa'\] must hold one \{answer: score\} per sentence"):
        load_lxmert_json(tmp_path / "bad.json")

    source = {
        "name": "lxmert",
        "format": "lxmert",
        "path": str(tmp_path / "mscoco_train.json"),
        "shards": str(easy.shards),
    }
    config = {
        "modality": "vl",
        "tokenizer": "minilm",
        "model": {
            "encoder": "two-stream",
            "l_layers": 1,
            "r_layers": 1,
            "x_layers": 1,
            "hidden_size": 32,
            "region_embedding": "lxmert",
            "region_location_dim": 4,
            "num_attention_heads": 2,
            "intermediate_size": 64,
        },
        "data": {"sources": [source], "eval_fraction": 0.0, "objectives": {"mlm": 1, "qa": 3}},
        "training": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 4,
            "batch_size": 8,
            "log_every": 1,
            "progress_bar": False,
        },
    }
    (tmp_path / "c.jsonl").write_text(
        "".join(json.dumps({"image_id": k, "caption": f"a {c} {s}"}) + "\n" for k, (c, s) in easy.truth.items())
    )
    with pytest.raises(ValueError, match="has qa .* but no source holds questions with answers"):
        run(
            RECIPES["vl-pretraining"],
            {
                **config,
                "data": {
                    **config["data"],
                    "sources": [{**source, "format": "jsonl", "path": str(tmp_path / "c.jsonl")}],
                },
            },
        )
    run(RECIPES["vl-pretraining"], config)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    answers = json.loads((tmp_path / "run" / "processor.json").read_text())["qa_answers"]
    assert sorted(answers) == sorted({a for c, s in easy.truth.values() for a in (c, s)})
    qa = [r for r in rows if "qa" in r]
    assert qa and abs(qa[0]["qa"] - np.log(len(answers))) < 0.5, qa  # a fresh head: near uniform


def test_easy_vqa_questions_join_their_images_captions_for_the_qa_unit(tokenizer):
    """``data.easy_vqa_questions: k`` adds up to k of each image's own questions, answer at score 1, beside its
    caption; the captions are those of a run without questions, and ``max_images`` counts images, not texts."""
    from vlbert.data.easy_vqa import load_questions
    from vlbert.recipes.vl_pretraining import VLDataConfig, easy_vqa_captions

    plain = easy_vqa_captions(tokenizer, "train", seed=3, max_images=6)
    mixed = easy_vqa_captions(tokenizer, "train", seed=3, questions=2, max_images=6)
    assert plain == easy_vqa_captions(tokenizer, "train", seed=3)[:6]
    assert [p for p in mixed if not p.answers] == plain
    asked = {}
    for q in load_questions("train"):
        asked.setdefault(q.image_id, set()).add(
            (tuple(tokenizer(q.question, add_special_tokens=False)["input_ids"]), q.answer)
        )
    questions = [p for p in mixed if p.answers]
    assert len(questions) == 12 and {p.image_id for p in questions} == {p.image_id for p in plain}
    assert all((tuple(p.token_ids), p.answers[0][0]) in asked[p.image_id] and p.answers[0][1] == 1.0 for p in questions)
    with pytest.raises(ValueError, match="data.easy_vqa_questions must be an int >= 0, got -1"):
        VLDataConfig(easy_vqa_questions=-1)
