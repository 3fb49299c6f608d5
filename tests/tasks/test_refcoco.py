"""Referring expressions: the restricted unpickler, the refs + instances reader and its bad inputs, the composite
demonstration, the region-scoring head and a short run of the recipe."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch
from vlbert.detectors.safe_pickle import load_plain_pickle

from vlbert.data.refcoco import box_iou, easy_vqa_composites, load_refcoco
from vlbert.processing import VLProcessor


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/vlbert-pwned",))


def test_the_unpickler_reads_plain_data_and_refuses_code(tmp_path):
    refs = [{"ref_id": 1, "ann_id": 10, "image_id": 5, "split": "train", "sentences": [{"sent": "left dog"}]}]
    (tmp_path / "refs.p").write_bytes(pickle.dumps(refs, protocol=2))
    assert load_plain_pickle(tmp_path / "refs.p") == refs
    (tmp_path / "evil.p").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ValueError, match="asks for posix.system|asks for os.system"):
        load_plain_pickle(tmp_path / "evil.p")
    assert not os.path.exists("/tmp/vlbert-pwned")
    (tmp_path / "obj.p").write_bytes(pickle.dumps({"x": np.zeros(2)}))
    with pytest.raises(ValueError, match="numpy"):
        load_plain_pickle(tmp_path / "obj.p")


def test_refs_and_instances(tmp_path):
    refs = [
        {
            "ref_id": 1,
            "ann_id": 10,
            "image_id": 5,
            "split": "train",
            "sentences": [{"sent": "left dog"}, {"sent": "the dog on the left"}],
        },
        {"ref_id": 2, "ann_id": 11, "image_id": 5, "split": "val", "sentences": [{"sent": "cat"}]},
    ]
    instances = {
        "images": [{"id": 5, "width": 100, "height": 80}],
        "annotations": [{"id": 10, "bbox": [10, 20, 30, 40]}, {"id": 11, "bbox": [0, 0, 5, 5]}],
    }
    (tmp_path / "refs.p").write_bytes(pickle.dumps(refs, protocol=2))
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    for name in ("refs.p", "refs.json"):
        train = load_refcoco(tmp_path / name, tmp_path / "instances.json", "train", "COCO_{image_id:012d}")
        assert [(e.expression, e.image_id, e.box) for e in train] == [
            ("left dog", "COCO_000000000005", (10.0, 20.0, 40.0, 60.0)),
            ("the dog on the left", "COCO_000000000005", (10.0, 20.0, 40.0, 60.0)),
        ]
    instances["annotations"] = instances["annotations"][1:]
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    with pytest.raises(ValueError, match="names ann_id 10, which"):
        load_refcoco(tmp_path / "refs.p", tmp_path / "instances.json", "train")
    with pytest.raises(ValueError, match="no expression in split 'testA'"):
        load_refcoco(tmp_path / "refs.json", tmp_path / "instances.json", "testA")


def test_composites_name_one_tile_each(tmp_path):
    from PIL import Image

    examples, files, tiles = easy_vqa_composites("test", 20, tmp_path)
    assert len(files) == 20 and len(examples) >= 20
    for ex in examples[:30]:
        image = np.asarray(Image.open(files[ex.image_id]))
        x1, y1, x2, y2 = map(int, ex.box)
        assert image.shape == (128, 128, 3) and not (image[y1:y2, x1:x2] == 255).all()  # the tile holds an image
        assert sum(e.image_id == ex.image_id and e.expression == ex.expression for e in examples) == 1
        assert (box_iou(np.array([ex.box]), tiles[ex.image_id]).max()) == 1.0


def test_region_scores_ignore_padding_and_train_towards_the_target():
    import vlbert
    from vlbert.models.referring import VLBertForReferringExpressions

    torch.manual_seed(0)
    config = vlbert.VLBertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        region_feature_dim=6,
    )
    model = VLBertForReferringExpressions(config)
    ids, feats = torch.randint(1, 50, (4, 5)), torch.randn(4, 3, 6)
    boxes = torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0], [0.0, 0.5, 0.5, 1.0]]).expand(4, 3, 4)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    target = torch.tensor([2, 1, 0, 0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(30):
        out = model(ids, region_features=feats, region_boxes=boxes, region_mask=mask, target_region=target)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert (out.logits.argmax(-1) == target).all() and out.metrics["re_accuracy"] == 1.0
    assert (out.logits[mask == 0] == torch.finfo(out.logits.dtype).min).all()


def test_refcoco_demo_runs_with_ground_truth_boxes(tmp_path):
    from vlbert.recipes import RECIPES, run

    config = {
        "task": "refcoco",
        "init_from": "minilm",
        "detector": {"input_size": 96, "max_proposals": 8},
        "data": {"cache_dir": str(tmp_path / "cache"), "train_images": 24, "eval_images": 12},
        "training": {
            "output_dir": str(tmp_path / "out"),
            "max_steps": 2,
            "batch_size": 8,
            "warmup_steps": 1,
            "progress_bar": False,
        },
    }
    metrics = run(RECIPES["refcoco"], config)
    assert metrics["accuracy_upper_bound"] == 1.0  # with the tiles as regions, the answer is always there
    assert "accuracy_majority_position_baseline" in metrics and metrics["step"] == 2


def test_images_without_regions_are_named(tokenizer):
    """Each VL task's dataset names the example and the image that has no regions."""
    from vlbert.detectors.regions import Regions

    from vlbert.data.nlvr2 import ImagePairDataset, ImagePairExample
    from vlbert.data.refcoco import ReferringDataset, ReferringExample
    from vlbert.data.visual_entailment import EntailmentDataset, EntailmentExample

    regions = {"a": Regions("a", 10, 10, [[0, 0, 10, 10]], np.zeros((1, 4)), [1.0])}
    with pytest.raises(ValueError, match="pair p1 is about image 'b', which has no regions"):
        EntailmentDataset([EntailmentExample("p1", "b", "x", 0)], regions, VLProcessor(tokenizer))
    with pytest.raises(ValueError, match="statement s1 is about image 'b', which has no regions"):
        ImagePairDataset([ImagePairExample("s1", "x", "a", "b", 1)], regions, VLProcessor(tokenizer))
    with pytest.raises(ValueError, match="expression r1 is about image 'b', which has no regions"):
        ReferringDataset([ReferringExample("r1", "b", "x", (0, 0, 1, 1))], regions, VLProcessor(tokenizer))
