"""Images/s of VQA inference from image files, detector included: what `tools/predict.py` does per example.

    python tools/benchmark_inference.py runs/vqa-easy-vqa --images 256 --batch-size 16
    taskset -c 0,1 python tools/benchmark_inference.py runs/vqa-easy-vqa --threads 2     # a 2-core machine

Times, after one warm-up batch, on easy-VQA test images with one question each: the run's detector alone (decode
+ extraction), the model alone on those regions, and the pipeline end to end (files -> answers). Prints one line
per figure and, with --json, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

from vlbert.commands import flag_types as flags
from vlbert.data.easy_vqa import image_paths
from vlbert.inference import VQAPipeline


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Errors propagate for :func:`vlbert.commands.run_tool` to report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a VQA run's output directory")
    p.add_argument("--images", type=flags.count, default=256)
    p.add_argument("--batch-size", type=flags.count, default=16)
    p.add_argument("--device", type=flags.device, default="cpu")
    p.add_argument("--threads", type=flags.count_or_zero, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    vqa = VQAPipeline(args.run, device=args.device, batch_size=args.batch_size)
    files = [str(p) for p in list(image_paths("test").values())[: args.images]]
    questions = ["what color is the shape?"] * len(files)
    vqa(files[: args.batch_size], questions[: args.batch_size])  # warm-up: weights loaded, kernels chosen

    def timed(fn):
        start = time.perf_counter()
        result = fn()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return result, time.perf_counter() - start

    regions, t_detector = timed(lambda: vqa.regions(files))
    _, t_model = timed(lambda: vqa(regions, questions))
    _, t_total = timed(lambda: vqa(files, questions))
    figures = {
        "images": len(files),
        "batch_size": args.batch_size,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "detector": vqa.processor.region_source.extractor,
        "detector_images_per_s": len(files) / t_detector,
        "model_images_per_s": len(files) / t_model,
        "end_to_end_images_per_s": len(files) / t_total,
    }
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key}: {value:.1f}" if isinstance(value, float) else f"{key}: {value}")
    return 0
