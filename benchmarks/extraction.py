"""Images/s of region extraction, every detector backend side by side in one run, one image at a time and batched.

    python -m benchmarks extraction                                # every backend of the table, on the CPU
    python -m benchmarks extraction --images 32 --device cpu cuda  # the GPU figure beside the CPU's
    python -m benchmarks extraction --backends timm torchvision --images 16 --batch-size 16
    python -m benchmarks extraction --backends detectron2 --config-file COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml
    python -m benchmarks extraction --backends timm --architecture resnet50 --weights resnet50.safetensors

Each backend of detectors/backends.py (``--backends``, default: every line of the table) is built with its default
options and its table line's seeded random weights (``random_weights``): the time does not depend on what the
weights learned, and no download is needed. Exceptions: timm runs its packaged ImageNet weights (they install
offline), and detectron2 runs ``--config-file butd-vg``, BUTD's Visual Genome model, the one the ``butd`` backend
runs in plain PyTorch. A backend that cannot be built here (its package missing, no random weights) gets a row
saying why. The detector flags of tools/extract_regions.py apply to every listed backend that has the option
(``--input-size 160`` to timm, ``--max-boxes 36`` to torchvision and detectron2); ``--weights`` replaces the random
weights of the one backend listed.

The images are the easy-VQA pictures resized to COCO's commonest sizes (640x480, 480x640, 640x427, 500x375, 4:2:1:1;
``--sizes`` for others), written as JPEG files and read as tools/extract_regions.py reads them: decoded by
``--num-workers`` threads ahead of the model, equal sizes batched together (detectors/extract.py). Each backend is
warmed up on one image, then timed over all of them one image at a time and ``--batch-size`` at a time.

Prints one JSON line per (backend, device, batch size) with the input sizes, torch's thread count, the decoding
workers and the machine's 1-minute load average when it ended (other work on the cores slows every figure), then a
table: backend | device | batch | images/s | regions/image | ms/image.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from vlbert.detectors.backends import DETECTOR_BACKENDS, backend_list
from vlbert.detectors.config import DetectorConfig, typed_options
from vlbert.detectors.extract import default_num_workers, extract_regions

from vlbert.commands import flag_types as flags
from vlbert.commands.detector_flags import add_detector_arguments, option_fields, option_flag
from vlbert.data.easy_vqa import image_paths

#: COCO's commonest image sizes (width, height).
COCO_SIZES = [(640, 480), (480, 640), (640, 427), (500, 375)]
#: Options a backend is timed with where its defaults are not the model to time: detectron2 has no default model.
BENCHMARK_OPTIONS = {"detectron2": {"config_file": "butd-vg"}}
#: Backends whose default weights ("") load offline: timed with those rather than with random weights.
OFFLINE_DEFAULT_WEIGHTS = ("timm",)
#: Images a run times per device where ``--images`` is not given: a BUTD-sized model on 2 CPU cores takes seconds an
#: image; a GPU needs more images to fill its batches.
DEFAULT_IMAGES = {"cpu": 8, "cuda": 64}
#: The errors that make a backend's row say why it did not run, instead of ending the run.
NOT_RUN = (ImportError, OSError, ValueError, RuntimeError)


def coco_like_images(count: int, sizes: list[tuple[int, int]] | None = None) -> list[tuple[str, np.ndarray]]:
    """``count`` (id, uint8 RGB [H, W, 3]) pairs: easy-VQA training images resized to ``sizes`` ((width, height)
    each, in turn; default COCO's commonest, weighted 4:2:1:1).

    Raises:
        ValueError: ``count`` < 1 or more than the 4,000 easy-VQA training images.
    """
    from PIL import Image

    paths = list(image_paths("train").items())
    if not 1 <= count <= len(paths):
        raise ValueError(f"--images must be between 1 and {len(paths)}, got {count}")
    cycle = sizes or [COCO_SIZES[i] for i in (0, 0, 0, 0, 1, 1, 2, 3)]
    return [
        (image_id, np.asarray(Image.open(p).convert("RGB").resize(cycle[k % len(cycle)])))
        for k, (image_id, p) in enumerate(paths[:count])
    ]


def write_jpegs(images: list[tuple[str, np.ndarray]], folder: Path) -> list[tuple[str, Path]]:
    """Write each (id, uint8 RGB array) as ``folder/<k>.jpg`` (quality 90); returns the (id, path) pairs."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k, (image_id, array) in enumerate(images):
        path = folder / f"{k}.jpg"
        Image.fromarray(array).save(path, quality=90)
        out.append((image_id, path))
    return out


def parse_size(text: str) -> tuple[int, int]:
    """(width, height) of ``"WxH"`` (``640x480``).

    Raises:
        ValueError: not two positive integers joined by ``x``.
    """
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--sizes takes WIDTHxHEIGHT values such as 640x480, got {text!r}")
    return int(parts[0]), int(parts[1])


def size_counts(images: list[tuple[str, np.ndarray]]) -> dict[str, int]:
    """``"WxH"`` -> how many of ``images`` have that size, commonest first."""
    return dict(Counter(f"{a.shape[1]}x{a.shape[0]}" for _, a in images).most_common())


def backend_options(args: argparse.Namespace, backends: list[str]) -> dict[str, object]:
    """Each backend's options dataclass: :data:`BENCHMARK_OPTIONS` over its defaults, then the detector flags given
    that are its options.

    Raises:
        ValueError: a flag that is an option of none of ``backends`` (the backends that have it named), or a
            ``KEY VALUE`` flag with an odd number of words, or a value of the wrong type.
    """
    import yaml

    given = {name: getattr(args, name) for name in option_fields() if getattr(args, name, None) is not None}
    for name, value in given.items():
        field, owners = option_fields()[name]
        if not set(owners) & set(backends):
            raise ValueError(
                f"{option_flag(name)} is an option of the {backend_list(owners)}, none of those timed "
                f"({', '.join(backends)}); drop it, or add --backends {owners[0]}"
            )
        if field.type == "dict":
            if len(value) % 2:
                raise ValueError(f"{option_flag(name)} takes KEY VALUE pairs, got {len(value)} words")
            given[name] = {k: yaml.safe_load(v) for k, v in zip(value[::2], value[1::2], strict=True)}
    out = {}
    for backend in backends:
        entry = DETECTOR_BACKENDS[backend]
        values = {**BENCHMARK_OPTIONS.get(backend, {}), **{k: v for k, v in given.items() if k in entry.option_names()}}
        out[backend] = typed_options(entry.options, values, "the detector flags")
    return out


def benchmark_config(backend: str, options, weights: str | None, weights_sha256: str, tmp: Path) -> DetectorConfig:
    """The detector to time: ``backend`` with ``options`` and ``weights`` where given, else its default weights
    where they load offline (:data:`OFFLINE_DEFAULT_WEIGHTS`, and the options accept them), else its seeded random
    weights written into ``tmp``.

    Raises:
        ValueError: the backend writes no random weights (pass --weights), or the config's own refusals.
        ImportError, OSError, RuntimeError: writing the random weights (the backend's package missing...).
    """
    entry = DETECTOR_BACKENDS[backend]
    if weights:
        return DetectorConfig(backend, weights, weights_sha256, options).identified()
    if backend in OFFLINE_DEFAULT_WEIGHTS:
        try:
            return DetectorConfig(backend, "", "", options)
        except ValueError:  # another architecture than the packaged one: random weights below
            pass
    if entry.random_weights is None:
        raise ValueError(f"the {backend} backend writes no random weights; time it with --backends {backend} --weights")
    path = tmp / f"{backend}-random.pth"
    entry.random_weights(options, str(path))
    return DetectorConfig(backend, str(path), "", options)


def weights_label(config: DetectorConfig, tmp: Path) -> str:
    """What the timed weights were: ``default`` (the backend's own), ``random`` (seeded) or the file given."""
    if not config.weights:
        return "default"
    return "random" if Path(config.weights).parent == tmp else config.weights


def time_extraction(extractor, sources, batch_size: int, num_workers: int, device: str) -> tuple[float, int]:
    """(seconds, regions) of extracting ``sources`` (id, file) with :func:`extract_regions` as the tool does,
    ``batch_size`` images a batch, ``num_workers`` decoding threads; CUDA work waited for before and after.

    Raises:
        what :func:`extract_regions` and the extractor raise (an image that cannot be read; CUDA out of memory...).
    """
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    regions = sum(
        r.num_regions for r in extract_regions(extractor, sources, batch_size, progress=False, num_workers=num_workers)
    )
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, regions


def print_table(rows: list[dict]) -> None:
    """The rows as a plain table: backend | device | batch | images/s | regions/image | ms/image; a row that did not
    run says why instead."""
    header = ("backend", "device", "batch", "images/s", "regions/image", "ms/image")
    cells = []
    for row in rows:
        if "error" in row:
            cells.append((row["backend"], row["device"], "-", f"not run: {row['error']}"))
        else:
            cells.append(
                (
                    row["backend"],
                    row["device"],
                    str(row["batch_size"]),
                    f"{row['images_per_s']:.3g}",
                    f"{row['regions_per_image']:.1f}",
                    f"{row['ms_per_image']:.0f}",
                )
            )
    timed = [c for c in cells if len(c) == len(header)]
    widths = [max([len(h)] + [len(c[k]) for c in timed]) for k, h in enumerate(header)]
    widths[:3] = [max([widths[k]] + [len(c[k]) for c in cells]) for k in range(3)]

    def line(values) -> str:
        first = [v.ljust(w) for v, w in zip(values[:2], widths[:2], strict=True)]
        if len(values) != len(header):  # a row that did not run: why, unaligned
            return " | ".join(first + [values[2], values[3]])
        return " | ".join(first + [v.rjust(w) for v, w in zip(values[2:], widths[2:], strict=True)])

    print(line(header))
    print("-+-".join("-" * w for w in widths))
    for c in cells:
        print(line(c))


def checked_backends(args) -> list[str]:
    """The backends to time, from ``--backend`` / ``--backends`` (default: every line of the table), after checking
    the run's flags.

    Raises:
        ValueError: both --backend and --backends, --weights with several backends, a count below its minimum,
            or a CUDA device where there is none (each in one line naming the flag).
    """
    if args.backend and args.backends:
        raise ValueError("--backend X is --backends X: give one of them")
    backends = [args.backend] if args.backend else list(dict.fromkeys(args.backends or DETECTOR_BACKENDS))
    if args.weights and len(backends) != 1:
        raise ValueError(f"--weights is one backend's file; name that backend alone with --backends (not {backends})")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    for device in args.device:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device {device}: no CUDA device here")
    if args.num_workers is not None and args.num_workers < 0:
        raise ValueError(f"--num-workers must be >= 0 (0: decode in the model's thread), got {args.num_workers}")
    if args.images is not None and args.images < 1:
        raise ValueError(f"--images must be >= 1, got {args.images}")
    return backends


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0; a backend that cannot run here is a row saying why). Errors in the flags propagate for
    :func:`vlbert.commands.run_tool` to report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--backends",
        nargs="+",
        choices=list(DETECTOR_BACKENDS),
        help=f"the backends to time, side by side (default: all, {' '.join(DETECTOR_BACKENDS)}); --backend X is "
        "--backends X",
    )
    add_detector_arguments(p, default_backend="all, as --backends")
    p.add_argument(
        "--images",
        type=flags.count,
        help="images per device (default: "
        + ", ".join(f"{n} on {d}" for d, n in DEFAULT_IMAGES.items())
        + ": raise it for steadier figures)",
    )
    p.add_argument("--sizes", nargs="+", metavar="WxH", help="image sizes, in turn (default: COCO's, 4:2:1:1)")
    p.add_argument("--batch-size", type=flags.count, default=8, help="the batched run's images per batch (default 8)")
    p.add_argument(
        "--device",
        nargs="+",
        type=flags.device,
        default=["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"],
        help="devices to time on (default: cpu, and cuda where there is a GPU)",
    )
    p.add_argument(
        "--num-workers",
        type=flags.count_or_zero,
        help="processes decoding the images (default: tools/extract_regions.py's, one less than the CPUs, at most 4)",
    )
    args = p.parse_args(argv)
    backends = checked_backends(args)
    sizes = [parse_size(size) for size in args.sizes] if args.sizes else None
    options = backend_options(args, backends)
    num_workers = default_num_workers() if args.num_workers is None else args.num_workers
    rows: list[dict] = []
    summaries: list[str] = []
    with tempfile.TemporaryDirectory() as tmp_name, torch.no_grad():
        tmp = Path(tmp_name)
        configs: dict[str, DetectorConfig | str] = {}
        for backend in backends:
            try:
                configs[backend] = benchmark_config(
                    backend, options[backend], args.weights, args.weights_sha256 or "", tmp
                )
            except NOT_RUN as e:
                configs[backend] = f"{type(e).__name__}: {e}".splitlines()[0]
        for device in args.device:
            count = args.images or DEFAULT_IMAGES["cuda" if device.startswith("cuda") else "cpu"]
            images = coco_like_images(count, sizes)
            sources = write_jpegs(images, tmp / f"images-{count}")
            common = {
                "device": device,
                "threads": torch.get_num_threads(),
                "num_workers": num_workers,
                "images": count,
                "input_sizes": size_counts(images),
            }
            summaries.append(
                f"{device}: {count} JPEG images of "
                + ", ".join(f"{size} x{n}" for size, n in common["input_sizes"].items())
                + f"; torch threads {common['threads']}; decoding workers {num_workers}"
            )
            for backend in backends:
                config = configs[backend]
                row = {"backend": backend, **common}
                if isinstance(config, str):
                    rows.append({**row, "error": config})
                    print(json.dumps(rows[-1]), flush=True)
                    continue
                try:
                    extractor = config.build(device)
                    time_extraction(extractor, sources[:1], 1, 0, device)  # warm-up
                    for batch_size in sorted({1, min(args.batch_size, count)}):  # a batch holds at most them all
                        seconds, regions = time_extraction(extractor, sources, batch_size, num_workers, device)
                        rows.append(
                            {
                                **row,
                                "detector": getattr(extractor, "name", backend),
                                "weights": weights_label(config, tmp),
                                "batch_size": batch_size,
                                "images_per_s": round(count / seconds, 3),
                                "ms_per_image": round(1000 * seconds / count, 1),
                                "regions_per_image": round(regions / count, 1),
                                "load_1min": round(os.getloadavg()[0], 2),
                            }
                        )
                        print(json.dumps(rows[-1]), flush=True)
                except NOT_RUN as e:
                    rows.append({**row, "error": f"{type(e).__name__}: {e}".splitlines()[0]})
                    print(json.dumps(rows[-1]), flush=True)
                finally:
                    extractor = None
                    gc.collect()
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
    print()
    print("\n".join(summaries))
    print_table(rows)
    return 0


__all__ = [
    "COCO_SIZES",
    "coco_like_images",
    "write_jpegs",
    "parse_size",
    "size_counts",
    "backend_options",
    "benchmark_config",
    "time_extraction",
    "print_table",
    "checked_backends",
    "main",
]
