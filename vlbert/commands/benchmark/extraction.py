"""Images/s of region extraction, one image at a time against batched (equal-size images share a forward pass).

    python tools/benchmark_extraction.py --config-file COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml --images 16
    python tools/benchmark_extraction.py --config-file butd-vg --images 8 --device cuda --batch-size 8
    python tools/benchmark_extraction.py --backend torchvision --images 16

Weights are random unless --weights is given (the RPN's box deltas zeroed, so that its proposals are distinct
anchors as a trained RPN's are; the RPN then keeps POST_NMS_TOPK_TEST proposals and the selection min_boxes..max_boxes
regions, which is what the time depends on). The images are
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

from detectors.torchvision_detector import TorchvisionRegionDetector
from vlbert.data.easy_vqa import image_paths

COCO_SIZES = [(640, 480), (480, 640), (640, 427), (500, 375)]


def coco_like_images(count: int) -> list[tuple[str, np.ndarray]]:
    """(id, uint8 RGB array) pairs: easy-VQA images resized to COCO's commonest sizes, weighted 4:2:1:1."""
    from PIL import Image

    sizes = [COCO_SIZES[i] for i in (0, 0, 0, 0, 1, 1, 2, 3)]
    paths = list(image_paths("train").items())
    return [(image_id, np.asarray(Image.open(p).convert("RGB").resize(sizes[k % len(sizes)])))
            for k, (image_id, p) in enumerate(paths[:count])]


def build(args, tmp: Path):
    """The detector to time: torchvision's, or detectron2's from --config-file (random weights unless --weights;
    detectron2 is imported here, as it is optional)."""
    if args.backend == "torchvision":
        torch.manual_seed(0)
        return TorchvisionRegionDetector(weights=args.weights, device=args.device)
    from detectron2.modeling import build_model

    from detectors.detectron2_detector import Detectron2RegionDetector, load_config

    overrides = dict(zip(args.opts[::2], args.opts[1::2])) if args.opts else {}
    weights = args.weights
    if weights is None:
        torch.manual_seed(0)
        weights = tmp / "random.pth"
        state = build_model(load_config(args.config_file, overrides)).state_dict()
        for k in state:  # random deltas stretch every anchor to the whole image; a trained RPN's do not
            if "anchor_deltas" in k:
                state[k].zero_()
            elif k.endswith("norm.weight"):  # untrained frozen norms are identities: 100 residual layers overflow
                state[k].mul_(0.2)
        torch.save(state, weights)
    return Detectron2RegionDetector(args.config_file, weights, args.device, overrides=overrides)


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Errors propagate for :func:`vlbert.command_line.run_tool` to report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("detectron2", "torchvision"), default="detectron2")
    p.add_argument("--config-file", default="COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml")
    p.add_argument("--weights", help="default: random weights")
    p.add_argument("--opts", nargs="+", help="detectron2 config overrides: KEY VALUE ...")
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
                chunk = images[s:s + batch_size]
                out = detector.extract_batch([a for _, a in chunk], [i for i, _ in chunk], batch_size=batch_size)
                regions += sum(r.num_regions for r in out)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            print(json.dumps({"detector": detector.name if hasattr(detector, "name") else args.backend,
                              "device": args.device, "threads": torch.get_num_threads(), "batch_size": batch_size,
                              "images": len(images), "images_per_s": round(len(images) / elapsed, 3),
                              "regions_per_image": round(regions / len(images), 1)}), flush=True)
    return 0
