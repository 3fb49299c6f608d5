"""Image-caption files in the formats the public datasets ship, read into :class:`CaptionedImage` records.

* COCO captions JSON (``annotations/captions_train2014.json``): ``images`` [{id, file_name, ...}] and
  ``annotations`` [{image_id, caption}] (Chen et al. 2015);
* the Karpathy split JSON (``dataset_coco.json``, ``dataset_flickr30k.json``): ``images`` [{split, filename, cocoid,
  sentences [{raw}]}] (Karpathy & Fei-Fei 2015), read by pretraining and retrieval alike;
* Conceptual-Captions-style TSV: one ``caption<TAB>image key`` per line (Sharma et al. 2018), no header;
* JSON lines ``{"image_id": ..., "caption": ...}`` (e.g. Visual Genome region descriptions or SBU converted);
* a Hugging Face ``datasets`` name (online), with its image-id and caption columns;
* LXMERT's pretraining JSON (``data/lxmert/mscoco_train.json``, ``vgnococo.json``, ...; airsplay/lxmert@077c596
  ``src/pretrain/lxmert_data.py``): ``[{"img_id", "sentf": {source: [sentence]}, "labelf": {source: [{answer:
  score}]}}]``, where the sentences of a source with ``labelf`` are questions (VQA, GQA, VG-QA) with their answers.

Each reader maps the file's own image identifier to the id under which the region shards hold the image with
``image_id_format``, a ``str.format`` template over the record's fields (COCO: ``image_id``, ``file_name`` and its
``stem``; e.g. ``"COCO_train2014_{image_id:012d}"`` for LXMERT's TSV features, ``"{image_id}"`` for ids as written).
"""

from __future__ import annotations

import csv
import os
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from vlbert.common.user_files import read_json, read_jsonl

CAPTION_FORMATS = ("coco", "karpathy", "tsv", "jsonl", "hf", "lxmert")


@dataclass(frozen=True)
class CaptionedImage:
    """An image and its captions. ``group``: images of the same group are interchangeable for their captions
    (e.g. easy-VQA's "a blue circle" fits every blue circle); by default each image is its own group.
    ``answers``: empty (no caption is a question), or one entry per caption: a question's answers with their
    scores, ``((answer, score), ...)`` (answers normalised by :func:`lxmert_answer`), ``()`` for a caption."""

    image_id: str
    captions: tuple[str, ...]
    group: str = ""
    answers: tuple[tuple[tuple[str, float], ...], ...] = ()


def _format_id(template: str, fields: dict, where: str) -> str:
    try:
        return template.format(**fields)
    except (KeyError, ValueError, IndexError) as e:
        raise ValueError(
            f"{where}: image_id_format {template!r} does not fit the record's fields "
            f"{sorted(fields)} ({type(e).__name__}: {e})"
        ) from e


def _read_json(path: str | os.PathLike) -> dict:
    return read_json(path, "caption file")


def _grouped(pairs: list[tuple[str, str]], where: str) -> list[CaptionedImage]:
    by_image: dict[str, list[str]] = defaultdict(list)
    for image_id, caption in pairs:
        if caption.strip():
            by_image[image_id].append(caption.strip())
    if not by_image:
        raise ValueError(f"{where} holds no caption")
    return [CaptionedImage(i, tuple(c)) for i, c in by_image.items()]


def load_coco_captions(path: str | os.PathLike, image_id_format: str = "{image_id}") -> list[CaptionedImage]:
    """COCO captions JSON -> one record per image with all its captions.

    Raises:
        FileNotFoundError: no such file. ValueError: not JSON, no ``annotations`` list, an annotation without
            ``image_id``/``caption``, or an ``image_id_format`` the fields do not fill.
    """
    data = _read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
        raise ValueError(f"{path} has no 'annotations' list; is it a COCO captions file (captions_*.json)?")
    files = {img["id"]: img.get("file_name", "") for img in data.get("images", []) if "id" in img}
    pairs = []
    for n, ann in enumerate(data["annotations"]):
        if "image_id" not in ann or "caption" not in ann:
            raise ValueError(f"{path}: annotation {n} lacks 'image_id' or 'caption': {ann}")
        name = files.get(ann["image_id"], "")
        fields = {"image_id": ann["image_id"], "file_name": name, "stem": Path(name).stem}
        pairs.append((_format_id(image_id_format, fields, f"{path}: annotation {n}"), str(ann["caption"])))
    return _grouped(pairs, str(path))


def load_karpathy_split(
    path: str | os.PathLike, split: str, image_id_format: str = "{filename}"
) -> list[CaptionedImage]:
    """Read Karpathy & Fei-Fei's ``dataset_coco.json`` / ``dataset_flickr30k.json``.

    Args:
        split: "train" (COCO's "restval" included), "val" or "test".
        image_id_format: the shard image id from the record's fields, e.g. ``"{cocoid}"`` or ``"{filename}"``.
    Raises:
        ValueError: the file lacks ``images`` or the split is empty.
    """
    data = _read_json(path)
    if not isinstance(data, dict) or "images" not in data:
        raise ValueError(f"{path} has no 'images' list; is it a Karpathy-split caption file?")
    wanted = {"train", "restval"} if split == "train" else {split}
    out = [
        CaptionedImage(
            _format_id(image_id_format, {k: v for k, v in img.items() if k != "sentences"}, str(path)),
            tuple(s["raw"] for s in img["sentences"]),
        )
        for img in data["images"]
        if img.get("split") in wanted
    ]
    if not out:
        raise ValueError(f"{path} has no images in split {split!r}")
    return out


def load_caption_tsv(path: str | os.PathLike, image_id_format: str = "{key}") -> list[CaptionedImage]:
    """Conceptual-Captions-style TSV: ``caption<TAB>image key`` per line (fields ``key``, ``stem`` of the key).

    Raises:
        FileNotFoundError: no such file. ValueError: a line without exactly two columns (the message names it).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"caption file {path} does not exist")
    csv.field_size_limit(sys.maxsize)
    pairs = []
    with open(path, newline="", encoding="utf-8") as f:
        for line_no, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), start=1):
            if not row:
                continue
            if len(row) != 2:
                raise ValueError(f"{path}:{line_no}: {len(row)} columns; a caption TSV has 2: caption<TAB>image key")
            caption, key = row
            pairs.append(
                (_format_id(image_id_format, {"key": key, "stem": Path(key).stem}, f"{path}:{line_no}"), caption)
            )
    return _grouped(pairs, str(path))


def load_caption_jsonl(
    path: str | os.PathLike,
    image_id_format: str = "{image_id}",
    image_field: str = "image_id",
    caption_field: str = "caption",
) -> list[CaptionedImage]:
    """JSON lines, one ``{"image_id": ..., "caption": ...}`` per line (other fields usable in the id format).

    Raises:
        FileNotFoundError: no such file. ValueError: a line that is not a JSON object or lacks a field.
    """
    pairs = []
    for where, record in read_jsonl(path, "caption file"):
        if not isinstance(record, dict) or image_field not in record or caption_field not in record:
            raise ValueError(
                f"{where}: needs {image_field!r} and {caption_field!r}; got "
                f"{sorted(record) if isinstance(record, dict) else type(record).__name__}"
            )
        pairs.append((_format_id(image_id_format, record, where), str(record[caption_field])))
    return _grouped(pairs, str(path))


def load_hf_captions(
    name: str,
    split: str = "train",
    image_id_format: str = "{image_id}",
    image_field: str = "image_id",
    caption_field: str = "caption",
) -> list[CaptionedImage]:
    """A ``datasets`` hub dataset (online) with an image-id and a caption column (only those are read).

    Raises:
        ValueError: the columns are missing. Errors of ``datasets.load_dataset`` (offline: a connection error).
    """
    import datasets

    ds = datasets.load_dataset(name, split=split)
    missing = [c for c in (image_field, caption_field) if c not in ds.column_names]
    if missing:
        raise ValueError(f"dataset {name} has no column(s) {missing}; its columns are {ds.column_names}")
    ds = ds.select_columns([image_field, caption_field])
    pairs = [
        (
            _format_id(image_id_format, {"image_id": r[image_field], image_field: r[image_field]}, name),
            str(r[caption_field]),
        )
        for r in ds
    ]
    return _grouped(pairs, name)


#: LXMERT's answer rewrites (airsplay/lxmert@077c596 ``src/pretrain/qa_answer_table.py``, ``AnswerTable``).
_ANSWER_REWRITES = {
    "a man": "man",
    "the man": "man",
    "a woman": "woman",
    "the woman": "woman",
    "grey": "gray",
    **{w: str(n) for n, w in enumerate("one two three four five six seven eight nine ten".split(), 1)},
}


def lxmert_answer(answer: str) -> str:
    """An answer in the form LXMERT's answer table compares (``AnswerTable.convert_ans`` at 077c596): lower case,
    one trailing period dropped, a leading article ("a ", "an ", "the ") dropped, number words as digits,
    "grey" as "gray"."""
    answer = answer.lower()
    if answer.endswith("."):
        answer = answer[:-1].strip()
    for article in ("a ", "an ", "the "):
        if answer.startswith(article):
            answer = answer[len(article) :].strip()
    return _ANSWER_REWRITES.get(answer, answer)


def load_lxmert_json(path: str | os.PathLike, image_id_format: str = "{img_id}") -> list[CaptionedImage]:
    """LXMERT's pretraining JSON -> one record per image with all its sentences; the sentences of a source that
    has ``labelf`` are questions, each with its answers (``{answer: score}``, normalised by :func:`lxmert_answer`;
    two answers of one form keep the later score, as LXMERT's table does). Id fields: the record's own
    (``img_id``, e.g. ``"COCO_train2014_000000000009"``, the id of LXMERT's ``*_obj36.tsv`` features).

    Raises:
        FileNotFoundError: no such file. ValueError: not a JSON list, a record without ``img_id`` or a ``sentf``
            object, a ``labelf`` list whose length is not its sentence list's, or no sentence at all.
    """
    data = _read_json(path)
    if not isinstance(data, list):
        raise ValueError(
            f"{path} is not a list of image records; an LXMERT pretraining file "
            '(data/lxmert/mscoco_train.json) holds [{"img_id", "sentf", "labelf"}, ...]'
        )
    out = []
    for n, record in enumerate(data):
        where = f"{path}: record {n}"
        if not isinstance(record, dict) or "img_id" not in record or not isinstance(record.get("sentf"), dict):
            raise ValueError(
                f"{where} needs 'img_id' and 'sentf' (sentences by source), got "
                f"{sorted(record) if isinstance(record, dict) else type(record).__name__}"
            )
        labelf = record.get("labelf") or {}
        captions, answers = [], []
        for source, sentences in record["sentf"].items():
            labels = labelf.get(source)
            if labels is not None and (not isinstance(labels, list) or len(labels) != len(sentences)):
                raise ValueError(
                    f"{where}: labelf[{source!r}] must hold one {{answer: score}} per sentence of "
                    f"sentf[{source!r}] ({len(sentences)})"
                )
            for k, sentence in enumerate(sentences):
                if str(sentence).strip():
                    captions.append(str(sentence).strip())
                    scored = {lxmert_answer(str(a)): float(v) for a, v in (labels[k] if labels else {}).items()}
                    answers.append(tuple(scored.items()))
        if captions:
            fields = {k: v for k, v in record.items() if k not in ("sentf", "labelf")}
            out.append(
                CaptionedImage(_format_id(image_id_format, fields, where), tuple(captions), answers=tuple(answers))
            )
    if not out:
        raise ValueError(f"{path} holds no sentence")
    return out


__all__ = [
    "CaptionedImage",
    "CAPTION_FORMATS",
    "lxmert_answer",
    "load_lxmert_json",
    "load_coco_captions",
    "load_karpathy_split",
    "load_caption_tsv",
    "load_caption_jsonl",
    "load_hf_captions",
]
