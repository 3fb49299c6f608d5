"""Frozen per-layer features for the layer probes of :mod:`vlbert.analysis.probing`: BBC News topics from a text
model (mean over each article's real wordpieces) and easy-VQA questions from a VL model (the joint [CLS] of the
question with the image's regions)."""

from __future__ import annotations

import torch

import vlbert
from vlbert.data.easy_vqa import COLORS, answers, easy_vqa_shards, load_questions
from vlbert.data.finetuning import bbc_news_split
from vlbert.detectors.shards import load_regions
from vlbert.processing import VLProcessor
from vlbert.processing.padding import pad_text
from vlbert.processing.regions import pad_regions
from vlbert.tokenization import load_tokenizer, resolve_model_path


@torch.no_grad()
def layer_features(model, batches) -> torch.Tensor:
    """float [N, L + 1, H]: per layer, the mean over real text positions (``pool="mean"`` batches) or the [CLS]
    vector, of every example of ``batches`` (dicts of model inputs plus ``pool``)."""
    model.eval()
    rows = []
    for batch in batches:
        pool = batch.pop("pool")
        states = model(**batch, output_hidden_states=True).hidden_states
        if pool == "mean":
            mask = batch["attention_mask"][..., None].float()
            t = mask.shape[1]
            rows.append(torch.stack([(h[:, :t] * mask).sum(1) / mask.sum(1) for h in states], 1))
        else:
            rows.append(torch.stack([h[:, 0] for h in states], 1))
    return torch.cat(rows).float()


def bbc_news(model_path: str, max_length: int = 128, batch_size: int = 32):
    """(train features, train labels, test features, test labels) of the fixed BBC News topic split."""
    path = resolve_model_path(model_path)
    model, tok = vlbert.BertModel.from_pretrained(path), load_tokenizer(path)

    def batches(records):
        for s in range(0, len(records), batch_size):
            enc = tok(
                [r["text"] for r in records[s : s + batch_size]],
                truncation=True,
                max_length=max_length,
                padding=True,
                return_tensors="pt",
            )
            yield {
                "input_ids": enc["input_ids"],
                "token_type_ids": enc["token_type_ids"],
                "attention_mask": enc["attention_mask"],
                "pool": "mean",
            }

    out = []
    for records in bbc_news_split()[:2]:
        out += [layer_features(model, batches(records)), torch.tensor([r["label"] for r in records])]
    return (*out, "BBC News topic, MiniLM layers" if model_path == "minilm" else f"BBC News topic, {model_path}")


def easy_vqa(
    model_path: str,
    cache_dir: str,
    colour_only: bool,
    processor: VLProcessor,
    max_train: int = 3000,
    max_eval: int = 1000,
    batch_size: int = 64,
):
    """Features of easy-VQA questions (train / test) with their image's regions as the model's ``processor``
    keeps them, extracted with its detector (vlbert explain reads it from the run's saved processor), labels = the
    answer (colour questions only with ``colour_only``)."""
    path = resolve_model_path(model_path)
    model, tok = vlbert.VLBertModel.from_pretrained(path), load_tokenizer(path)
    regions = load_regions(easy_vqa_shards(processor.detector, cache_dir))
    names = list(COLORS) if colour_only else answers()

    def batches(questions):
        for s in range(0, len(questions), batch_size):
            chunk = questions[s : s + batch_size]
            batch = pad_text(
                [{"input_ids": ids} for ids in processor.text_ids([q.question for q in chunk])], tok.pad_token_id
            )
            batch.update(pad_regions([processor.region_item(regions[q.image_id]) for q in chunk]))
            yield {**batch, "pool": "cls"}

    out = []
    for split, limit in (("train", max_train), ("test", max_eval)):
        questions = [q for q in load_questions(split) if q.answer in names][:limit]
        out += [layer_features(model, batches(questions)), torch.tensor([names.index(q.answer) for q in questions])]
    what = "the colour" if colour_only else "the answer"
    return (*out, f"easy-VQA: which layer knows {what}? ({model_path})")


def probe_features(
    task: str,
    model_path: str,
    cache_dir: str = "~/.cache/vlbert/regions",
    processor: VLProcessor | None = None,
):
    """(train_x, train_y, eval_x, eval_y, title) for ``task`` in "bbc-news", "easy-vqa-color", "easy-vqa-answer";
    the easy-VQA tasks read regions made by the model's ``processor``'s detector, as many per image as it keeps.

    Raises:
        ValueError: an unknown task; an easy-VQA task without a processor that names a detector.
    """
    if task == "bbc-news":
        return bbc_news(model_path)
    if task in ("easy-vqa-color", "easy-vqa-answer"):
        if processor is None or processor.detector is None:
            raise ValueError(f"probe task {task} reads regions: pass the processor of the model, with its detector")
        return easy_vqa(model_path, cache_dir, task == "easy-vqa-color", processor)
    raise ValueError(f"unknown probe task {task!r}; use bbc-news, easy-vqa-color or easy-vqa-answer")


__all__ = ["layer_features", "probe_features"]
