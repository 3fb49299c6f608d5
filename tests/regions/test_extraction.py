"""tools/extract_regions.py at the users' size: images of every mode decoded or refused by name, a killed
extraction resumed to the same shards as an uninterrupted one, and two processes (torchrun's agent) splitting the images."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.builders import tool
from helpers.distributed import launch, tool_process, tool_status
from PIL import Image
from vlbert.detectors.images import ImageDecodeError, load_image, shape_groups, to_rgb_array
from vlbert.detectors.shards import read_shards, shard_paths

from vlbert.commands import run_tool

FAST = ["--input-size", "64", "--max-proposals", "4"]


def test_image_modes_become_8_bit_rgb(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    grey = rgb[:, :, 0]
    Image.fromarray(grey, "L").save(tmp_path / "grey.png")
    assert (load_image(tmp_path / "grey.png") == grey[:, :, None]).all()
    # 16-bit greyscale (scans, medical and astronomy PNGs): scaled by 65535, not clipped at 255.
    deep = grey.astype(np.uint16) * 257
    Image.fromarray(deep).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode.startswith("I")
    assert (load_image(tmp_path / "deep.png") == grey[:, :, None]).all()
    Image.fromarray(rgb).convert("CMYK").save(tmp_path / "cmyk.jpg", quality=100)
    cmyk = load_image(tmp_path / "cmyk.jpg")
    assert cmyk.shape == (20, 30, 3) and np.abs(cmyk.astype(int) - rgb).mean() < 8  # JPEG loss only
    Image.fromarray(np.dstack([rgb, np.full((20, 30), 7, np.uint8)]), "RGBA").save(tmp_path / "alpha.png")
    assert (load_image(tmp_path / "alpha.png") == rgb).all()
    Image.fromarray(rgb).convert("P").save(tmp_path / "palette.png")
    assert load_image(tmp_path / "palette.png").shape == (20, 30, 3)
    assert (to_rgb_array(deep) == grey[:, :, None]).all()
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(ImageDecodeError, match="cannot decode image .*broken.jpg"):
        load_image(tmp_path / "broken.jpg")
    with pytest.raises(ValueError, match="float64"):
        to_rgb_array(np.zeros((4, 4, 3)))


def test_shape_groups_never_mix_sizes():
    shapes = [(4, 6), (5, 5), (4, 6), (4, 6), (5, 5)]
    assert shape_groups(shapes, max_batch=2) == [[0, 2], [3], [1, 4]]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_tool_names_an_image_it_cannot_decode(tmp_path, capsys, workers):
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(images / "good.png")
    (images / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    # One line naming the file, exit status 2 (a traceback would propagate out of run_tool and fail the test), the
    # same whether the images are decoded in the tool's process or in its decoding workers.
    args = ["--images", str(images), "--output-dir", str(tmp_path / "out"), *FAST, "--num-workers", workers]
    assert run_tool(tool("extract_regions"), args) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "bad.png" in errors[0]
    assert errors[0].startswith("error: cannot decode image ") and "Caught" not in errors[0]


def test_decoding_workers_and_size_groups_keep_the_regions_and_their_order(tmp_path):
    """Real easy-VQA files, some copied at two other sizes and interleaved: decoded by 2 worker threads the regions
    equal (to the bit) those decoded in the model's thread, and both come in input order with the regions each image gets
    alone (one image per forward pass), although within a window equal sizes were batched together out of order."""
    from vlbert.detectors.config import DetectorConfig
    from vlbert.detectors.extract import decoded_images, extract_regions

    from vlbert.data.easy_vqa import image_paths

    sources = []
    for k, (image_id, path) in enumerate(list(image_paths("train").items())[:10]):
        if k % 3:
            sources.append((image_id, path))
        else:  # 64 x 64 PNGs; every third one at 80 x 48 or 48 x 80 instead
            resized = tmp_path / f"{k}.png"
            Image.open(path).resize((80, 48) if k % 2 else (48, 80)).save(resized)
            sources.append((image_id, resized))
    extractor = DetectorConfig(options={"input_size": 64, "max_proposals": 4}).build()
    shapes = [a.shape for _, a in decoded_images(sources, num_workers=2)]
    assert shapes == [load_image(path).shape for _, path in sources] and len(set(shapes)) == 3
    main = list(extract_regions(extractor, sources, batch_size=4, progress=False, num_workers=0))
    workers = list(extract_regions(extractor, sources, batch_size=4, progress=False, num_workers=2))
    alone = list(extract_regions(extractor, sources, batch_size=1, progress=False))
    assert [r.image_id for r in main] == [r.image_id for r in workers] == [i for i, _ in sources]
    for a, b, c in zip(main, workers, alone, strict=True):
        assert (a.height, a.width) == (b.height, b.width) == (c.height, c.width)
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_array_equal(a.features, b.features)
        np.testing.assert_array_equal(a.boxes, c.boxes)
        np.testing.assert_allclose(a.features.astype(np.float32), c.features.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_decoding_workers_raise_an_undecodable_image_as_it_is_and_in_order(tmp_path):
    """The images before a bad one come out, then its error: the type and one-line message that decoding it in this
    the caller's thread gives; a missing file likewise."""
    from vlbert.detectors.extract import decoded_images

    good = tmp_path / "good.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(good)
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    for bad, error in ((tmp_path / "bad.png", ImageDecodeError), (tmp_path / "gone.png", FileNotFoundError)):
        sources = [("a", good), ("b", good), ("bad", bad), ("c", good)]
        with pytest.raises(error) as in_process:
            load_image(bad)
        seen = []
        with pytest.raises(error) as in_worker:
            for image_id, _ in decoded_images(sources, num_workers=2):
                seen.append(image_id)
        assert seen == ["a", "b"]
        assert str(in_worker.value) == str(in_process.value) and bad.name in str(in_worker.value)
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        next(decoded_images([("a", good)], num_workers=-1))


def easy_vqa_folder(tmp_path, count):
    from vlbert.data.easy_vqa import image_paths

    folder = tmp_path / "images"
    folder.mkdir()
    for image_id, path in list(image_paths("train").items())[:count]:
        os.symlink(path, folder / f"{image_id.replace('/', '_')}{Path(path).suffix}")
    return folder


def regions_by_id(directory):
    return {r.image_id: r for r in read_shards(shard_paths(directory))}


def assert_same_store(a, b):
    assert sorted(a) == sorted(b)
    for image_id in a:
        np.testing.assert_array_equal(a[image_id].boxes, b[image_id].boxes)
        np.testing.assert_allclose(
            a[image_id].features.astype(np.float32), b[image_id].features.astype(np.float32), rtol=1e-2, atol=1e-3
        )


@pytest.mark.slow
@pytest.mark.integration
def test_a_killed_extraction_resumes_to_the_same_shards(tmp_path):
    folder = easy_vqa_folder(tmp_path, 120)
    args = ["--images", str(folder), *FAST, "--batch-size", "4", "--samples-per-shard", "8"]
    assert run_tool(tool("extract_regions"), [*args, "--output-dir", str(tmp_path / "whole")]) == 0
    killed = tmp_path / "killed"
    # a process of its own, forked from this one (no interpreter start), killed mid-way
    process = tool_process("extract_regions", [*args, "--output-dir", str(killed)])
    deadline = time.time() + 300
    while time.time() < deadline and len(list(killed.glob("*.tar"))) < 2:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    complete = list(killed.glob("*.tar"))
    assert 2 <= len(complete) < 15, "the kill should land mid-way"
    partial = regions_by_id(killed)  # what is there reads as complete shards only
    assert 16 <= len(partial) < 120
    assert run_tool(tool("extract_regions"), [*args, "--output-dir", str(killed)]) == 0  # the resume: in-process
    assert not list(killed.glob("*.tmp"))
    assert_same_store(regions_by_id(killed), regions_by_id(tmp_path / "whole"))


@pytest.mark.slow
@pytest.mark.integration
def test_two_processes_split_the_images_into_one_store(tmp_path, capsys):
    folder = easy_vqa_folder(tmp_path, 30)
    args = ["--images", str(folder), *FAST, "--samples-per-shard", "10"]
    assert run_tool(tool("extract_regions"), [*args, "--output-dir", str(tmp_path / "one")]) == 0
    # torchrun's agent, the workers forked from this process (helpers.distributed.launch)
    statuses = launch(
        [], entrypoint=tool_status, args=("extract_regions", [*args, "--output-dir", str(tmp_path / "two")])
    )
    assert statuses == {0: 0, 1: 0}
    assert {p.name.split("-")[1] for p in shard_paths(tmp_path / "two")} == {"rank0000", "rank0001"}
    assert_same_store(regions_by_id(tmp_path / "two"), regions_by_id(tmp_path / "one"))
    # The same command again skips every image; another detector into the same store is refused.
    capsys.readouterr()
    assert run_tool(tool("extract_regions"), [*args, "--output-dir", str(tmp_path / "two")]) == 0
    assert "wrote 0 shard(s)" in capsys.readouterr().out
    other = [*args, "--max-proposals", "5", "--output-dir", str(tmp_path / "two")]
    assert run_tool(tool("extract_regions"), other) == 2
    assert "holds shards of another detector" in capsys.readouterr().err


def test_butd_selection_equals_one_nms_per_class():
    """The all-classes-at-once NMS equals torchvision's NMS run class by class (generate_tsv.py's loop)."""
    import torch
    from torchvision.ops import nms
    from vlbert.detectors.selection import per_class_nms_confidence, select_regions

    g = torch.Generator().manual_seed(0)
    xy = torch.rand(120, 2, generator=g) * 100
    boxes = torch.cat([xy, xy + torch.rand(120, 2, generator=g) * 60 + 1], 1)
    probs = (torch.randn(120, 30, generator=g) * 2).softmax(1)
    reference = torch.zeros(120)
    for c in range(30):
        keep = nms(boxes, probs[:, c], 0.3)
        reference[keep] = torch.maximum(reference[keep], probs[keep, c])
    confidence = per_class_nms_confidence(boxes, probs, 0.3)
    assert torch.equal(confidence, reference)
    passing = int((confidence >= 0.3).sum())
    assert 10 < passing < 100
    keep = select_regions(confidence, 0.3, 10, 100)
    assert len(keep) == passing and confidence[keep].min() >= 0.3 and (confidence[keep].diff() <= 0).all()
    assert len(select_regions(confidence, 0.95, 10, 100)) == 10  # topped up to min_boxes by confidence
    assert len(select_regions(confidence, 0.0, 10, 36)) == 36  # cut to max_boxes
    # A confidence equal to the threshold is kept (>=, as generate_tsv.py); the kept come most confident first.
    assert select_regions(torch.tensor([0.1, 0.2, 0.5, 0.19]), 0.2, 1, 10).tolist() == [2, 1]


def test_a_damaged_shard_is_repaired_by_rerunning_the_command_and_another_picture_under_an_id_is_refused(
    tmp_path, capsys
):  # rows 110, 111
    """A store with one shard cut off (a copy interrupted): reading it says to rerun the command that wrote it, and
    that command (the one that used to refuse) sets the shard aside and extracts only its images again, to the
    store an uninterrupted run wrote. A second --images folder whose ``b.png`` is another picture is refused in one
    line naming both files; the same pictures under another folder are recognised by their sha256 and skipped."""
    from helpers.tool_errors import one_line_error
    from vlbert.detectors.shards import ShardError
    from vlbert.detectors.store import RegionStore

    rng = np.random.default_rng(0)
    folder, other = tmp_path / "images", tmp_path / "more"
    folder.mkdir()
    other.mkdir()
    for name in "abc":
        Image.fromarray(rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)).save(folder / f"{name}.png")
    out = tmp_path / "out"
    args = ["--images", str(folder), *FAST, "--samples-per-shard", "1", "--output-dir", str(out)]
    assert run_tool(tool("extract_regions"), args) == 0
    whole = regions_by_id(out)
    damaged = shard_paths(out)[1]
    damaged.write_bytes(damaged.read_bytes()[:1500])
    with pytest.raises(ShardError, match="run the command that wrote it again: vlbert extract with the same"):
        RegionStore(out)
    capsys.readouterr()
    assert run_tool(tool("extract_regions"), args) == 0
    assert "wrote 1 shard(s)" in capsys.readouterr().out
    assert damaged.with_name(damaged.name + ".corrupt").is_file()  # kept, out of the store
    assert_same_store(regions_by_id(out), whole)
    for name in "ab":  # the same pictures in another folder: already extracted
        (other / f"{name}.png").write_bytes((folder / f"{name}.png").read_bytes())
    again = ["--images", str(other), *FAST, "--output-dir", str(out)]
    assert run_tool(tool("extract_regions"), again) == 0 and "wrote 0 shard(s)" in capsys.readouterr().out
    Image.fromarray(rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)).save(other / "b.png")
    line = one_line_error(capsys, "extract_regions", again)
    assert f"image id 'b' of {other / 'b.png'} is already in {out} from {folder / 'b.png'}, a different picture" in line
    assert_same_store(regions_by_id(out), whole)


def test_a_damaged_cache_is_extracted_again(tmp_path):  # row 110
    """easy-VQA regions cached under data.cache_dir (as the recipes read them), the shard then cut off: the next
    run's lookup sees the shard's size differ from the one recorded and extracts the cache again."""
    from vlbert.detectors.config import DetectorConfig

    from vlbert.data.easy_vqa import easy_vqa_shards

    detector = DetectorConfig(options={"input_size": 64, "max_proposals": 4})
    ids = ["train/0", "train/1"]
    shards = easy_vqa_shards(detector, tmp_path, ids)
    whole = regions_by_id(shards[0].parent)
    shards[0].write_bytes(shards[0].read_bytes()[:2000])
    assert easy_vqa_shards(detector, tmp_path, ids) == shards
    assert_same_store(regions_by_id(shards[0].parent), whole)
