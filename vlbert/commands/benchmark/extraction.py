"""Images/s of region extraction, one image at a time against batched (equal-size images share a forward pass).

    python tools/benchmark_extraction.py --config-file COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml --images 16
    python tools/benchmark_extraction.py --config-file butd-vg --images 8 --device cuda --batch-size 8
    python tools/benchmark_extraction.py --backend torchvision --images 16
    python tools/benchmark_extraction.py --backend timm --architecture resnet50 --images 16

Any backend of detectors/backends.py, with the same detector flags as tools/extract_regions.py (default: detectron2,
COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml). Weights are the backend's seeded random ones (its table line's
``random_weights``) unless --weights is given (detectron2: the RPN's box deltas zeroed, so that its proposals are
distinct anchors as a trained RPN's are; the RPN then keeps POST_NMS_TOPK_TEST proposals and the selection
min_boxes..max_boxes regions, which is what the time depends on). The images are
the embedded easy-VQA pictures resized to COCO's commonest sizes (640x480, 480x640, 640x427, 500x375), so batches
form as they do on COCO. Prints one JSON line per batch size.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from vlbert.commands.detector_flags import add_detector_arguments, detector_options
from vlbert.data.easy_vqa import image_paths
from vlbert.detectors.backends import DETECTOR_BACKENDS
from vlbert.detectors.config import DetectorConfig

COCO_SIZES = [(640, 480), (480, 640), (640, 427), (500, 375)]


def coco_like_images(count: int) -> list[tuple[str, np.ndarray]]:
    """(id, uint8 RGB array) pairs: easy-VQA images resized to COCO's commonest sizes, weighted 4:2:1:1."""
    from PIL import Image

    sizes = [COCO_SIZES[i] for i in (0, 0, 0, 0, 1, 1, 2, 3)]
    paths = list(image_paths("train").items())
    return [
        (image_id, np.asarray(Image.open(p).convert("RGB").resize(sizes[k % len(sizes)])))
        for k, (image_id, p) in enumerate(paths[:count])
    ]


def build(args, tmp: Path):
    """The detector to time, from the detector flags (default: detectron2's COCO R50-FPN), with the backend's
    seeded random weights written to ``tmp`` unless --weights is given.

    Raises:
        ValueError: the backend writes no random weights and no --weights was given.
    """
    backend, options = detector_options(args, "detectron2")
    if backend == "detectron2" and not options.config_file:
        options.config_file = "COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml"
    weights = args.weights
    if weights is None:
        entry = DETECTOR_BACKENDS[backend]
        if entry.random_weights is None:
            raise ValueError(f"the {backend} backend writes no random weights; pass --weights")
        weights = str(tmp / "random.pth")
        entry.random_weights(options, weights)
    sha256 = (args.weights_sha256 or "") if args.weights else ""  # --weights-sha256 checks a given file
    return (
        DetectorConfig(backend=backend, weights=weights, weights_sha256=sha256, options=options)
        .identified()
        .build(args.device)
    )


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Errors propagate for :func:`vlbert.commands.run_tool` to report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_detector_arguments(p, default_backend="detectron2")
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)
    images = coco_like_images(args.images)
    with tempfile.TemporaryDirectory() as tmp:
        detector = build(args, Path(tmp))
        detector.extract_batch([images[0][1]], [images[0][0]])  # warm-up
        for batch_size in (1, args.batch_size):
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            regions = 0
            for s in range(0, len(images), batch_size):
                chunk = images[s : s + batch_size]
                out = detector.extract_batch([a for _, a in chunk], [i for i, _ in chunk])
                regions += sum(r.num_regions for r in out)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            print(
                json.dumps(
                    {
                        "detector": detector.name if hasattr(detector, "name") else args.backend,
                        "device": args.device,
                        "threads": torch.get_num_threads(),
                        "batch_size": batch_size,
                        "images": len(images),
                        "images_per_s": round(len(images) / elapsed, 3),
                        "regions_per_image": round(regions / len(images), 1),
                    }
                ),
                flush=True,
            )
    return 0
