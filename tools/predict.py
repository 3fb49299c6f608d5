#!/usr/bin/env python
"""Answer with a trained run about image files: one example from flags, or many from a JSONL file.

    python tools/predict.py runs/vqa --image photo.png --text "what color is the shape?" --top-k 3
    python tools/predict.py runs/vqa --input questions.jsonl --output results.json --format vqa-v2
    python tools/predict.py runs/nlvr2 --image left.png --image2 right.png --text "both images show a circle"
    python tools/predict.py runs/nlvr2 --input dev.jsonl --output predictions.csv --format nlvr2
    python tools/predict.py runs/snli-ve --image photo.png --text "there is a red circle"
    python tools/predict.py runs/refcoco --image photo.png --text "the blue triangle" --draw boxed.png
    python tools/predict.py runs/retrieval --index photos.index --images photos/ --text "a red circle" --top-k 5
    python tools/predict.py runs/retrieval --image photo.png --captions captions.txt --top-k 5
    python tools/predict.py runs/vl-default --image photo.png --text "a [MASK] circle"

The run directory's task (its inference.json) decides what is predicted. --text is the question (VQA), hypothesis
(SNLI-VE), statement (NLVR2), expression (RefCOCO), query (retrieval) or text with [MASK] (a VL-pretraining run).
JSONL lines carry the same fields by name: ``image`` (``left``/``right`` for NLVR2), ``text`` (or ``question``,
``hypothesis``/``sentence2``, ``sentence``, ``expression``), an id (``question_id``, ``pairID``, ``identifier``,
``ref_id``, or ``id``) and, for referring runs trained on given boxes, ``boxes`` ([[x1, y1, x2, y2], ...] pixels);
relative image paths are read from the JSONL file's folder.

Formats: ``jsonl`` (default: one object per example, the input's id and fields plus the prediction),
``vqa-v2`` (the VQA v2 evaluation server's results JSON: ``[{"question_id", "answer"}]``, every line needs a
question_id) and ``nlvr2`` (the NLVR2 evaluation script's CSV: ``identifier,True|False`` per line). SNLI-VE defines
no results format: use jsonl (``pairID`` + ``prediction``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TEXT_FIELDS = ("text", "question", "hypothesis", "sentence2", "sentence", "statement", "expression", "query")
ID_FIELDS = {"vqa": "question_id", "snli-ve": "pairID", "nlvr2": "identifier", "refcoco": "ref_id",
             "retrieval": "id", "vl-pretraining": "id"}
FORMATS = {"jsonl": None, "vqa-v2": "vqa", "nlvr2": "nlvr2"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a run's output directory (config.json, model.safetensors, inference.json)")
    p.add_argument("--image", help="an image file (NLVR2: the left image)")
    p.add_argument("--image2", help="NLVR2: the right image file")
    p.add_argument("--text", "--question", dest="text", help="the question / hypothesis / statement / expression")
    p.add_argument("--input", help="a JSONL file of examples (see above) instead of --image/--text")
    p.add_argument("--output", help="where to write the predictions (default: standard output); an existing file "
                                    "is replaced only when the whole output is ready")
    p.add_argument("--format", choices=tuple(FORMATS), default="jsonl")
    p.add_argument("--top-k", type=int, default=1, help="answers (VQA), images / captions (retrieval), fillers")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", help="cpu, cuda, ... (default: CUDA when available)")
    p.add_argument("--allow-other-detector", action="store_true",
                   help="accept regions of another detector than the run's (predictions silently degrade)")
    p.add_argument("--draw", help="referring expressions: save the image with the chosen box drawn here (one "
                                  "example)")
    p.add_argument("--images", help="retrieval: a folder of images to index (with --index: built once, then reused)")
    p.add_argument("--index", help="retrieval: an index directory (written from --images if absent)")
    p.add_argument("--captions", help="retrieval: a text file of candidate captions, one per line (image -> text)")
    return p


def read_examples(args, task: str) -> list[dict]:
    """The examples from --input (JSONL) or from the flags, with image paths resolved.

    Raises:
        ValueError: no example given, a line that is not a JSON object or lacks a field the task needs.
    """
    if args.input:
        from vlbert.data.grounded_text import jsonl_records

        examples = []
        for where, record in jsonl_records(args.input, "--input"):
            if not isinstance(record, dict):
                raise ValueError(f"{where}: not a JSON object; write one object per line")
            examples.append(_normalise(record, task, where, Path(args.input).parent))
        if not examples:
            raise ValueError(f"{args.input} holds no examples")
        return examples
    if task == "retrieval" and args.text is None and args.image is None:
        raise ValueError("pass --text (text -> images, with --images/--index) or --image with --captions, or --input")
    record = {"image": args.image, "text": args.text}
    if task == "nlvr2":
        record = {"left": args.image, "right": args.image2, "text": args.text}
    return [_normalise({k: v for k, v in record.items() if v is not None}, task, "the command line", Path.cwd())]


def _normalise(record: dict, task: str, where: str, base: Path) -> dict:
    text = next((record[k] for k in TEXT_FIELDS if k in record), None)
    images = ("left", "right") if task == "nlvr2" else ("image",)
    needs_image = task not in ("retrieval", "vl-pretraining")
    missing = [k for k in images if needs_image and not record.get(k)]
    if task == "retrieval" and not (record.get("image") or text):
        missing.append("image or text")
    if text is None and task not in ("retrieval",):
        missing.append("text")
    if missing:
        flags = {"image": "--image", "left": "--image", "right": "--image2", "text": "--text"}
        raise ValueError(f"{where}: a {task} example needs {', '.join(missing)} (flags: "
                         f"{', '.join(flags.get(m, '--' + m) for m in missing)})")
    out = dict(record)
    out["text"] = text
    for k in ("image", "left", "right"):
        if record.get(k):
            path = Path(record[k]).expanduser()
            out[k] = str(path if path.is_absolute() else base / path)
    return out


def predict(pipe, task: str, examples: list[dict], args) -> list[dict]:
    """One output row per example: its id (when given), its input fields and the prediction."""
    def rows(predictions):
        return [{**_identity(ex, task), **p} for ex, p in zip(examples, predictions)]

    texts = [ex["text"] for ex in examples]
    if task == "vqa":
        answers = pipe([ex["image"] for ex in examples], texts, top_k=args.top_k)
        return rows([{"answer": a[0]["answer"], "score": a[0]["score"], "answers": a} for a in answers])
    if task == "snli-ve":
        return rows(_labels(pipe([ex["image"] for ex in examples], texts)))
    if task == "nlvr2":
        return rows(_labels(pipe([ex["left"] for ex in examples], [ex["right"] for ex in examples], texts)))
    if task == "refcoco":
        boxes = [ex.get("boxes") for ex in examples]
        results = pipe([ex["image"] for ex in examples], texts, boxes=boxes if any(b is not None for b in boxes)
                       else None)
        if args.draw:
            if len(examples) != 1:
                raise ValueError("--draw takes one example (--image/--text); leave it out with --input")
            pipe.draw(examples[0]["image"], results[0]).save(args.draw)
        return rows(results)
    if task == "retrieval":
        indexes: dict = {}
        return rows([_retrieve(pipe, ex, args, indexes) for ex in examples])
    return rows([{"fillers": pipe(ex.get("image"), ex["text"], top_k=args.top_k)} for ex in examples])


def _labels(results: list[dict]) -> list[dict]:
    return [{"prediction": r["label"], "score": r["score"], "scores": r["scores"]} for r in results]


def _identity(example: dict, task: str) -> dict:
    key = ID_FIELDS[task]
    out = {key: example[key]} if key in example else ({"id": example["id"]} if "id" in example else {})
    return {**out, **{k: example[k] for k in ("image", "left", "right", "text") if example.get(k)}}


def _retrieve(pipe, example: dict, args, indexes: dict) -> dict:
    from vlbert.inference import ImageIndex

    if example.get("text") and not example.get("image"):
        if "index" not in indexes:
            if args.index and Path(args.index, "index.json").is_file():
                indexes["index"] = ImageIndex.load(args.index)
            elif args.images:
                indexes["index"] = pipe.index_images(args.images)
                if args.index:
                    indexes["index"].save(args.index)
            else:
                raise ValueError("text -> images needs --images FOLDER (indexed on the fly) or --index DIR (an "
                                 "index saved before, or where to save the one built from --images)")
        return {"images": pipe.search(example["text"], indexes["index"], top_k=args.top_k)}
    if not args.captions:
        raise ValueError("image -> text needs --captions FILE (candidate captions, one per line)")
    captions = [line.strip() for line in Path(args.captions).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not captions:
        raise ValueError(f"{args.captions} holds no captions")
    return {"captions": pipe.captions(example["image"], captions, top_k=args.top_k)}


def render(rows: list[dict], task: str, fmt: str) -> str:
    """The output file's text in ``fmt``.

    Raises:
        ValueError: a benchmark format for another task, or an example without the id the format needs.
    """
    if FORMATS[fmt] is not None and FORMATS[fmt] != task:
        raise ValueError(f"--format {fmt} is for {FORMATS[fmt]} runs; this run is {task!r}: use --format jsonl")
    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in rows)
    key = ID_FIELDS[task]
    missing = [k for k, r in enumerate(rows, 1) if key not in r]
    if missing:
        raise ValueError(f"--format {fmt} needs a {key} on every example; example {missing[0]} has none")
    if fmt == "vqa-v2":
        return json.dumps([{"question_id": _int_if_digits(r[key]), "answer": r["answer"]} for r in rows])
    return "".join(f"{r[key]},{r['prediction']}\n" for r in rows)


def _int_if_digits(value):
    return int(value) if isinstance(value, str) and value.isdigit() else value


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    for flag, value in (("--top-k", args.top_k), ("--batch-size", args.batch_size)):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    from vlbert.inference import pipeline, read_inference_info
    from vlbert_base.files import write_text_atomically

    task = read_inference_info(args.run)["task"]
    if FORMATS[args.format] is not None and FORMATS[args.format] != task:
        render([], task, args.format)  # raises the one-line error before the model loads
    examples = read_examples(args, task)
    pipe = pipeline(args.run, device=args.device, allow_other_detector=args.allow_other_detector,
                    batch_size=args.batch_size)
    text = render(predict(pipe, task, examples, args), task, args.format)
    if args.output:
        write_text_atomically(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    from vlbert.command_line import run_tool

    sys.exit(run_tool(main))
