"""Text fine-tuning data: task records from BBC News, local CSV/JSON/JSONL files or ``datasets`` names, encoded
for the heads of :mod:`vlbert.models.heads`.

Task types (BERT section 4): ``classification`` (one text, or a pair with ``text_pair_field``), ``regression``,
``tagging`` (pre-split words with one tag each; the tag goes on the word's first wordpiece, -100 on the others,
as BERT section 5.3), ``qa`` (SQuAD format: question, context, answers {"text": [...], "answer_start": [...]}).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from vlbert.data.corpus import BBC_CLASSES, load_bbc_news, train_eval_split
from vlbert.layers.losses import IGNORE_INDEX
from vlbert.layers.packing import packing_fields

TASK_TYPES = ("classification", "regression", "tagging", "qa")


@dataclass
class TextTaskConfig:
    """Fine-tuning data (YAML section ``data``).

    task: "bbc-news" (embedded: 5-way topic classification, fixed 80/20 split of the 2,127 distinct articles) or
        "custom". For custom: ``type`` (one of TASK_TYPES), ``train``/``eval`` (a .csv/.json/.jsonl file or a
        ``datasets`` name with ``train_split``/``eval_split``) and the field names.
    max_seq_length: wordpieces per example including special tokens.
    """

    task: str = "bbc-news"
    type: str = "classification"
    train: str = ""
    eval: str = ""
    train_split: str = "train"
    eval_split: str = "validation"
    text_field: str = "text"
    text_pair_field: str = ""
    label_field: str = "label"
    tokens_field: str = "tokens"
    tags_field: str = "tags"
    question_field: str = "question"
    context_field: str = "context"
    answers_field: str = "answers"
    max_seq_length: int = 128
    eval_fraction: float = 0.2
    max_train_examples: int = 0


def load_records(source: str, split: str = "train") -> list[dict]:
    """Records from a .csv / .json / .jsonl file (through ``datasets``) or a ``datasets`` hub name.

    Raises:
        FileNotFoundError: a path that does not exist and is not loadable from the hub.
        ValueError: the file holds no records.
    """
    import datasets

    path = Path(source)
    if path.suffix in (".csv", ".json", ".jsonl"):
        if not path.is_file():
            raise FileNotFoundError(f"data file {path} does not exist")
        builder = "csv" if path.suffix == ".csv" else "json"
        ds = datasets.load_dataset(builder, data_files=str(path), split="train")
    else:
        try:
            ds = datasets.load_dataset(source, split=split)
        except Exception as e:
            raise FileNotFoundError(f"{source!r} is neither a .csv/.json/.jsonl file nor a loadable datasets name "
                                    f"({type(e).__name__}: {e})") from e
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


class TextTaskDataset(torch.utils.data.Dataset):
    """Encoded examples of one text task (see module docstring). Items are dicts of lists/ints for
    :class:`TextTaskCollator`.

    Raises:
        ValueError: a record lacks a configured field, a label is not in ``labels``, a tag sequence's length
            differs from its words', or an answer does not occur in its context.
    """

    def __init__(self, records: Sequence[dict], tokenizer, config: TextTaskConfig, labels: list | None = None):
        self.config, self.type = config, config.type
        self.labels = labels
        self.items: list[dict] = []
        self.records = list(records)
        encode = {"tagging": self._tagging, "qa": self._qa}.get(config.type)
        if config.type in ("classification", "regression"):
            self.items = self._sentences(tokenizer)
        elif encode is None:
            raise ValueError(f"data.type must be one of {TASK_TYPES}, got {config.type!r}")
        else:
            self.items = [encode(record, tokenizer, f"record {k}") for k, record in enumerate(self.records)]

    def _sentences(self, tokenizer) -> list[dict]:
        """Classification / regression records (a text, or a pair) encoded in one batched tokenizer call."""
        c = self.config
        texts, pairs, labels = [], [], []
        for k, record in enumerate(self.records):
            where = f"record {k}"
            texts.append(_field(record, c.text_field, where))
            if c.text_pair_field:
                pairs.append(_field(record, c.text_pair_field, where))
            labels.append(self._label(_field(record, c.label_field, where), where))
        if not texts:
            return []
        enc = tokenizer(texts, pairs or None, truncation=True, max_length=c.max_seq_length)
        return [{"input_ids": i, "token_type_ids": t, "labels": y}
                for i, t, y in zip(enc["input_ids"], enc["token_type_ids"], labels)]

    def _label(self, value, where: str):
        if self.type == "regression":
            return float(value)
        if value not in self.labels:
            raise ValueError(f"{where}: label {value!r} is not one of the task's labels {self.labels[:10]}")
        return self.labels.index(value)

    def _tagging(self, record, tokenizer, where):
        c = self.config
        words, tags = _field(record, c.tokens_field, where), _field(record, c.tags_field, where)
        if len(words) != len(tags):
            raise ValueError(f"{where}: {len(words)} words but {len(tags)} tags")
        enc = tokenizer(list(words), is_split_into_words=True, truncation=True, max_length=c.max_seq_length)
        for t in tags:
            if t not in self.labels:
                raise ValueError(f"{where}: tag {t!r} is not one of the task's tags {self.labels[:20]}")
        labels = align_word_labels(enc.word_ids(), [self.labels.index(t) for t in tags])
        return {"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"], "labels": labels}

    def _qa(self, record, tokenizer, where):
        c = self.config
        question, context = _field(record, c.question_field, where), _field(record, c.context_field, where)
        answers = _field(record, c.answers_field, where)
        enc = tokenizer(question, context, truncation="only_second", max_length=c.max_seq_length,
                        return_offsets_mapping=True)
        seq = enc.sequence_ids()
        start = end = 0  # [CLS] when the answer was truncated away (SQuAD 2.0 convention)
        if answers["text"]:
            a_start = answers["answer_start"][0]
            a_end = a_start + len(answers["text"][0])
            if context[a_start:a_end] != answers["text"][0]:
                raise ValueError(f"{where}: answer {answers['text'][0]!r} is not at character {a_start} of the context")
            tokens = [i for i, (s, (o0, o1)) in enumerate(zip(seq, enc["offset_mapping"]))
                      if s == 1 and o0 < a_end and o1 > a_start]
            if tokens:
                start, end = tokens[0], tokens[-1]
        return {"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"],
                "start_positions": start, "end_positions": end,
                "context_mask": [int(s == 1) for s in seq], "offsets": enc["offset_mapping"]}

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
    """Pad a list of :class:`TextTaskDataset` items into tensors for the task's head, with the packed layout of
    the attention mask (``packed_indices``, ``cu_seqlens``: :func:`~vlbert.layers.packing.packing_fields`),
    computed here on the host so that the model never reads the mask on the device (the span head, which
    computes every position, takes and ignores it)."""

    def __init__(self, tokenizer, task_type: str):
        self.pad_id = tokenizer.pad_token_id
        self.type = task_type

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        b, t = len(items), max(len(x["input_ids"]) for x in items)
        batch = {"input_ids": torch.full((b, t), self.pad_id, dtype=torch.long),
                 "token_type_ids": torch.zeros(b, t, dtype=torch.long),
                 "attention_mask": torch.zeros(b, t, dtype=torch.long),
                 "index": torch.tensor([x["index"] for x in items])}
        for i, x in enumerate(items):
            n = len(x["input_ids"])
            batch["input_ids"][i, :n] = torch.tensor(x["input_ids"])
            batch["token_type_ids"][i, :n] = torch.tensor(x["token_type_ids"])
            batch["attention_mask"][i, :n] = 1
        batch.update(packing_fields(batch["attention_mask"]))
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
            context = torch.zeros(b, t, dtype=torch.bool)
            for i, x in enumerate(items):
                context[i, : len(x["context_mask"])] = torch.tensor(x["context_mask"], dtype=torch.bool)
            batch["context_mask"] = context
        return batch


__all__ = ["TextTaskConfig", "TextTaskDataset", "TextTaskCollator", "align_word_labels", "load_records",
           "bbc_news_split", "label_space", "TASK_TYPES"]
