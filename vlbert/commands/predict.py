"""Answer with a trained run about image files: one example from flags, or many from a JSONL file.

    vlbert predict runs/vqa --image photo.png --text "what color is the shape?" --top-k 3
    vlbert predict runs/vqa --input questions.jsonl --output results.json --format vqa-v2
    vlbert predict runs/lxmert-gqa --input testdev.jsonl --output testdev_predict.json --format gqa
    vlbert predict runs/nlvr2 --image left.png --image2 right.png --text "both images show a circle"
    vlbert predict runs/nlvr2 --input dev.jsonl --output predictions.csv --format nlvr2
    vlbert predict runs/snli-ve --image photo.png --text "there is a red circle"
    vlbert predict runs/refcoco --image photo.png --text "the blue triangle" --draw boxed.png
    vlbert predict runs/retrieval --index photos.index --images photos/ --text "a red circle" --top-k 5
    vlbert predict runs/retrieval --image photo.png --captions captions.txt --top-k 5
    vlbert predict runs/vl-default --image photo.png --text "a [MASK] circle"
    vlbert predict models/uniter-base --task image-text-matching --image photo.png --text "a red circle"
    vlbert predict models/uniter-base --task image-text-matching --image photo.png --captions captions.txt

    vlbert predict runs/bbc-news --text "Shares rose sharply after the results"
    vlbert predict runs/text-default --text "the capital of france is [MASK]."

The run directory's task (its saved processor, processor.json) picks the pipeline (vlbert.inference.PIPELINES), or --task names
another one the run answers (image-text-matching: a VL pretraining or retrieval run scores (image, caption)
pairs, or ranks --captions for an image); the pipeline says what is read and written: this tool knows no task by
name. --text is the question (VQA), hypothesis
(SNLI-VE), statement (NLVR2), expression (RefCOCO), query (retrieval), text to classify, or text with [MASK]
(pretraining runs); --image the image (NLVR2: the left one, --image2 the right). JSONL lines carry the pipeline's
input fields by name (``image``, ``left``/``right``, ``text`` or the benchmark's name for it: ``question``,
``hypothesis``/``sentence2``, ``sentence``, ``expression``), the benchmark's id (``question_id``, ``pairID``,
``identifier``, ``ref_id``, or ``id``) and, for referring runs trained on given boxes, ``boxes`` ([[x1, y1, x2,
y2], ...] pixels); relative image paths are read from the JSONL file's folder.

Formats: ``jsonl`` (default: one object per example, the input's id and fields plus the prediction) and the
pipeline's own: ``vqa-v2`` (the VQA v2 evaluation server's results JSON: ``[{"question_id", "answer"}]``, every
line needs a question_id), ``gqa`` (the GQA challenge's submission JSON: ``[{"questionId", "prediction"}]``, ids
as strings) and ``nlvr2`` (the NLVR2 evaluation script's CSV: ``identifier,True|False`` per line).
SNLI-VE defines no results format: use jsonl (``pairID`` + ``prediction``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vlbert.commands import flag_types as flags
from vlbert.common.files import write_text_atomically
from vlbert.data.grounded_text import jsonl_records
from vlbert.inference import PIPELINES, pipeline_class

#: the flags passed to a pipeline's predict_records (its parameters and tool_options say which it reads).
OPTIONS = ("top_k", "draw", "images", "index", "captions")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a run's output directory (config.json, model.safetensors, processor.json)")
    p.add_argument(
        "--task",
        help="a pipeline task other than the run's own (image-text-matching for VL "
        "pretraining and retrieval runs); default: the run's task",
    )
    p.add_argument("--image", help="an image file (NLVR2: the left image)")
    p.add_argument("--image2", help="NLVR2: the right image file")
    p.add_argument("--text", "--question", dest="text", help="the question / hypothesis / statement / expression")
    p.add_argument("--input", help="a JSONL file of examples (see above) instead of --image/--text")
    p.add_argument(
        "--output",
        help="where to write the predictions (default: standard output); an existing file "
        "is replaced only when the whole output is ready",
    )
    p.add_argument("--format", default="jsonl", help="jsonl, or a format of the run's pipeline (vqa-v2, gqa, nlvr2)")
    p.add_argument(
        "--top-k", type=int, help="answers (VQA), images / captions (retrieval), fillers (default: the pipeline's)"
    )
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", type=flags.device, help="cpu, cuda, ... (default: CUDA when available)")
    p.add_argument(
        "--allow-other-detector",
        action="store_true",
        help="accept regions of another detector than the run's (predictions silently degrade)",
    )
    p.add_argument(
        "--detector-weights",
        help="where the run's detector's weights file is on this machine (e.g. a "
        "converted UNITER's faster_rcnn_from_caffe_attr.pkl), checked against "
        "the sha256 the run records",
    )
    p.add_argument("--draw", help="referring expressions: save the image with the chosen box drawn here (one example)")
    p.add_argument("--images", help="retrieval: a folder of images to index (with --index: built once, then reused)")
    p.add_argument("--index", help="retrieval: an index directory (written from --images if absent)")
    p.add_argument(
        "--captions",
        help="retrieval, image-text-matching: a text file of candidate captions, one per line (image -> text)",
    )
    return p


def read_examples(args, pipeline_class) -> list[dict]:
    """The examples from --input (JSONL) or from the flags, as the pipeline's inputs
    (:meth:`~vlbert.inference.base.Pipeline.read_record`).

    Raises:
        ValueError: no example given, a line that is not a JSON object or lacks an input the task needs.
    """
    if args.input:
        examples = []
        for where, record in jsonl_records(args.input, "--input"):
            if not isinstance(record, dict):
                raise ValueError(f"{where}: not a JSON object; write one object per line")
            examples.append(pipeline_class.read_record(record, where, Path(args.input).parent))
        if not examples:
            raise ValueError(f"{args.input} holds no examples")
        return examples
    record = {k: v for k, v in (("image", args.image), ("image2", args.image2), ("text", args.text)) if v is not None}
    return [pipeline_class.read_record(record, "the command line", Path.cwd())]


def refuse_unread_images(args, pipeline_class) -> None:
    """Refuse ``--image`` / ``--image2`` / ``--detector-weights`` where the run's pipeline reads no such image (a
    text run reads none; VQA reads one), instead of answering without it.

    Raises:
        ValueError: the flag named, with the task and what it reads.
    """
    read = {alias for aliases in pipeline_class.input_fields.values() for alias in aliases}
    unread = [f"--{key}" for key in ("image", "image2") if getattr(args, key) is not None and key not in read]
    if args.detector_weights and not pipeline_class.image_fields:
        unread.append("--detector-weights")
    if unread:
        what = "reads no images" if not pipeline_class.image_fields else "reads one image (--image)"
        raise ValueError(f"{unread[0]} is not used: this {pipeline_class.name} run {what}; leave it out")


def tool_options(args, pipeline_class) -> dict:
    """The flags of :data:`OPTIONS` that were given, checked against what the pipeline reads.

    Raises:
        ValueError: a flag the run's task does not use (named, with the task).
    """
    given = {k: getattr(args, k) for k in OPTIONS if getattr(args, k) is not None}
    unused = [k for k in given if k not in pipeline_class.parameters and k not in pipeline_class.tool_options]
    if unused:
        raise ValueError(f"--{unused[0].replace('_', '-')} is not used by {pipeline_class.name} runs; leave it out")
    return given


def rows(examples: list[dict], predictions: list[dict], pipeline_class) -> list[dict]:
    """One output row per example: its id (when given), its text and image-path inputs, and the prediction."""
    out = []
    for example, prediction in zip(examples, predictions, strict=True):
        key = next((k for k in (pipeline_class.id_field, "id") if k in example), None)
        identity = {key: example[key]} if key else {}
        inputs = {k: v for k, v in example.items() if k in pipeline_class.input_fields and isinstance(v, str)}
        out.append({**identity, **inputs, **prediction})
    return out


def render(rows: list[dict], pipeline_class, fmt: str) -> str:
    """The output file's text in ``fmt``: jsonl, or one of the pipeline's :attr:`formats`.

    Raises:
        ValueError: a format of another task's pipeline, or none's; a row the format cannot write.
    """
    import json

    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in rows)
    if fmt not in pipeline_class.formats:
        owners = sorted(t for t, cls in PIPELINES.items() if fmt in cls.formats)
        known = ", ".join(["jsonl", *pipeline_class.formats])
        where = f"is for {' and '.join(owners)} runs" if owners else "is not a known format"
        raise ValueError(f"--format {fmt} {where}; this run is {pipeline_class.name!r}: use --format {known}")
    return pipeline_class.formats[fmt](rows)


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Errors propagate for :func:`vlbert.commands.run_tool` to report."""
    args = parser().parse_args(argv)
    for flag, value in (("--top-k", args.top_k), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")

    cls = pipeline_class(args.run, args.task)
    render([], cls, args.format)  # an unknown format: the one-line error before the model loads
    refuse_unread_images(args, cls)
    examples = read_examples(args, cls)
    options = tool_options(args, cls)
    pipe = cls(
        args.run,
        device=args.device,
        allow_other_detector=args.allow_other_detector,
        batch_size=args.batch_size,
        **({"detector_weights": args.detector_weights} if args.detector_weights else {}),
    )
    text = render(rows(examples, pipe.predict_records(examples, **options), cls), cls, args.format)
    if args.output:
        write_text_atomically(args.output, text)
    else:
        sys.stdout.write(text)
    return 0
