"""Regions, shards and readers: schema checks, round trips, refusal of corrupt or unsafe files, proposals and
the real ImageNet backbone."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest
from vlbert.detectors.precomputed import LXMERT_FIELDS, read_butd_tsv, read_npz, write_butd_tsv
from vlbert.detectors.regions import RegionError, Regions
from vlbert.detectors.shards import ShardError, read_shards, write_shards


def make_regions(image_id="img-0", n=3, dim=8, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    boxes = np.array([[0, 0, 80, 60], [10, 5, 30, 25], [40, 20, 79.5, 59]][:n], dtype=np.float32)
    feats = rng.standard_normal((n, dim)).astype(np.float16)
    probs = rng.dirichlet(np.ones(classes), n).astype(np.float16)
    return Regions(image_id, 60, 80, boxes, feats, rng.random(n), probs, "test")


@pytest.mark.parametrize(
    "boxes, message",
    [
        ([[0, 0, 90, 60]], "outside"),
        ([[30, 10, 20, 40]], "x2 < x1"),
        (np.zeros((0, 4)), "zero regions"),
    ],
)
def test_bad_boxes(boxes, message):
    n = len(boxes)
    with pytest.raises(RegionError, match=message):
        Regions("x", 60, 80, boxes, np.zeros((n, 4)), np.ones(n))


def test_nan_features():
    with pytest.raises(RegionError, match="NaN"):
        Regions("x", 60, 80, [[0, 0, 10, 10]], [[0.0, np.nan]], [1.0])


def test_normalised_boxes():
    r = make_regions()
    np.testing.assert_allclose(r.normalised_boxes()[1], [10 / 80, 5 / 60, 30 / 80, 25 / 60], rtol=1e-6)


def test_shard_round_trip(tmp_path):
    originals = [make_regions(f"img.{i}", seed=i) for i in range(7)]
    paths = write_shards(originals, tmp_path, max_samples_per_shard=3)
    assert [p.name for p in paths] == ["regions-000000.tar", "regions-000001.tar", "regions-000002.tar"]
    back = list(read_shards(paths))
    assert [r.image_id for r in back] == [r.image_id for r in originals]
    for a, b in zip(originals, back, strict=True):
        assert b.features.dtype == np.float16 and b.class_probs.dtype == np.float16
        for name in ("boxes", "features", "scores", "class_probs"):
            assert np.array_equal(getattr(a, name), getattr(b, name))
        assert (a.height, a.width, a.detector) == (b.height, b.width, b.detector)


def test_truncated_and_corrupt_shards(tmp_path):
    path = write_shards([make_regions(f"i{k}") for k in range(3)], tmp_path)[0]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError, match="corrupt or truncated"):
        list(read_shards([path]))
    path.write_bytes(b"not a tar file at all" * 50)
    with pytest.raises(ShardError, match="corrupt or truncated"):
        list(read_shards([path]))


def _tar_with(members: list[tuple[str, bytes]], path):
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_duplicate_keys_and_pickles_are_refused(tmp_path):
    good = write_shards([make_regions("a")], tmp_path / "good")[0]
    with tarfile.open(good) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar]
    _tar_with(members + [members[1]], tmp_path / "dup.tar")  # the same field again
    with pytest.raises(ShardError, match="duplicate"):
        list(read_shards([tmp_path / "dup.tar"]))
    _tar_with(members + [(m.replace("a.", "b.", 1), d) for m, d in members], tmp_path / "twice.tar")
    with pytest.raises(ShardError, match="appears twice"):  # b's meta.json still says image "a"
        list(read_shards([tmp_path / "twice.tar"]))
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    evil = [(n, buffer.getvalue() if n.endswith("features.npy") else d) for n, d in members]
    _tar_with(evil, tmp_path / "evil.tar")
    with pytest.raises(ShardError, match="object arrays are refused"):
        list(read_shards([tmp_path / "evil.tar"]))


def test_butd_tsv_fixture_reads_back_exactly(tmp_path):
    originals = [make_regions(f"COCO_{i}", seed=i) for i in range(3)]
    write_butd_tsv(originals, tmp_path / "feats.tsv")
    back = list(read_butd_tsv(tmp_path / "feats.tsv"))
    for a, b in zip(originals, back, strict=True):
        assert (b.image_id, b.height, b.width) == (a.image_id, a.height, a.width)
        assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.features, b.features)


def test_lxmert_tsv_layout(tmp_path):
    import base64

    r = make_regions()
    enc = lambda a: base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()  # noqa: E731
    row = {
        "img_id": "COCO_1",
        "img_h": 60,
        "img_w": 80,
        "objects_id": enc(np.arange(3, dtype=np.int64)),
        "objects_conf": enc(np.array([0.9, 0.5, 0.25], dtype=np.float32)),
        "attrs_id": enc(np.zeros(3, np.int64)),
        "attrs_conf": enc(np.zeros(3, np.float32)),
        "num_boxes": 3,
        "boxes": enc(r.boxes),
        "features": enc(r.features.astype(np.float32)),
    }
    (tmp_path / "obj36.tsv").write_text("\t".join(str(row[k]) for k in LXMERT_FIELDS) + "\n")
    (b,) = list(read_butd_tsv(tmp_path / "obj36.tsv"))
    assert b.image_id == "COCO_1" and np.array_equal(b.boxes, r.boxes) and np.array_equal(b.features, r.features)
    np.testing.assert_array_equal(b.scores, np.array([0.9, 0.5, 0.25], dtype=np.float32))
    (tmp_path / "bad.tsv").write_text("a\tb\tc\n")
    with pytest.raises(RegionError, match="3 columns"):
        list(read_butd_tsv(tmp_path / "bad.tsv"))


def test_npz_reader(tmp_path):
    r = make_regions()
    np.savez(
        tmp_path / "42.npz", x=r.features.T, bbox=r.boxes, image_h=60, image_w=80, num_bbox=3, cls_prob=r.class_probs
    )
    back = read_npz(tmp_path / "42.npz")
    assert back.image_id == "42" and np.array_equal(back.features, r.features)
    assert np.array_equal(back.boxes, r.boxes)
    # BUTD's cls_prob has the background class in column 0: dropped, the object classes renormalised.
    objects = r.class_probs[:, 1:].astype(np.float32)
    np.testing.assert_allclose(back.class_probs.astype(np.float32), objects / objects.sum(1, keepdims=True), atol=1e-3)
    assert read_npz(tmp_path / "42.npz", background_column=False).class_probs.shape == r.class_probs.shape


def test_proposals_find_the_easy_vqa_shape():
    import torch
    from PIL import Image
    from torchvision.ops import box_iou
    from vlbert.detectors.proposals import felzenszwalb_proposals

    from vlbert.data.easy_vqa import image_paths

    hits = 0
    paths = list(image_paths("test").values())[:20]
    for path in paths:
        image = np.asarray(Image.open(path).convert("RGB")).astype(int)
        background = image[0, 0]
        ys, xs = np.nonzero(np.abs(image - background).sum(-1) > 60)
        truth = torch.tensor([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], dtype=torch.float)
        boxes = felzenszwalb_proposals(image.astype(np.uint8))
        assert (boxes[0] == [0, 0, 64, 64]).all() and len(boxes) <= 36
        hits += int(box_iou(torch.from_numpy(boxes), truth).max() > 0.7)
    assert hits >= 16, f"only {hits}/20 images have a proposal on the shape"


def test_imagenet_backbone_recognises_a_real_photo():
    from skimage import data
    from vlbert.detectors.backbone import BackboneRegionExtractor

    extractor = BackboneRegionExtractor(input_size=224)
    assert extractor.feature_dim == 1280 + 40  # final stage + the colour-keeping early stage
    image = data.chelsea()  # a tabby cat
    h, w = image.shape[:2]
    regions = extractor(image, "chelsea", boxes=np.array([[0, 0, w, h], [100, 30, 300, 250]], dtype=np.float32))
    assert regions.features.shape == (2, 1320) and regions.class_probs.shape == (2, 1000)
    cats = range(281, 286)  # ImageNet: tabby, tiger cat, Persian, Siamese, Egyptian cat
    assert int(regions.class_probs[0].argmax()) in cats
    assert float(regions.class_probs[0, list(cats)].astype(np.float32).sum()) > 0.5
    with pytest.raises(RegionError, match="outside"):
        extractor(image, "chelsea", boxes=np.array([[0, 0, w + 50, h]], dtype=np.float32))


def test_torchvision_detector_pipeline():
    import torch
    from vlbert.detectors.torchvision_detector import TorchvisionRegionDetector

    torch.manual_seed(0)
    detector = TorchvisionRegionDetector(weights=None, min_boxes=10, max_boxes=20)
    # torchvision resizes to a short side of 800 by default; 240 keeps the resize (boxes come back in the image's
    # 120 x 160 pixels) at a twelfth of the backbone's work
    detector.model.transform.min_size, detector.model.transform.max_size = (240,), 320
    image = (np.random.default_rng(0).random((120, 160, 3)) * 255).astype(np.uint8)
    regions = detector(image, "noise")
    assert 1 <= regions.num_regions <= 20
    # 90 object classes: the background column is left out of the MRC target and the rest sum to 1.
    assert regions.features.shape[1] == 1024 and regions.class_probs.shape[1] == detector.num_classes == 90
    np.testing.assert_allclose(regions.class_probs.astype(np.float32).sum(1), 1.0, atol=2e-3)
    assert (regions.boxes[:, 2] <= 160).all() and (regions.boxes[:, 3] <= 120).all()


def test_detectron2_missing_names_the_install(monkeypatch):
    import sys

    from vlbert.detectors.detectron2_detector import Detectron2RegionDetector

    monkeypatch.setitem(sys.modules, "detectron2", None)  # as on a machine without it
    with pytest.raises(ModuleNotFoundError, match="detectron2"):
        Detectron2RegionDetector("cfg.yaml", "model.pth")


def test_features_are_identified_by_what_changes_them(tmp_path):
    """The fingerprint and the match follow the weights' content and the settings, never a directory or a
    vocabulary file; a record that knows only the weights' name (a published family's) matches on that name; old
    records (no weights_sha256, fields of other versions) stay readable."""
    from dataclasses import asdict, replace

    from vlbert.detectors.config import NAMED_DETECTORS, DetectorConfig
    from vlbert.detectors.files import BUTD_VG_CONFIG_FILE

    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
    (tmp_path / "a" / "w.pkl").write_bytes(b"the weights")
    (tmp_path / "b" / "w.pkl").write_bytes(b"the weights")
    (tmp_path / "c" / "w.pkl").write_bytes(b"other weights")
    butd = NAMED_DETECTORS["butd-vg"]  # weights named faster_rcnn_from_caffe_attr.pkl, sha256 unknown
    here = replace(butd.with_options(class_names="objects.txt"), weights=str(tmp_path / "a" / "w.pkl")).identified()
    # The same model on the detectron2 backend, its config file given by a path: the same features.
    from vlbert.detectors.detectron2_options import Detectron2Options

    by_path = Detectron2Options(config_file=str(BUTD_VG_CONFIG_FILE))
    moved = DetectorConfig("detectron2", str(tmp_path / "b" / "w.pkl"), options=by_path).identified()
    other = replace(butd, weights=str(tmp_path / "c" / "w.pkl")).identified()
    assert len(here.weights_sha256) == 64 and here.weights_sha256 == moved.weights_sha256
    assert here.fingerprint() == moved.fingerprint() != other.fingerprint()  # content, not directory or names
    assert here.difference(moved) is None
    assert "weights sha256" in here.difference(other)
    assert "max_boxes 100 vs 36" in butd.difference(butd.with_options(max_boxes=36))
    # Against the name-only record: the name decides.
    assert "weights file 'faster_rcnn_from_caffe_attr.pkl' vs 'w.pkl'" in butd.difference(here)
    named = tmp_path / "a" / "faster_rcnn_from_caffe_attr.pkl"
    named.write_bytes(b"the weights")
    assert butd.difference(replace(butd, weights=str(named)).identified()) is None
    assert butd.with_weights(named).weights_sha256 == here.weights_sha256
    with pytest.raises(ValueError, match="not the ones the regions were extracted with"):
        here.with_weights(tmp_path / "c" / "w.pkl")
    # A record written before weights_sha256 existed, with a field this version does not know.
    old = {k: v for k, v in asdict(butd).items() if k != "weights_sha256"} | {"retired_field": 1}
    assert DetectorConfig.from_record(old) == butd and butd.fingerprint() == "5cb19239ea"


#: detector.json's ``config`` as the flat layout wrote it (every backend's fields side by side), before the options
#: sections, with the fingerprints recorded beside them then: butd-vg's (UNITER's record), the tests' easy timm.
FLAT_RECORDS = {
    "5cb19239ea": {
        "backend": "detectron2",
        "input_size": 224,
        "roi_output_size": 3,
        "max_proposals": 36,
        "low_level_stage": 2,
        "weights": "faster_rcnn_from_caffe_attr.pkl",
        "config_file": "butd-vg",
        "min_boxes": 10,
        "max_boxes": 100,
        "score_threshold": 0.2,
        "nms_iou": 0.3,
        "overrides": {},
        "class_names": "",
        "attribute_names": "",
        "weights_sha256": "",
    },
    "3fa4ad0779": {
        "backend": "timm",
        "input_size": 96,
        "roi_output_size": 3,
        "max_proposals": 8,
        "low_level_stage": 2,
        "weights": "",
        "config_file": "",
        "min_boxes": 10,
        "max_boxes": 100,
        "score_threshold": 0.2,
        "nms_iou": 0.3,
        "overrides": {},
        "class_names": "",
        "attribute_names": "",
        "weights_sha256": "",
    },
}


def test_the_flat_layout_reads_with_its_fingerprint_and_sections_are_checked(tmp_path):
    """Records and YAML of the flat layout read into the backend's options with the fingerprint they had; a user's
    section is refused where a key belongs to another backend, to none, or is given twice differently."""
    from dataclasses import asdict

    from vlbert.detectors.config import NAMED_DETECTORS, DetectorConfig, named_detector

    for fingerprint, record in FLAT_RECORDS.items():
        config = DetectorConfig.from_record(record)
        assert config.fingerprint() == fingerprint
        assert DetectorConfig.from_record(asdict(config)) == config  # the sections layout reads back
    # detectron2's butd-vg, as UNITER's record said before the butd backend: the butd backend's features.
    assert DetectorConfig.from_record(FLAT_RECORDS["5cb19239ea"]).difference(NAMED_DETECTORS["butd-vg"]) is None
    assert NAMED_DETECTORS["butd-vg"].fingerprint() == "5cb19239ea"
    assert DetectorConfig.from_record(FLAT_RECORDS["3fa4ad0779"]).options.input_size == 96
    (tmp_path / "flat.yaml").write_text("detector: {backend: timm, input_size: '96', max_proposals: 8}\n")
    assert named_detector(str(tmp_path / "flat.yaml")).fingerprint() == "3fa4ad0779"
    refusals = {
        "min_boxes is an option of the torchvision, butd and detectron2 backends, not of timm": {
            "backend": "timm",
            "min_boxes": 5,
        },
        "unknown detector fields input_sise": {"input_sise": 96},
        "detector.input_size and detector.options.input_size differ": {
            "input_size": 96,
            "options": {"input_size": 128},
        },
        "detector.options.max_proposals must be an int, got 8.5": {"options": {"max_proposals": 8.5}},
        "detector.backend must be one of timm, torchvision, butd, detectron2, grid": {"backend": "yolo"},
    }
    for message, section in refusals.items():
        with pytest.raises(ValueError, match=message):
            DetectorConfig.from_section(section)


def test_processes_indexing_one_store_at_once_both_succeed(tmp_path, monkeypatch):
    """The ranks of a run open the same shard directory at once and each writes its index: a second process that
    writes and renames its index while the first is between writing and renaming leaves the first's rename intact
    (with one shared temporary name the first found its file gone: a two-process test failed so)."""
    import vlbert.detectors.store as store
    from vlbert.detectors.shards import write_shards

    write_shards([make_regions(f"img-{i}") for i in range(3)], tmp_path)
    real_replace, nested, started = os.replace, [], []

    def replace_after_another_process(src, dst):
        if not started:  # the other process runs whole, between this one's write and rename
            started.append(True)
            nested.append(store.RegionStore(tmp_path))
        real_replace(src, dst)

    monkeypatch.setattr(store.os, "replace", replace_after_another_process)
    first = store.RegionStore(tmp_path)
    assert list(first.ids) == list(nested[0].ids) == ["img-0", "img-1", "img-2"]
    assert sorted(p.name for p in tmp_path.iterdir() if "index" in p.name) == ["index.npz"]
