"""Text fine-tuning data: task records from BBC News, GLUE (``datasets``' glue layout), local CSV/JSON/JSONL/Parquet
files, ``save_to_disk`` directories or ``datasets`` names, encoded for the heads of :mod:`vlbert.models.heads`.

Task types (BERT section 4): ``classification`` (one text, or a pair with ``text_pair_field``), ``regression``,
``tagging`` (pre-split words with one tag each; the tag goes on the word's first wordpiece, -100 on the others,
as BERT section 5.3), ``qa`` (SQuAD format: question, context, answers {"text": [...], "answer_start": [...]}).

Tagging and span QA read every word of the evaluation set: a sentence (a context) longer than one window is cut
into overlapping windows of ``max_seq_length`` wordpieces, ``doc_stride`` wordpieces apart (:func:`window_spans`,
Google BERT ``run_squad.py``'s doc spans), and each word (context wordpiece) is read from the window where it has
the most context (:func:`max_context_window`, ``run_squad.py``'s ``_check_is_max_context``; BERT section 4.2 / 5.3
window their inputs the same way). A word with no wordpiece at all (a soft hyphen U+00AD, a zero-width space, an
empty string: BERT's tokenizer removes them as control / format characters) gets no prediction from the model and
is tagged "O" (outside any entity), the tag conlleval assumes for a word outside every chunk; its gold tag is kept,
so an entity on it counts as missed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Sequence

import torch

from vlbert.common.typed_config import Range
from vlbert.common.user_files import UserFileError, expect
from vlbert.data.corpus import BBC_CLASSES, load_bbc_news, train_eval_split
from vlbert.layers.losses import IGNORE_INDEX
from vlbert.layers.unpadded import unpadded_layout

TASK_TYPES = ("classification", "regression", "tagging", "qa")

#: The tag of a word without a wordpiece (no window can predict it): conlleval's outside tag.
OUTSIDE_TAG = "O"


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task in ``datasets``' glue layout (huggingface/datasets@02bb18c7f9899b206983480b14bc1accf69714a5
    ``datasets/glue/glue.py``): its text columns (one, or a pair), its ClassLabel names in label order (None:
    a float score, STS-B) and its validation split. Every task has ``label`` and ``idx`` columns."""

    text_fields: tuple[str, ...]
    label_names: tuple[str, ...] | None
    eval_split: str = "validation"


#: GLUE's tasks (the keys are ``datasets.load_dataset("nyu-mll/glue", name)`` names).
GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask(("sentence",), ("unacceptable", "acceptable")),
    "sst2": GlueTask(("sentence",), ("negative", "positive")),
    "mrpc": GlueTask(("sentence1", "sentence2"), ("not_equivalent", "equivalent")),
    "qqp": GlueTask(("question1", "question2"), ("not_duplicate", "duplicate")),
    "stsb": GlueTask(("sentence1", "sentence2"), None),
    "mnli": GlueTask(("premise", "hypothesis"), ("entailment", "neutral", "contradiction"), "validation_matched"),
    "qnli": GlueTask(("question", "sentence"), ("entailment", "not_entailment")),
    "rte": GlueTask(("sentence1", "sentence2"), ("entailment", "not_entailment")),
    "wnli": GlueTask(("sentence1", "sentence2"), ("not_entailment", "entailment")),
}


@dataclass
class TextTaskConfig:
    """Fine-tuning data (YAML section ``data``).

    dataset: "bbc-news" (embedded: 5-way topic classification, fixed 80/20 split of the 2,127 distinct articles),
        "glue" (``glue_task`` names the GLUE task: its columns, labels and metrics; ``train``/``eval`` default to
        the hub's ``nyu-mll/glue``, or give local copies in its layout) or "custom". For custom: ``type`` (one of
        TASK_TYPES), ``train``/``eval`` (a .csv/.json/.jsonl/.parquet file, a ``save_to_disk`` directory or a
        ``datasets`` name with ``dataset_config``, ``train_split``/``eval_split``) and the field names.
    id_field: the field naming each evaluation record in the predictions files (SQuAD's ``id``, GLUE's ``idx``);
        records without it are named by their position.
    max_seq_length: wordpieces per example (window) including special tokens.
    doc_stride: tagging and QA: wordpieces between the starts of consecutive windows over a long sentence or
        context (Google BERT ``run_squad.py``'s ``doc_stride``; transformers' ``stride`` is the overlap instead).
    max_answer_length: QA: longest answer span in wordpieces (BERT ``run_squad.py``: 30).
    version_2_with_negative: QA: SQuAD 2.0: questions may have no answer; "no answer" is predicted when
        s_null - s_best > ``null_score_diff_threshold`` (BERT section 4.3), scored by ``evaluate-v2.0.py``'s rules.
        False: SQuAD v1.1 (every question answered, ``evaluate-v1.1.py``'s rules).
    null_score_diff_threshold: QA v2: that threshold; None (default): chosen on the evaluation set as
        ``evaluate-v2.0.py``'s ``best_f1_thresh``.
    """

    dataset: str = "bbc-news"
    glue_task: str = ""
    type: str = "classification"
    train: str = ""
    eval: str = ""
    dataset_config: str = ""
    train_split: str = "train"
    eval_split: str = "validation"
    text_field: str = "text"
    text_pair_field: str = ""
    label_field: str = "label"
    id_field: str = "id"
    tokens_field: str = "tokens"
    tags_field: str = "tags"
    question_field: str = "question"
    context_field: str = "context"
    answers_field: str = "answers"
    max_seq_length: int = 128
    doc_stride: Annotated[int, Range(ge=1)] = 64
    max_answer_length: Annotated[int, Range(ge=1)] = 30
    version_2_with_negative: bool = False
    null_score_diff_threshold: float | None = None
    eval_fraction: float = 0.2
    max_train_examples: int = 0


def load_records(source: str, split: str = "train", name: str = "") -> list[dict]:
    """Records from a .csv / .json / .jsonl / .parquet file or a ``save_to_disk`` directory (a Dataset, or a
    DatasetDict: its ``split``), all through ``datasets``, or a ``datasets`` hub name (``name``: its config, such as
    "mrpc" of "nyu-mll/glue"; ``split``).

    Raises:
        FileNotFoundError: a path that does not exist and is not loadable from the hub.
        ValueError: a DatasetDict without ``split`` (its splits named), or no records.
    """
    import datasets

    path = Path(source)
    if path.is_dir():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(
                    f"{source} holds splits {sorted(ds)}, not {split!r}; set data.train_split / data.eval_split"
                )
            ds = ds[split]
    elif path.suffix in (".csv", ".json", ".jsonl", ".parquet"):
        if not path.is_file():
            raise FileNotFoundError(f"data file {path} does not exist")
        builder = {".csv": "csv", ".parquet": "parquet"}.get(path.suffix, "json")
        ds = datasets.load_dataset(builder, data_files=str(path), split="train")
    else:
        try:
            ds = datasets.load_dataset(source, name or None, split=split)
        except Exception as e:
            raise FileNotFoundError(
                f"{source!r} is neither a .csv/.json/.jsonl/.parquet file, a save_to_disk "
                f"directory nor a loadable datasets name ({type(e).__name__}: {e})"
            ) from e
    records = list(ds)
    if not records:
        raise ValueError(f"{source} holds no records")
    return records


def bbc_news_split(seed: int = 0, eval_fraction: float = 0.2) -> tuple[list[dict], list[dict], list[str]]:
    """The fixed BBC News split: (train records, test records, label names); each record has ``text`` (title
    and body) and an integer ``label``."""
    records = [{"text": r["text"], "label": BBC_CLASSES.index(r["label"])} for r in load_bbc_news()]
    train, test = train_eval_split(records, eval_fraction, seed)
    return train, test, list(BBC_CLASSES)


def label_space(records: Sequence[dict], field: str) -> list:
    """Sorted distinct labels (string or int) of a classification task."""
    return sorted({r[field] for r in records}, key=lambda x: (str(type(x)), x))


def _field(record: dict, name: str, where: str):
    if name not in record:
        raise ValueError(f"{where}: record has no field {name!r} (fields: {sorted(record)}); set data.{name}")
    return record[name]


def _qa_answers(record: dict, config: TextTaskConfig, where: str) -> dict:
    """A QA record's answers field read as ``{"text": [str, ...], "answer_start": [int, ...]}`` (the datasets
    layout of SQuAD), checked: SQuAD v1.1 (``version_2_with_negative`` false) has an answer for every question
    and no ``is_impossible`` one, as its evaluation requires.

    Raises:
        UserFileError: the field of another type (SQuAD's original list of {text, answer_start}), its lists of
            unequal length or their elements of another type; ValueError: v1.1 data without an answer.
    """
    name = config.answers_field
    answers, field = _field(record, name, where), f"field {name!r}"
    fix = 'write it as {"text": ["..."], "answer_start": [0]}, as datasets\' SQuAD does'
    if isinstance(answers, list):
        raise UserFileError(
            f'{where}: {field} must be a mapping of lists {{"text": [...], "answer_start": [...]}}, got a list '
            f"of {len(answers)} answers ({str(answers)[:60]}, SQuAD's original layout); {fix}"
        )
    expect(answers, dict, where, field, fix)
    texts = expect(answers.get("text"), list, where, f"{field}['text']", fix)
    starts = expect(answers.get("answer_start"), list, where, f"{field}['answer_start']", fix)
    if len(texts) != len(starts):
        raise UserFileError(f"{where}: {field} has {len(texts)} texts but {len(starts)} answer_start; {fix}")
    for i, (text, start) in enumerate(zip(texts, starts, strict=True)):
        expect(text, str, where, f"{field}['text'][{i}]", fix)
        expect(start, int, where, f"{field}['answer_start'][{i}]", fix)
    if not config.version_2_with_negative and (not texts or record.get("is_impossible") is True):
        what = "is marked is_impossible" if texts else f"has no answer ({field} is empty)"
        raise ValueError(
            f"{where} (id {record.get(config.id_field)!r}) {what}: SQuAD v1.1 trains and scores every question "
            "against its answers; for unanswerable questions (SQuAD 2.0) set data.version_2_with_negative: true, "
            "or leave the record out"
        )
    return answers


def window_spans(length: int, window: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of the windows over a sequence of ``length`` wordpieces: each at most ``window`` long, each
    starting ``stride`` after the previous one (at most one window length after it, so nothing is skipped), the last
    reaching the end (Google BERT ``run_squad.py`` ``convert_examples_to_features``' doc spans,
    google-research/bert@1cd50d7aa7d26638e05eb5b8a282b30cc92c6eb6). An empty sequence has one empty window.

    Raises: ValueError: ``window`` or ``stride`` below 1.
    """
    if window < 1 or stride < 1:
        raise ValueError(f"windows need a length and a stride of at least 1 wordpiece (got {window} and {stride})")
    spans, start = [], 0
    while True:
        size = min(length - start, window)
        spans.append((start, size))
        if start + size >= length:
            return spans
        start += min(size, stride)


def max_context_window(spans: Sequence[tuple[int, int]], position: int) -> int | None:
    """Index of the window in ``spans`` (``(start, length)``) where wordpiece ``position`` has the most context:
    the largest min(wordpieces left of it, wordpieces right of it) + 0.01 x window length, the first on ties
    (``run_squad.py``'s ``_check_is_max_context``); None where no window holds it."""
    best, best_score = None, None
    for k, (start, size) in enumerate(spans):
        end = start + size - 1
        if start <= position <= end:
            score = min(position - start, end - position) + 0.01 * size
            if best_score is None or score > best_score:
                best, best_score = k, score
    return best


class TextTaskDataset(torch.utils.data.Dataset):
    """Encoded examples of one text task (see module docstring). Items are dicts of lists/ints for
    :class:`TextTaskCollator`, each with ``record``, the index of its record in ``records``: one item per record
    for classification and regression (truncated to ``max_seq_length``), one per window for tagging and QA.

    Tagging items also hold ``words``: [(word index, position)] of the words whose prediction this window gives
    (their first wordpiece has its most context here); ``words_without_wordpieces[record]`` lists the others that no
    window holds. QA items hold ``doc_start`` (the context wordpiece at ``doc_offset``), ``length`` (context
    wordpieces in the window) and ``home`` (per context wordpiece: this is its max-context window);
    ``doc_offsets[record]`` maps context wordpieces to character spans of the context.

    ``source`` names the records' file (or datasets name and split) in messages: ``<source>: record 3``.

    Raises:
        ValueError: a record lacks a configured field, QA answers of another layout or type (a ``UserFileError``)
            or, for SQuAD v1.1 (``version_2_with_negative`` false), a question without an answer, a label is not in ``labels``, a tag sequence's length
            differs from its words', an answer does not occur in its context, a context has no wordpiece, or a
            question leaves no room for context in ``max_seq_length``.
    """

    def __init__(
        self,
        records: Sequence[dict],
        tokenizer,
        config: TextTaskConfig,
        labels: list | None = None,
        source: str = "",
    ):
        self.config, self.type = config, config.type
        self.source = source
        self.labels = labels
        self.records = list(records)
        self.words_without_wordpieces: list[list[int]] = []
        self.doc_offsets: list[list[tuple[int, int]]] = []
        self.cls, self.sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        if config.type in ("classification", "regression"):
            self.items = self._sentences(tokenizer)
        elif config.type == "tagging":
            self.items = [w for k, r in enumerate(self.records) for w in self._tagging(r, tokenizer, k)]
        elif config.type == "qa":
            self.items = [w for k, r in enumerate(self.records) for w in self._qa(r, tokenizer, k)]
        else:
            raise ValueError(f"data.type must be one of {TASK_TYPES}, got {config.type!r}")

    def _where(self, k: int) -> str:
        """Record ``k`` as messages name it: ``<source>: record k``."""
        return f"{self.source}: record {k}" if self.source else f"record {k}"

    def _sentences(self, tokenizer) -> list[dict]:
        """Classification / regression records (a text, or a pair) encoded in one batched tokenizer call."""
        c = self.config
        texts, pairs, labels = [], [], []
        for k, record in enumerate(self.records):
            where = self._where(k)
            texts.append(_field(record, c.text_field, where))
            if c.text_pair_field:
                pairs.append(_field(record, c.text_pair_field, where))
            labels.append(self._label(_field(record, c.label_field, where), where))
        if not texts:
            return []
        enc = tokenizer(texts, pairs or None, truncation=True, max_length=c.max_seq_length)
        return [
            {"input_ids": i, "token_type_ids": t, "labels": y, "record": k}
            for k, (i, t, y) in enumerate(zip(enc["input_ids"], enc["token_type_ids"], labels, strict=True))
        ]

    def _label(self, value, where: str):
        if self.type == "regression":
            return float(value)
        if value not in self.labels:
            hint = (
                " (-1 marks an unlabelled example, as in GLUE's test splits: evaluate on validation)"
                if value == -1
                else ""
            )
            raise ValueError(f"{where}: label {value!r} is not one of the task's labels {self.labels[:10]}{hint}")
        return self.labels.index(value)

    def _tagging(self, record, tokenizer, k: int) -> list[dict]:
        c, where = self.config, self._where(k)
        words, tags = _field(record, c.tokens_field, where), _field(record, c.tags_field, where)
        if len(words) != len(tags):
            raise ValueError(f"{where}: {len(words)} words but {len(tags)} tags")
        for t in tags:
            if t not in self.labels:
                raise ValueError(f"{where}: tag {t!r} is not one of the task's tags {self.labels[:20]}")
        tag_ids = [self.labels.index(t) for t in tags]
        enc = tokenizer(list(words), is_split_into_words=True, add_special_tokens=False, verbose=False)
        ids, word_ids = enc["input_ids"], enc.word_ids()
        first: dict[int, int] = {}  # word -> its first wordpiece
        for p, w in enumerate(word_ids):
            first.setdefault(w, p)
        self.words_without_wordpieces.append([w for w in range(len(words)) if w not in first])
        spans = window_spans(len(ids), c.max_seq_length - 2, c.doc_stride)
        home = {w: max_context_window(spans, p) for w, p in first.items()}
        starts = {p: w for w, p in first.items()}
        items = []
        for n, (start, size) in enumerate(spans):
            labels = (
                [IGNORE_INDEX]
                + [tag_ids[starts[p]] if p in starts else IGNORE_INDEX for p in range(start, start + size)]
                + [IGNORE_INDEX]
            )
            if all(y == IGNORE_INDEX for y in labels):
                continue  # no word starts here: nothing to learn or predict
            items.append(
                {
                    "input_ids": [self.cls, *ids[start : start + size], self.sep],
                    "token_type_ids": [0] * (size + 2),
                    "labels": labels,
                    "record": k,
                    "words": [(w, 1 + first[w] - start) for w in sorted(first) if home[w] == n],
                }
            )
        return items

    def _qa(self, record, tokenizer, k: int) -> list[dict]:
        c, where = self.config, self._where(k)
        question, context = _field(record, c.question_field, where), _field(record, c.context_field, where)
        answers = _qa_answers(record, c, where)
        q = tokenizer(question, add_special_tokens=False, verbose=False)["input_ids"]
        enc = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        doc, offsets = enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]]
        if not doc:
            raise ValueError(
                f"{where}: the context has no wordpiece (empty, or only characters the tokenizer "
                "removes); a question needs a context to answer from"
            )
        room = c.max_seq_length - len(q) - 3  # [CLS] question [SEP] context [SEP]
        if room < 1:
            raise ValueError(
                f"{where}: the question has {len(q)} wordpieces, which leaves no room for the context "
                f"in data.max_seq_length={c.max_seq_length}; raise it"
            )
        self.doc_offsets.append(offsets)
        answer = None  # first and last context wordpiece of the (first) answer
        if answers["text"]:
            a_start = answers["answer_start"][0]
            a_end = a_start + len(answers["text"][0])
            if context[a_start:a_end] != answers["text"][0]:
                raise ValueError(f"{where}: answer {answers['text'][0]!r} is not at character {a_start} of the context")
            pieces = [i for i, (o0, o1) in enumerate(offsets) if o0 < a_end and o1 > a_start]
            if pieces:
                answer = (pieces[0], pieces[-1])
        spans = window_spans(len(doc), room, c.doc_stride)
        home = [max_context_window(spans, p) for p in range(len(doc))]
        offset = len(q) + 2
        items = []
        for n, (start, size) in enumerate(spans):
            # A window without the whole answer points at [CLS] (run_squad.py; SQuAD 2.0's "no answer").
            inside = answer is not None and start <= answer[0] and answer[1] < start + size
            items.append(
                {
                    "input_ids": [self.cls, *q, self.sep, *doc[start : start + size], self.sep],
                    "token_type_ids": [0] * offset + [1] * (size + 1),
                    "start_positions": offset + answer[0] - start if inside else 0,
                    "end_positions": offset + answer[1] - start if inside else 0,
                    "record": k,
                    "doc_start": start,
                    "doc_offset": offset,
                    "length": size,
                    "home": [home[p] == n for p in range(start, start + size)],
                }
            )
        return items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return {**self.items[index], "index": index}

    def lengths(self) -> list[int]:
        return [len(x["input_ids"]) for x in self.items]


def align_word_labels(word_ids: Sequence[int | None], word_labels: Sequence[int]) -> list[int]:
    """Per-wordpiece labels from per-word labels: the label on each word's first piece, -100 on its other
    pieces and on special tokens (BERT section 5.3: "we use the representation of the first sub-token").

    Args:
        word_ids: for each wordpiece, the index of its word, or None for special tokens (tokenizer ``word_ids()``).
        word_labels: one label per word.
    """
    out, previous = [], None
    for w in word_ids:
        out.append(IGNORE_INDEX if w is None or w == previous else word_labels[w])
        previous = w
    return out


class TextTaskCollator:
    """Pad a list of :class:`TextTaskDataset` items into tensors for the task's head, with the unpadded layout of
    the attention mask (``layout``: :func:`~vlbert.layers.unpadded.unpadded_layout`),
    computed here on the host so that the model never reads the mask on the device (the span head, which
    computes every position, takes and ignores it)."""

    def __init__(self, tokenizer, task_type: str):
        self.pad_id = tokenizer.pad_token_id
        self.type = task_type

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        b, t = len(items), max(len(x["input_ids"]) for x in items)
        batch = {
            "input_ids": torch.full((b, t), self.pad_id, dtype=torch.long),
            "token_type_ids": torch.zeros(b, t, dtype=torch.long),
            "attention_mask": torch.zeros(b, t, dtype=torch.long),
            "index": torch.tensor([x["index"] for x in items]),
        }
        for i, x in enumerate(items):
            n = len(x["input_ids"])
            batch["input_ids"][i, :n] = torch.tensor(x["input_ids"])
            batch["token_type_ids"][i, :n] = torch.tensor(x["token_type_ids"])
            batch["attention_mask"][i, :n] = 1
        batch["layout"] = unpadded_layout(batch["attention_mask"])
        if self.type == "classification":
            batch["labels"] = torch.tensor([x["labels"] for x in items], dtype=torch.long)
        elif self.type == "regression":
            batch["labels"] = torch.tensor([x["labels"] for x in items], dtype=torch.float)
        elif self.type == "tagging":
            labels = torch.full((b, t), IGNORE_INDEX, dtype=torch.long)
            for i, x in enumerate(items):
                labels[i, : len(x["labels"])] = torch.tensor(x["labels"])
            batch["labels"] = labels
        else:
            batch["start_positions"] = torch.tensor([x["start_positions"] for x in items])
            batch["end_positions"] = torch.tensor([x["end_positions"] for x in items])
        return batch


__all__ = [
    "TextTaskConfig",
    "TextTaskDataset",
    "TextTaskCollator",
    "align_word_labels",
    "load_records",
    "bbc_news_split",
    "label_space",
    "window_spans",
    "max_context_window",
    "GlueTask",
    "GLUE_TASKS",
    "OUTSIDE_TAG",
    "TASK_TYPES",
]
