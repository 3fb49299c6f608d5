"""BUTD's Visual Genome detector in plain PyTorch (the ``butd`` backend) against the detectron2 backend running
py-bottom-up-attention's model (``butd-vg``) with the same weights file in the pkl's layout: the same boxes, object
and attribute distributions, features and confidences, bit for bit, at several image sizes and aspect ratios, one
at a time and in batches; the same record, so a model trained on either's regions takes the other's. The backend's
own behaviour (weights, names, errors, the tool) runs without detectron2.

The models are small (a one-block-per-stage ResNet at a quarter of the width, 16 classes, 8 attributes) with
random weights; every layer and rule of the real one is there, only the sizes differ, and the sizes are read from
the file as the real pkl's are."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from helpers.builders import tool
from vlbert.detectors.butd_model import ButdArchitecture, ButdSettings, detectron2_cell_anchors, random_butd_state
from vlbert.detectors.butd_vg import ButdRegionDetector, resized_shape
from vlbert.detectors.config import NAMED_DETECTORS, DetectorConfig
from vlbert.detectors.selection import BoxSelection

from vlbert.commands import run_tool

SMALL = {
    "INPUT.MIN_SIZE_TEST": 96,
    "INPUT.MAX_SIZE_TEST": 160,
    "MODEL.RPN.PRE_NMS_TOPK_TEST": 200,
    "MODEL.RPN.POST_NMS_TOPK_TEST": 24,
}
#: The same small network as detectron2 config overrides of butd-vg.
SHRINK = {
    "MODEL.RESNETS.DEPTH": 50,
    "MODEL.RESNETS.STEM_OUT_CHANNELS": 16,
    "MODEL.RESNETS.WIDTH_PER_GROUP": 16,
    "MODEL.RESNETS.RES2_OUT_CHANNELS": 64,
    "MODEL.ROI_HEADS.NUM_CLASSES": 16,
    "MODEL.ROI_ATTRIBUTE_HEAD.NUM_ATTRIBUTES": 8,
}
SELECTION = BoxSelection(min_boxes=4, max_boxes=12, score_threshold=0.2, nms_iou=0.3)
TINY = ButdArchitecture(
    layers=(1, 1, 1), res5_blocks=1, stem_channels=16, width=16, num_classes=16, attributes=(8, 16, 32)
)


def images(sizes):
    """Real easy-VQA pictures resized to (width, height) ``sizes``: uint8 RGB arrays."""
    from PIL import Image

    from vlbert.data.easy_vqa import image_paths

    paths = list(image_paths("train").values())
    return [np.asarray(Image.open(paths[i]).convert("RGB").resize(size)) for i, size in enumerate(sizes)]


def write_pkl(path, state):
    """py-bottom-up-attention's layout: {"model": name -> ndarray, "__author__": ...}."""
    path.write_bytes(pickle.dumps({"model": state, "__author__": "test"}))
    return path


def assert_same(ours, theirs, rtol=0.0, atol=0.0):
    """Equal records; with tolerances, relative ones (features are float16: one unit in the last place is 1e-3
    of the value)."""
    assert ours.detector == theirs.detector and (ours.height, ours.width) == (theirs.height, theirs.width)
    assert ours.num_regions == theirs.num_regions
    for name in ("boxes", "scores", "features", "class_probs", "attribute_probs"):
        a, b = getattr(ours, name).astype(np.float32), getattr(theirs, name).astype(np.float32)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)


# ------------------------------------------------------------------------------------------------ with detectron2
@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(detectron2 backend, butd backend) over one random butd-vg-shaped weights file, at the small sizes."""
    pytest.importorskip(
        "detectron2", reason="detectron2 is not installed (see docs/regions.md: the detectron2 backend)"
    )
    from helpers.detectron2 import random_weights
    from vlbert.detectors.detectron2_detector import Detectron2RegionDetector

    weights = tmp_path_factory.mktemp("butd") / "faster_rcnn_from_caffe_attr.pkl"
    random_weights("butd-vg", {**SMALL, **SHRINK}, weights, "butd-pkl")
    s = SELECTION
    reference = Detectron2RegionDetector(
        "butd-vg", weights, overrides={**SMALL, **SHRINK}, min_boxes=s.min_boxes, max_boxes=s.max_boxes
    )
    ours = ButdRegionDetector(weights, selection=s, settings=ButdSettings.from_config_file(overrides=SMALL))
    return reference, ours, weights


def test_butd_equals_the_detectron2_backend_bit_for_bit(both):
    reference, ours, _ = both
    # landscape, portrait, square, sides not multiples of 16, one capped by the longest side (160), one that needs
    # no resize (96 x 160 already)
    arrays = images([(100, 64), (64, 120), (97, 97), (500, 333), (60, 200), (160, 96)])
    ids = [f"image{i}" for i in range(len(arrays))]
    expected = [reference(a, i) for a, i in zip(arrays, ids, strict=True)]
    assert {r.num_regions for r in expected} != {SELECTION.min_boxes}  # the threshold, not only min_boxes, chose
    for a, i, theirs in zip(arrays, ids, expected, strict=True):
        assert_same(ours(a, i), theirs)
    # Batched (equal sizes share a forward pass): equal to one at a time, and to detectron2 batched.
    twice = arrays + [images([(100, 64), (97, 97)])[k] for k in (0, 1)]
    batched = ours.extract_batch(twice, ids + ["again0", "again1"], batch_size=4)
    theirs = reference.extract_batch(twice, ids + ["again0", "again1"], batch_size=4)
    for r, t in zip(batched, theirs, strict=True):
        assert_same(r, t)
    for r, alone in zip(batched[: len(expected)], expected, strict=True):
        assert_same(r, alone, rtol=2e-3, atol=1e-4)  # a batched convolution sums in another order
    # Before the float16 of the shards: proposals, features and class distributions of detectron2's own modules.
    image = ours._prepare(arrays[3])[None]
    proposals, features, class_probs = ours.model(image)
    m = reference.model
    batch = m.preprocess_image([{"image": image[0]}])
    res4 = m.backbone(batch.tensor)
    (theirs,), _ = m.proposal_generator(batch, res4, None)
    assert torch.equal(proposals[0], theirs.proposal_boxes.tensor)
    pooled = m.roi_heads._shared_roi_transform([res4["res4"]], [theirs.proposal_boxes]).mean(dim=(2, 3))
    assert torch.equal(features, pooled)
    assert torch.equal(class_probs, m.roi_heads.box_predictor(pooled)[0].softmax(-1)[:, :-1])


def test_butd_equals_detectron2_at_the_published_sizes(tmp_path):
    """The config file's own sizes (shortest side 600, longest 1000, 6000 / 300 proposals): the resize of a photo
    that the longest side caps."""
    pytest.importorskip(
        "detectron2", reason="detectron2 is not installed (see docs/regions.md: the detectron2 backend)"
    )
    from helpers.detectron2 import random_weights
    from vlbert.detectors.detectron2_detector import Detectron2RegionDetector

    weights = random_weights("butd-vg", SHRINK, tmp_path / "faster_rcnn_from_caffe_attr.pkl", "butd-pkl")
    reference = Detectron2RegionDetector("butd-vg", weights, overrides=SHRINK, min_boxes=10, max_boxes=100)
    ours = ButdRegionDetector(weights)
    (array,) = images([(300, 170)])
    assert resized_shape(170, 300, 600, 1000) == (567, 1000)
    assert_same(ours(array, "photo"), reference(array, "photo"))


def test_both_backends_name_the_same_features(both):
    from vlbert.detectors.detectron2_options import Detectron2Options
    from vlbert.detectors.files import BUTD_VG_CONFIG_FILE

    _, _, weights = both
    butd = DetectorConfig("butd", str(weights)).identified()
    for config_file in ("butd-vg", str(BUTD_VG_CONFIG_FILE)):
        d2 = DetectorConfig("detectron2", str(weights), options=Detectron2Options(config_file=config_file)).identified()
        assert butd.fingerprint() == d2.fingerprint() and butd.difference(d2) is None is d2.difference(butd)
    assert butd.difference(butd.with_options(nms_iou=0.4)) == "nms_iou 0.3 vs 0.4"
    published = NAMED_DETECTORS["butd-vg"]  # UNITER's and LXMERT's record: the file's name, no sha256
    assert published.difference(butd) is None


# ------------------------------------------------------------------------------------------------ without detectron2
def test_anchors_are_detectron2s_not_torchvisions():
    anchors = detectron2_cell_anchors((64, 128), (0.5, 1.0, 2.0))
    # size-major; w = sqrt(64^2 / 0.5) = 90.51, h = 45.25, centred, not rounded to whole pixels
    np.testing.assert_allclose(anchors[0].numpy(), [-45.2548, -22.6274, 45.2548, 22.6274], atol=1e-4)
    np.testing.assert_allclose(anchors[1].numpy(), [-32, -32, 32, 32])
    assert anchors.shape == (6, 4)


def test_the_weights_file_sets_every_tensor_and_the_sizes(tmp_path):
    state = random_butd_state(TINY, seed=1)
    detector = ButdRegionDetector(
        write_pkl(tmp_path / "w.pkl", state), settings=ButdSettings.from_config_file(overrides=SMALL)
    )
    assert detector.model.architecture == TINY and detector.feature_dim == 512
    from vlbert.detectors.butd_model import plain_state_dict
    from vlbert.detectors.detectron2_checkpoint import read_checkpoint

    renamed, unused = plain_state_dict(read_checkpoint(tmp_path / "w.pkl")[0])
    assert sorted(unused) == ["roi_heads.box_predictor.bbox_pred.bias", "roi_heads.box_predictor.bbox_pred.weight"]
    model = detector.model.state_dict()
    assert all(torch.equal(model[k], renamed[k]) for k in renamed) and set(renamed) <= set(model)


def test_weights_of_another_model_or_names_are_refused(tmp_path):
    state = random_butd_state(TINY)
    no_rpn = {k: v for k, v in state.items() if "rpn_head.objectness" not in k}
    with pytest.raises(ValueError, match="lack rpn_head.cls_logits.weight: they are not a ResNet C4 Faster R-CNN"):
        ButdRegionDetector(write_pkl(tmp_path / "a.pkl", no_rpn))
    narrow = dict(state, **{"roi_heads.res5.0.conv2.weight": state["roi_heads.res5.0.conv2.weight"][:, :8]})
    with pytest.raises(ValueError, match=r"do not fit BUTD's C4 Faster R-CNN \(res5.0.conv2.weight: file"):
        ButdRegionDetector(write_pkl(tmp_path / "b.pkl", narrow))
    caffe2 = {"res2_0_branch2a_w": np.zeros((16, 16, 1, 1), np.float32)}
    (tmp_path / "c.pkl").write_bytes(pickle.dumps({"blobs": caffe2}))
    with pytest.raises(ValueError, match="Caffe2/Detectron parameter names.*--backend detectron2"):
        ButdRegionDetector(tmp_path / "c.pkl")
    with pytest.raises(ValueError, match="the butd backend needs the detector's weights"):
        DetectorConfig(backend="butd")
    with pytest.raises(ValueError, match="does not read the detectron2 key MODEL.MASK_ON"):
        ButdSettings.from_config_file(overrides={"MODEL.MASK_ON": True})


def test_the_tool_extracts_butd_regions_without_detectron2(tmp_path, monkeypatch):
    import json

    import vlbert.detectors.butd_model as butd_model
    from vlbert.detectors.shards import read_detector_info, read_shards, shard_paths

    monkeypatch.setitem(__import__("sys").modules, "detectron2", None)  # as a fresh `pip install -e .`
    monkeypatch.setattr(butd_model, "BUTD_VG_SETTINGS", ButdSettings.from_config_file(overrides=SMALL))
    weights = write_pkl(tmp_path / "faster_rcnn_from_caffe_attr.pkl", random_butd_state(TINY))
    (tmp_path / "objects_vocab.txt").write_text("".join(f"object{i},synonym\n" for i in range(16)))
    folder = tmp_path / "images"
    folder.mkdir()
    from PIL import Image

    for i, array in enumerate(images([(100, 64), (64, 100), (100, 64)])):
        Image.fromarray(array).save(folder / f"{i}.png")
    argv = [
        "--images",
        str(folder),
        "--backend",
        "butd",
        "--weights",
        str(weights),
        "--output-dir",
        str(tmp_path / "out"),
    ]
    argv += ["--class-names", str(tmp_path / "objects_vocab.txt"), "--min-boxes", "4", "--max-boxes", "4"]
    assert run_tool(tool("extract_regions"), argv) == 0
    regions = sorted(read_shards(shard_paths(tmp_path / "out")), key=lambda r: r.image_id)
    assert [r.image_id for r in regions] == ["0", "1", "2"] and all(r.num_regions == 4 for r in regions)
    assert regions[0].features.shape == (4, 512) and regions[0].attribute_probs.shape == (4, 8)
    info = read_detector_info(tmp_path / "out")
    assert info["class_names"][:2] == ["object0", "object1"] and info["attribute_names"][0] == "attribute_0"
    record = DetectorConfig.from_record(json.loads((tmp_path / "out" / "detector.json").read_text())["config"])
    assert (
        record.backend == "butd"
        and record.difference(NAMED_DETECTORS["butd-vg"].with_options(max_boxes=4, min_boxes=4)) is None
    )
    # A run recorded on detectron2's butd-vg rebuilds on this machine without detectron2: the same regions.
    from vlbert.detectors.detectron2_options import Detectron2Options

    d2_record = DetectorConfig(
        "detectron2", str(weights), options=Detectron2Options(config_file="butd-vg", min_boxes=4, max_boxes=4)
    )
    again = d2_record.build()
    assert isinstance(again, ButdRegionDetector)
    assert_same(
        again(np.asarray(Image.open(folder / "1.png")), "1"), regions[1], rtol=2e-3, atol=1e-3
    )  # float16 shards


def test_grid_features_of_the_butd_detector_are_its_res5_map(tmp_path, monkeypatch):
    """The grid backend over BUTD's backbone (Jiang et al. 2020's grid features of the same detector): one cell is
    the mean of res5 over the whole image, its class distribution the detector's object head on it."""
    import vlbert.detectors.butd_model as butd_model

    monkeypatch.setattr(butd_model, "BUTD_VG_SETTINGS", ButdSettings.from_config_file(overrides=SMALL))
    weights = write_pkl(tmp_path / "faster_rcnn_from_caffe_attr.pkl", random_butd_state(TINY))
    with pytest.raises(ValueError, match="the grid backend's butd backbone needs BUTD's weights"):
        DetectorConfig("grid", options={"backbone": "butd"})
    config = DetectorConfig("grid", str(weights), options={"backbone": "butd", "grid_size": 1})
    (array,) = images([(100, 64)])
    whole = config.build()(array, "0")
    model = ButdRegionDetector(weights).model
    c5 = model.feature_map(ButdRegionDetector(weights)._prepare(array)[None])
    assert c5.shape[1] == 512 and whole.boxes.tolist() == [[0.0, 0.0, 100.0, 64.0]]
    np.testing.assert_allclose(
        whole.features.astype(np.float32)[0], c5.mean(dim=(2, 3))[0].numpy(), rtol=2e-3, atol=1e-6
    )
    expected = model.cls_score(c5.mean(dim=(2, 3)))[:, :-1].softmax(-1)[0].detach().numpy()
    np.testing.assert_allclose(whole.class_probs.astype(np.float32)[0], expected, atol=1e-3)
    six = DetectorConfig("grid", str(weights), options={"backbone": "butd", "grid_size": 3}).build()(array, "0")
    assert (
        six.num_regions == 9
        and config.fingerprint()
        != DetectorConfig("grid", str(weights), options={"backbone": "butd", "grid_size": 3}).fingerprint()
    )
