"""Images through the recipes and pipelines for a model with a visual backbone (issue 43, vlbert/processing/images.py):
VL-BERT's preprocessing equals its own transforms; a VQA run reads each question's image file beside the shards'
boxes, records its preprocessing, and its pipeline answers from image files as the model's forward on the same
pixels and boxes (and as the run's own evaluation); missing images and Regions-only inputs are refused."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from helpers.builders import EASY_DETECTOR
from helpers.tool_errors import one_line_error
from PIL import Image

from vlbert.data.easy_vqa import load_questions
from vlbert.inference import VQAPipeline, pipeline
from vlbert.processing.images import PREPROCESSING, image_preprocessing, pad_images
from vlbert.recipes import RECIPES, run
from vlbert.recipes.regions import task_images

TIMM = {"kind": "timm", "model": "mobilenetv3_small_050", "roi_size": 2, "learning_rate": 1e-3}


def vl_bert_transform(image: Image.Image) -> torch.Tensor:
    """jackroos/VL-BERT at 4373674, vqa/data/transforms: Resize(600, 1000).get_size, F.resize, ToTensor,
    Normalize(PIXEL_MEANS, PIXEL_STDS, to_bgr255=True) with cfgs/vqa/base_4x16G_fp32.yaml's values."""
    w, h = image.size
    size = 600
    if max(w, h) / min(w, h) * size > 1000:
        size = int(1000 * min(w, h) / max(w, h))
    if (w <= h and w == size) or (h <= w and h == size):
        ow, oh = w, h
    elif w < h:
        ow, oh = size, int(size * h / w)
    else:
        oh, ow = size, int(size * w / h)
    t = TF.to_tensor(TF.resize(image, (oh, ow)))[[2, 1, 0]] * 255
    return TF.normalize(t, [102.9801, 115.9465, 122.7717], [1.0, 1.0, 1.0])


def test_vl_bert_preprocessing_is_its_transforms_and_padding_keeps_each_size(easy):
    """Square, 1.6:1 (long side 960) and 3.2:1 (long side capped: short side int(1000 * 20 / 64) = 312)."""
    image = Image.open(easy.files["0"]).convert("RGB")
    ours = PREPROCESSING["vl-bert"]
    shapes = []
    for crop in (None, (0, 0, 64, 40), (0, 10, 64, 30)):
        source = image if crop is None else image.crop(crop)
        expected = vl_bert_transform(source)
        got = ours(source)
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, atol=2e-3, rtol=0)  # ToTensor's /255 then x255: float rounding
        shapes.append(tuple(got.shape[1:]))
    assert shapes == [(600, 600), (600, 960), (312, 998)]
    padded = pad_images([ours(image.crop((0, 0, 64, 40))), ours(image)])
    assert padded["images"].shape == (2, 3, 600, 960) and padded["image_sizes"].tolist() == [[600, 960], [600, 600]]
    assert padded["images"][1, :, :, 600:].abs().sum() == 0
    import timm.data

    assert PREPROCESSING["imagenet"].mean == timm.data.IMAGENET_DEFAULT_MEAN
    assert PREPROCESSING["imagenet"].std == timm.data.IMAGENET_DEFAULT_STD
    with pytest.raises(ValueError, match="must be one of 'imagenet', 'vl-bert'"):
        image_preprocessing("caffe")


@pytest.fixture(scope="module")
def e2e_run(easy, tmp_path_factory):
    """A VQA run whose model computes its region features from the images (timm MobileNetV3, random weights):
    the 12 `easy` images' easy-VQA questions as VQA v2 files, their boxes from the shards, their pixels from an
    image directory (``<id>.png``), ImageNet preprocessing at short side 80 (the files are 64 x 64)."""
    root = tmp_path_factory.mktemp("e2e")
    wanted = {v: k for k, v in easy.easy_ids.items()}
    questions = [q for q in load_questions("test") if q.image_id in wanted][:40]
    records = [
        {"question_id": 1000 + n, "image_id": int(wanted[q.image_id]), "question": q.question}
        for n, q in enumerate(questions)
    ]
    (root / "questions.json").write_text(json.dumps({"questions": records}))
    annotations = [
        {"question_id": r["question_id"], "answers": [{"answer": q.answer}] * 10}
        for r, q in zip(records, questions, strict=True)
    ]
    (root / "annotations.json").write_text(json.dumps({"annotations": annotations}))
    (root / "images").mkdir()
    for k, path in easy.files.items():
        shutil.copy(path, root / "images" / f"{k}.png")
    files = {
        f"{split}_{kind}": str(root / f"{kind}.json")
        for split in ("train", "eval")
        for kind in ("questions", "annotations")
    }
    data = {
        "dataset": "vqa-v2",
        "shards": str(easy.shards),
        "image_dir": str(root / "images"),
        "image_short_side": 80,
        "max_regions": 6,
        **files,
    }
    config = {
        "task": "vqa",
        "init_from": "minilm",
        "detector": asdict(EASY_DETECTOR),
        "data": data,
        "model": {"visual_backbone": TIMM},
        "training": {
            "output_dir": str(root / "run"),
            "max_steps": 2,
            "batch_size": 8,
            "warmup_steps": 1,
            "progress_bar": False,
            "log_every": 1,
        },
    }
    run(RECIPES["vqa"], config)
    return SimpleNamespace(root=root, dir=root / "run", questions=records, config=config)


@pytest.fixture(scope="module")
def e2e_vqa(e2e_run):
    """The VQA pipeline of the backbone run (its model and detector loaded once for the module)."""
    return VQAPipeline(e2e_run.dir, device="cpu", batch_size=8)


def test_a_backbone_run_reads_images_and_its_pipeline_answers_as_the_forward(easy, e2e_run, e2e_vqa):
    info = json.loads((e2e_run.dir / "processor.json").read_text())
    assert info["image_preprocessing"] == {**PREPROCESSING["imagenet"].record(), "short_side": 80}
    vqa = e2e_vqa
    assert vqa.model.bert.visual_backbone is not None and info["region_feature_dim"] == 288
    qs = e2e_run.questions
    files = [str(easy.files[str(q["image_id"])]) for q in qs]
    answers = vqa(files, [q["question"] for q in qs], top_k=1)
    # The run's evaluation went through the loader (image files under image_dir, collated images): the same answers.
    evaluated = {
        r["question_id"]: r["answer"]
        for r in map(json.loads, (e2e_run.dir / "predictions.jsonl").read_text().splitlines())
    }
    assert {str(q["question_id"]): a[0]["answer"] for q, a in zip(qs, answers, strict=True)} == evaluated
    # The model's forward on pixels made here (PIL bilinear to 80 x 80, ImageNet mean/std) and the stored boxes.
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    rows = qs[:4]
    pixels = [
        (TF.to_tensor(Image.open(files[i]).convert("RGB").resize((80, 80), Image.BILINEAR)) - mean) / std
        for i in range(len(rows))
    ]
    regions = [easy.store[str(q["image_id"])] for q in rows]
    r = min(max(x.num_regions for x in regions), 6)
    boxes, mask = torch.zeros(len(rows), r, 4), torch.zeros(len(rows), r, dtype=torch.long)
    for i, x in enumerate(regions):
        n = min(x.num_regions, 6)
        boxes[i, :n], mask[i, :n] = torch.from_numpy(x.normalised_boxes()[:n]), 1
    text = vqa.tokenizer([q["question"] for q in rows], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = vqa.model(
            input_ids=text["input_ids"],
            attention_mask=text["attention_mask"],
            images=torch.stack(pixels),
            region_boxes=boxes,
            region_mask=mask,
        ).logits
    top = torch.sigmoid(logits).max(-1)
    for i, a in enumerate(answers[:4]):
        assert a[0]["answer"] == vqa.labels[int(top.indices[i])]
        assert abs(a[0]["score"] - float(top.values[i])) < 1e-5
    with pytest.raises(ValueError, match="computes its region features from the pixels"):
        vqa(easy.store["0"], "what color is the shape?")
    # The model in memory has no run files: its backbone kind's preprocessing (ImageNet, short side 224).
    in_memory = pipeline(model=vqa.model, tokenizer=vqa.tokenizer, detector=EASY_DETECTOR, labels=vqa.labels)
    assert in_memory.processor.preprocessing == PREPROCESSING["imagenet"]
    assert type(in_memory.regions([files[0]])[0]).__name__ == "ImageRegions"


def test_a_backbone_run_without_an_image_is_refused_in_one_line(capsys, e2e_run, tmp_path):  # row 99
    images = tmp_path / "images"
    shutil.copytree(e2e_run.root / "images", images)
    (images / "3.png").unlink()
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({**e2e_run.config, "data": {**e2e_run.config["data"], "image_dir": str(images)}}))
    line = one_line_error(capsys, "finetune_vqa", ["--config", str(config), "--output-dir", str(tmp_path / "out")])
    assert "have regions but no file under data.image_dir" in line and "'3'" in line
    assert not (tmp_path / "out").exists()
    # Fine-tuning from this run without a preprocessing of its own sees images as it did (its processor.json's).
    trained = json.loads((e2e_run.dir / "processor.json").read_text())["image_preprocessing"]
    data = SimpleNamespace(
        **{**e2e_run.config["data"], "image_preprocessing": "", "image_short_side": 0, "image_max_side": 0}
    )
    assert task_images(data, TIMM, ["0"], trained).preprocessing.short_side == 80
    assert task_images(data, TIMM, ["0"]).preprocessing.short_side == 224
    data = {k: v for k, v in e2e_run.config["data"].items() if k != "image_dir"}
    config.write_text(json.dumps({**e2e_run.config, "data": data}))
    line = one_line_error(capsys, "finetune_vqa", ["--config", str(config), "--output-dir", str(tmp_path / "out")])
    assert "data.image_dir is not set for data.dataset='vqa-v2'" in line


def test_vl_pretraining_reads_images_and_refuses_feature_regression(capsys, easy, e2e_run, tmp_path):  # row 99
    """VL pretraining (MLM, MRC-KL: masked regions' pixels hidden in the model, ITM) of a tiny model with a timm
    backbone, on the `easy` shards' boxes and the image directory: it trains, and records its preprocessing; MRFR
    (regressing the detector's features, which the backbone replaces) is refused in one line."""
    config = {
        "modality": "vl",
        "tokenizer": "minilm",
        "detector": asdict(EASY_DETECTOR),
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "region_embedding": "vl-bert",
            "region_location_dim": 4,
            "visual_backbone": TIMM,
        },
        "data": {
            "sources": [
                {
                    "name": "easy",
                    "format": "jsonl",
                    "path": str(tmp_path / "captions.jsonl"),
                    "shards": str(easy.shards),
                }
            ],
            "image_dir": str(e2e_run.root / "images"),
            "image_short_side": 64,
            "eval_fraction": 0.0,
            "objectives": {"mlm": 1, "mrc_kl": 1, "itm": 1},
        },
        "training": {
            "output_dir": str(tmp_path / "vl"),
            "max_steps": 3,
            "batch_size": 4,
            "warmup_steps": 1,
            "log_every": 1,
            "progress_bar": False,
        },
    }
    (tmp_path / "captions.jsonl").write_text(
        "".join(json.dumps({"image_id": k, "caption": f"a {c} {s}"}) + "\n" for k, (c, s) in easy.truth.items())
    )
    run(RECIPES["vl-pretraining"], config)
    info = json.loads((tmp_path / "vl" / "processor.json").read_text())
    assert info["image_preprocessing"]["short_side"] == 64 and info["region_feature_dim"] == 288
    log = (tmp_path / "vl" / "log.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, log) if r["split"] == "train"]
    assert len(steps) == 3 and all(np.isfinite(r["loss"]) for r in steps)
    config["data"]["objectives"] = {"mlm": 1, "mrfr": 1}
    (tmp_path / "config.yaml").write_text(json.dumps(config))
    line = one_line_error(
        capsys,
        "pretrain",
        ["--modality", "vl", "--config", str(tmp_path / "config.yaml"), "--output-dir", str(tmp_path / "refused")],
    )
    assert "data.objectives has mrfr, which regresses the detector's features" in line


def test_image_pairs_go_through_the_backbone_one_image_at_a_time():
    """NLVR2's layout (images [B, 2, 3, H, W], boxes [B, 2, R, 4], as the region collator gives pairs): the pair
    model's logits equal those from each image's features computed alone (a batch of one, its size given)."""
    from vlbert.config import VLBertConfig
    from vlbert.models.vl_classification import VLBertForImagePairClassification

    torch.manual_seed(0)
    config = VLBertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        region_feature_dim=288,
        num_labels=2,
        visual_backbone=TIMM,
    )
    model = VLBertForImagePairClassification(config).eval()
    ids, images = torch.randint(1, 50, (2, 5)), torch.randn(2, 2, 3, 48, 64)
    sizes = torch.tensor([[[48, 64], [40, 64]], [[48, 56], [48, 64]]])
    for i, j in ((0, 1), (1, 0)):
        images[i, j, :, sizes[i, j, 0] :], images[i, j, :, :, sizes[i, j, 1] :] = 0.0, 0.0
    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.1, 0.2, 0.6, 0.7], [0.4, 0.3, 0.9, 0.8]]).expand(2, 2, 3, 4)
    mask = torch.tensor([[[1, 1, 1], [1, 1, 0]], [[1, 0, 0], [1, 1, 1]]])
    with torch.no_grad():
        logits = model(ids, images=images, region_boxes=boxes, region_mask=mask, image_sizes=sizes).logits
        alone = torch.stack(
            [
                torch.stack(
                    [
                        model.bert.visual_backbone(
                            images[i, j, None], boxes[i, j, None], mask[i, j, None], sizes[i, j, None]
                        )[0]
                        for j in range(2)
                    ]
                )
                for i in range(2)
            ]
        )
        expected = model(ids, region_features=alone, region_boxes=boxes, region_mask=mask).logits
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


def test_retrieval_trains_the_backbone_and_evaluates_on_the_pixels(easy, e2e_run, tmp_path):
    """Retrieval (Karpathy captions of the 12 `easy` images, boxes from the shards, pixels from the image directory)
    fine-tuned from the VQA run's model and its timm backbone: one step moves every trainable backbone weight, and
    the evaluation's re-ranked scores of an image (and the pipeline's, from the image file) are the model's
    ``match_scores`` on pixels made here (PIL bilinear to 32 x 32, ImageNet mean/std)."""
    from safetensors.torch import load_file

    from vlbert.data.captions import load_karpathy_split
    from vlbert.evaluation.retrieval import evaluate_retrieval
    from vlbert.inference import RetrievalPipeline

    records = [
        {"filename": k, "split": "train" if int(k) < 8 else "test", "sentences": [{"raw": f"a {c} {s}"}]}
        for k, (c, s) in easy.truth.items()
    ]
    (tmp_path / "captions.json").write_text(json.dumps({"images": records}))
    data = {
        "dataset": "karpathy",
        "captions_file": str(tmp_path / "captions.json"),
        "shards": str(easy.shards),
        "image_dir": str(e2e_run.root / "images"),
        "image_short_side": 32,
        "max_regions": 6,
        "shortlist": 2,
    }
    config = {
        "task": "retrieval",
        "init_from": str(e2e_run.dir),
        "detector": asdict(EASY_DETECTOR),
        "data": data,
        "training": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 1,
            "batch_size": 4,
            "warmup_steps": 1,
            "progress_bar": False,
        },
    }
    metrics = run(RECIPES["retrieval"], config)
    retrieval = RetrievalPipeline(tmp_path / "run", device="cpu", batch_size=4)
    model, tokenizer = retrieval.model, retrieval.tokenizer
    assert retrieval.processor.preprocessing.short_side == 32  # the run's, recorded in its processor.json
    before = load_file(str(e2e_run.dir / "model.safetensors"))
    trainable = [
        (n, p) for n, p in model.bert.visual_backbone.named_parameters(prefix="bert.visual_backbone") if p.requires_grad
    ]
    # One AdamW step of the backbone's learning rate (1e-3) from init_from's weights: each moves, by about that much.
    steps = [float((p.detach() - before[n]).abs().max()) for n, p in trainable]
    assert trainable and min(steps) > 0 and max(steps) < 1e-2
    test = load_karpathy_split(tmp_path / "captions.json", "test")
    reader = task_images(
        SimpleNamespace(**{**data, "image_preprocessing": "", "image_max_side": 0}), TIMM, [im.image_id for im in test]
    )
    again, i2t, t2i = evaluate_retrieval(
        model, test, easy.store, retrieval.processor, shortlist=2, return_scores=True, image_reader=reader
    )
    assert again == {k: v for k, v in metrics.items() if k in again}
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    image = Image.open(easy.files[test[0].image_id]).convert("RGB").resize((32, 32), Image.BILINEAR)
    pixels = ((TF.to_tensor(image) - mean) / std)[None]
    regions = easy.store[test[0].image_id]
    boxes = torch.from_numpy(regions.normalised_boxes()[:6])[None]
    captions = [c for im in test for c in im.captions]
    shortlisted = i2t[0].topk(2).indices.sort().values  # the re-ranked ones rank above every other candidate
    text = tokenizer([captions[i] for i in shortlisted], padding=True, return_tensors="pt")
    with torch.no_grad():
        scores = model.match_scores(
            **text,
            images=pixels.expand(2, -1, -1, -1),
            region_boxes=boxes.expand(2, -1, -1),
        )
    torch.testing.assert_close(i2t[0, shortlisted], scores, atol=1e-4, rtol=0)
    ranked = retrieval.captions(str(easy.files[test[0].image_id]), captions, top_k=2)
    torch.testing.assert_close(
        torch.tensor([h["score"] for h in ranked]), i2t[0, [h["index"] for h in ranked]], atol=1e-4, rtol=0
    )
    # An index of the image files holds the backbone's features (float16): a search scores as the evaluation.
    ids = [im.image_id for im in test]
    index = retrieval.index_images([str(easy.files[i]) for i in ids], image_ids=ids)
    assert index.regions[ids[0]].feature_dim == 288
    found = retrieval.search(captions[:1], index, top_k=2)[0]
    torch.testing.assert_close(
        torch.tensor([h["score"] for h in found]), t2i[0, [ids.index(h["image_id"]) for h in found]], atol=1e-2, rtol=0
    )


def test_explain_reads_a_backbone_runs_pixels_and_refuses_what_feeds_features(e2e_run, tmp_path, capsys):
    """``tools/explain.py regions`` over a backbone run: a word's attention over the image's regions equals the
    model's own attention on pixels made here (PIL bilinear to the run's 80 x 80, ImageNet mean/std) under the
    printed boxes; ``generate`` (many images' detector features) is refused in one line."""
    from helpers.builders import tool

    from vlbert.data.easy_vqa import image_paths
    from vlbert.models.vl import VLBertForPreTraining
    from vlbert.tokenization import load_tokenizer

    text = "what color is the shape?"
    argv = [
        "regions",
        "--model",
        str(e2e_run.dir),
        "--easy-vqa-image",
        "test/3",
        "--text",
        text,
        "--word",
        "color",
        "--out",
        str(tmp_path),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    assert tool("explain")(argv) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-2])
    boxes = torch.tensor(printed["boxes"]) / 64.0
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    image = Image.open(image_paths("test")["test/3"]).convert("RGB").resize((80, 80), Image.BILINEAR)
    pixels = ((TF.to_tensor(image) - mean) / std)[None]
    model, tok = VLBertForPreTraining.from_pretrained(e2e_run.dir).eval(), load_tokenizer(e2e_run.dir)
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        attentions = model.bert(
            **enc,
            region_boxes=boxes[None],
            images=pixels,
            output_attentions=True,
        ).attentions
    t = enc["input_ids"].shape[1]
    word = tok.convert_ids_to_tokens(enc["input_ids"][0]).index("color")
    row = attentions[-1][0].mean(0)[word, t:]
    np.testing.assert_allclose(printed["attention_to_regions"], (row / row.sum()).numpy(), atol=2e-3)
    assert "computes them from the pixels" in one_line_error(
        capsys, "explain", ["generate", "--model", str(e2e_run.dir), "--images", "4"]
    )


def test_boxes_and_pixels_come_from_one_reader(e2e_vqa, tmp_path):  # row 106
    """A 16-bit greyscale PNG, a phone JPEG stored sideways with EXIF orientation 8, a .webp and a .bmp in one
    folder, read by the VQA pipeline over the backbone run (its regions extracted with the run's detector, its
    pixels preprocessed as the run's) and by the recipe's image reader with ``data.image_dir`` set to that folder
    (the image ids tools/extract_regions.py --images gives it): the pixels under every box are the pixels the
    detector saw (the image upright, [3, 80, 128]; 16-bit scaled by 65535, not clipped to white), and every file
    is found."""
    from vlbert.detectors.images import load_image

    from vlbert.commands.extract_regions import image_sources

    folder = tmp_path / "photos"
    folder.mkdir()
    ramp = np.linspace(0, 65535, 128 * 80).reshape(80, 128).astype(np.uint16)
    Image.fromarray(ramp).save(folder / "deep.png")  # mode I;16
    upright = np.random.default_rng(0).integers(0, 256, (80, 128, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 8  # "rotate 90 clockwise to view": stored 80 wide, 128 high
    Image.fromarray(upright).transpose(Image.Transpose.ROTATE_270).save(
        folder / "phone.jpg", exif=exif.tobytes(), quality=95
    )
    Image.fromarray(upright).save(folder / "other.webp", lossless=True)
    Image.fromarray(upright[:, ::-1].copy()).save(folder / "flipped.bmp")
    files = dict(image_sources([str(folder)]))
    assert sorted(files) == ["deep", "flipped", "other", "phone"]
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def same_under_boxes(pixels, regions, seen):  # the backbone's input (ImageNet-normalised) back to 0..255
        assert tuple(pixels.shape) == (3, 80, 128) and (regions.height, regions.width) == (80, 128)
        values = ((pixels * std + mean) * 255).permute(1, 2, 0).numpy()
        for x1, y1, x2, y2 in regions.boxes.round().astype(int):
            np.testing.assert_allclose(values[y1:y2, x1:x2], seen[y1:y2, x1:x2], atol=1e-3)

    vqa = e2e_vqa
    found = dict(zip(files, vqa.processor.regions([str(p) for p in files.values()]), strict=True))
    for image_id, regions in found.items():
        same_under_boxes(regions.pixels, regions, load_image(files[image_id]))
    np.testing.assert_array_equal(load_image(files["deep"])[:, :, 0], np.round(ramp / 65535 * 255))  # not all 255
    assert vqa(str(files["phone"]), "what color is the shape?", top_k=1)[0]["answer"] in vqa.labels
    data = SimpleNamespace(
        dataset="vqa-v2", image_dir=str(folder), image_preprocessing="", image_short_side=80, image_max_side=0
    )
    reader = task_images(data, TIMM, list(files))
    for image_id, regions in found.items():
        same_under_boxes(reader(image_id), regions, load_image(files[image_id]))


def test_a_missing_backbone_weights_file_is_named_under_the_backbones_key(capsys, easy, e2e_run, tmp_path):  # row 113
    """``model.visual_backbone.weights`` naming no file: one line under that key (it named the detector's
    ``detector.weights / --weights``), nothing written."""
    config = {
        "modality": "vl",
        "tokenizer": "minilm",
        "detector": asdict(EASY_DETECTOR),
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "visual_backbone": {**TIMM, "weights": str(tmp_path / "mobilenet.safetensors")},
        },
        "data": {
            "sources": [
                {
                    "name": "easy",
                    "format": "jsonl",
                    "path": str(tmp_path / "captions.jsonl"),
                    "shards": str(easy.shards),
                }
            ],
            "image_dir": str(e2e_run.root / "images"),
            "image_short_side": 64,
            "eval_fraction": 0.0,
            "objectives": {"mlm": 1},
        },
        "training": {"max_steps": 1, "batch_size": 4, "progress_bar": False},
    }
    (tmp_path / "captions.jsonl").write_text(
        "".join(json.dumps({"image_id": k, "caption": f"a {c} {s}"}) + "\n" for k, (c, s) in easy.truth.items())
    )
    (tmp_path / "config.yaml").write_text(json.dumps(config))
    line = one_line_error(
        capsys,
        "pretrain",
        ["--modality", "vl", "--config", str(tmp_path / "config.yaml"), "--output-dir", str(tmp_path / "run")],
    )
    assert f"{tmp_path / 'mobilenet.safetensors'} does not exist (model.visual_backbone.weights)" in line, line
    assert not (tmp_path / "run").exists()
