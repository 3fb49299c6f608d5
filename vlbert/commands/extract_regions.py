"""Images -> region shards (webdataset tar, schema in detectors/shards.py), or precomputed features -> shards.

    vlbert extract --images skimage --output-dir runs/regions-photos --draw runs/photos.png
    vlbert extract --images my_photos/ --backend torchvision --weights frcnn.pth --output-dir out/
    vlbert extract --images coco/train2014 --backend butd \
        --weights faster_rcnn_from_caffe_attr.pkl --class-names objects_vocab.txt \
        --attribute-names attributes_vocab.txt --output-dir regions/coco-butd            # BUTD 10-100 boxes
    torchrun --nproc_per_node 8 -m vlbert extract ... --device cuda              # one shard set per process
    vlbert extract --from-tsv trainval_obj36.tsv --extracted-with butd-vg --output-dir out/
    vlbert extract --from-npz features_dir/ --extracted-with my-detector.yaml --output-dir out/

--images takes files, directories (the image files inside, of the endings vlbert.detectors.images.IMAGE_SUFFIXES: .jpg,
.png, .webp, .bmp, ...), "skimage" (the real photos shipped with scikit-image) or "easy-vqa". The detector flags are
made from the backends' table (detectors/backends.py): --backend chooses one, each backend option is a flag
(--architecture resnet50 --weights resnet50.safetensors for another timm backbone). --draw writes the first images
with their boxes (and top class) to one PNG. Images are decoded ahead of the model by --num-workers threads, and
images of equal size are batched together (up to --batch-size) over a window of 8 batches' images. Running the same
command again after a crash or kill skips the images already in complete shards, and repairs a shard damaged since
(cut off by a copy: set aside as .corrupt, its images extracted again); an image id the store holds from another
picture (a second folder's cat.jpg; each sample records its file's sha256) is refused (detectors/extract.py).

detector.json beside the shards says what made them: the detector's config with the sha256 of its weights file
(extraction), or for imported features the detector --extracted-with names (``butd-vg``: UNITER's and LXMERT's
bottom-up-attention features; or a YAML file of detector fields). An import that names none is of unknown origin,
and fine-tuning a published model that records its features refuses it (docs/regions.md).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from vlbert.commands.detector_flags import add_detector_arguments, detector_from_arguments
from vlbert.data.easy_vqa import image_paths
from vlbert.detectors.config import named_detector
from vlbert.detectors.extract import distributed_rank, extract_to_shards, pending_sources
from vlbert.detectors.images import IMAGE_SUFFIXES, is_image_file, read_pil_image
from vlbert.detectors.precomputed import read_butd_tsv, read_npz
from vlbert.detectors.shards import read_detector_info, read_shards, shard_paths, write_detector_info, write_shards

SKIMAGE_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "horse.png")


def image_sources(spec: list[str]) -> list[tuple[str, object]]:
    """(image id, path or array) pairs for the --images arguments."""
    out = []
    for item in spec:
        if item == "skimage":
            import skimage.data

            folder = Path(skimage.data.__file__).parent
            out += [(Path(name).stem, folder / name) for name in SKIMAGE_PHOTOS]
        elif item == "easy-vqa":
            out += [(i, p) for split in ("train", "test") for i, p in image_paths(split).items()]
        else:
            path = Path(item)
            if path.is_dir():
                # image id = the path under the directory without suffix ("000000391895", or "train/17" nested)
                out += [
                    (p.relative_to(path).with_suffix("").as_posix(), p)
                    for p in sorted(path.rglob("*"))
                    if is_image_file(p) and p.is_file()
                ]
            elif path.is_file():
                out.append((path.stem, path))
            else:
                raise FileNotFoundError(
                    f"--images {item}: no such file or directory; pass image files, directories or 'skimage'/'easy-vqa'"
                )
    if not out:
        raise ValueError("--images: no images found (endings " + ", ".join(IMAGE_SUFFIXES) + ")")
    return out


def draw(regions_and_images, path: Path, max_boxes: int = 8, label_fn=None) -> None:
    """Draw up to ``max_boxes`` boxes per image (highest scores, whole image excluded) side by side."""
    from PIL import Image, ImageDraw

    tiles = []
    for regions, image in regions_and_images:
        tile = image.convert("RGB").copy()
        pen = ImageDraw.Draw(tile)
        order = [
            i
            for i in regions.scores.argsort()[::-1]
            if not (regions.boxes[i] == [0, 0, regions.width, regions.height]).all()
        ][:max_boxes]
        for rank, i in enumerate(order):
            color = ("red", "lime", "blue", "yellow", "magenta", "cyan", "orange", "white")[rank % 8]
            x1, y1, x2, y2 = regions.boxes[i].tolist()
            pen.rectangle([x1, y1, x2, y2], outline=color, width=max(1, tile.width // 200))
            if label_fn is not None and regions.class_probs is not None:
                pen.text((x1 + 2, y1 + 2), label_fn(int(regions.class_probs[i].argmax())), fill=color)
        tile.thumbnail((400, 400))
        tiles.append(tile)
    canvas = Image.new("RGB", (sum(t.width for t in tiles), max(t.height for t in tiles)), "white")
    x = 0
    for t in tiles:
        canvas.paste(t, (x, 0))
        x += t.width
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)


def draw_first(args, extractor, info: dict, sources: dict) -> None:
    """Draw the first ``--draw-count`` images of the output shards with their boxes and top classes (the names
    ``detector.json`` records, else the extractor's ``label`` where it has one)."""
    from itertools import islice

    label_fn = getattr(extractor, "label", None)
    if info.get("class_names"):
        label_fn = info["class_names"].__getitem__
    drawn = []
    for r in islice(read_shards(shard_paths(args.output_dir)), args.draw_count):
        src = sources[r.image_id]
        drawn.append((r, read_pil_image(src)))
    draw(drawn, Path(args.draw), label_fn=label_fn)
    print(f"boxes drawn to {args.draw}")


def import_regions(args):
    """The Regions of ``--from-tsv`` (a bottom-up-attention TSV) or ``--from-npz`` (a directory of per-image .npz
    files, or one file), read lazily; the ``--extracted-with`` name is checked first, before anything is read.

    Raises:
        FileNotFoundError: no .npz file there. ValueError: an unknown ``--extracted-with``.
    """
    if args.extracted_with:
        named_detector(args.extracted_with)
    if args.from_tsv:
        return read_butd_tsv(args.from_tsv)

    source = Path(args.from_npz)
    files = [source] if source.is_file() else sorted(source.glob("*.npz"))
    if not files:
        raise FileNotFoundError(
            f"--from-npz {source}: no .npz file there; pass a directory of per-image .npz files or one .npz file"
        )
    return (read_npz(f) for f in files)


def record_import(args) -> None:
    """Write detector.json for imported features that ``--extracted-with`` names (the named detector's config
    and fingerprint); without it nothing is written: the features' origin stays unknown."""
    if not args.extracted_with:
        print(
            "the features' origin is unknown (no --extracted-with): fine-tuning a published model that records "
            "its features refuses them"
        )
        return
    from dataclasses import asdict

    detector = named_detector(args.extracted_with)
    write_detector_info(
        args.output_dir,
        {
            "detector": f"imported:{args.extracted_with}",
            "fingerprint": detector.fingerprint(),
            "config": asdict(detector),
            "extracted_with": args.extracted_with,
            "imported_from": str(args.from_tsv or args.from_npz),
        },
    )


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Errors propagate for :func:`vlbert.commands.run_tool` to report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", nargs="+", help="files, directories, 'skimage' or 'easy-vqa'")
    source.add_argument("--from-tsv", help="a bottom-up-attention TSV file (BUTD or LXMERT columns)")
    source.add_argument("--from-npz", help="a directory of per-image .npz files")
    p.add_argument(
        "--extracted-with",
        help="--from-tsv/--from-npz: the detector that made the features, a name "
        "(butd-vg) or a YAML file of detector fields; recorded in detector.json",
    )
    p.add_argument("--output-dir", required=True, help="where the shards go")
    add_detector_arguments(p)
    p.add_argument("--batch-size", type=int, default=8, help="images per forward pass (equal sizes only)")
    p.add_argument(
        "--num-workers",
        type=int,
        help="threads decoding images ahead of the model (default: one less than this process's share of the "
        "CPUs, at most 4; 0: decode in the model's thread, between forward passes)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--draw", help="PNG to draw the first images' boxes into")
    p.add_argument("--draw-count", type=int, default=4)
    p.add_argument("--samples-per-shard", type=int, default=1000)
    args = p.parse_args(argv)

    from tqdm.auto import tqdm

    if args.extracted_with and not (args.from_tsv or args.from_npz):
        raise ValueError(
            "--extracted-with says what made imported features (--from-tsv / --from-npz); extraction "
            "from --images records its own detector"
        )
    if args.from_tsv or args.from_npz:
        shards = write_shards(
            tqdm(import_regions(args), desc="import"), args.output_dir, max_samples_per_shard=args.samples_per_shard
        )
        record_import(args)
    else:
        from dataclasses import asdict

        rank, world = distributed_rank()
        detector = detector_from_arguments(args).identified()  # the weights' sha256 identifies the features
        device = args.device
        if device == "cuda" and world > 1:
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        sources = image_sources(args.images)
        record = {"fingerprint": detector.fingerprint(), "config": asdict(detector)}
        extractor, shards = None, []
        # the store's checks first (another detector, another picture under an id, a damaged shard set aside):
        # a refusal, or a rerun with nothing left to extract, loads no weights
        if read_detector_info(args.output_dir) is None or pending_sources(
            sources, args.output_dir, record, rank, world
        ):
            extractor = detector.build(device)
            info = {
                "detector": extractor.name,
                **record,
                **(
                    {k: v for k, v in extractor.metadata().items() if k != "detector"}
                    if hasattr(extractor, "metadata")
                    else {}
                ),
            }
            shards = extract_to_shards(
                extractor,
                sources,
                args.output_dir,
                info,
                rank,
                world,
                args.batch_size,
                args.samples_per_shard,
                num_workers=args.num_workers,
            )
        if args.draw and rank == 0:
            draw_first(args, extractor, read_detector_info(args.output_dir) or {}, dict(sources))
    print(f"wrote {len(shards)} shard(s) to {args.output_dir}")
    return 0
