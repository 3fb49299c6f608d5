"""Tiny run directories of every task with a pipeline, written as the recipes leave them (a model directory in
Hugging Face layout, the MiniLM tokenizer, ``processor.json`` naming the `easy` fixture's detector) but with
freshly initialised weights: no training, so that the documentation's examples and the demo run in seconds. The
answers are meaningless; what they test is that every example the docs show runs as written."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from vlbert.config import BertConfig, VLBertConfig
from vlbert.models.bert import BertForPreTraining
from vlbert.models.heads import BertForSequenceClassification
from vlbert.models.referring import VLBertForReferringExpressions
from vlbert.models.retrieval import VLBertForImageTextRetrieval
from vlbert.models.vl import VLBertForPreTraining
from vlbert.models.vl_classification import VLBertForImagePairClassification, VLBertForSequenceClassification
from vlbert.models.vqa import VLBertForVQA
from vlbert.run_files import write_processor_record

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48)

#: run name -> (model class, processor record task, config and processor record extras)
REGION_RUNS = {
    "vqa-easy-vqa": (VLBertForVQA, "vqa", {"num_labels": 4}, {"labels": ["red", "blue", "circle", "yes"]}),
    "vl-default": (VLBertForPreTraining, "vl-pretraining", {"num_region_classes": 0}, {}),
    "snli-ve-easy-vqa": (
        VLBertForSequenceClassification,
        "snli-ve",
        {"num_labels": 3},
        {"labels": ["contradiction", "entailment", "neutral"]},
    ),
    "nlvr2-easy-vqa": (VLBertForImagePairClassification, "nlvr2", {"num_labels": 2}, {"labels": ["False", "True"]}),
    "refcoco-easy-vqa": (VLBertForReferringExpressions, "refcoco", {}, {"boxes": "detector"}),
    "retrieval-easy-vqa": (VLBertForImageTextRetrieval, "retrieval", {}, {"shortlist": 4}),
}


def write_tiny_runs(root: Path, easy, detector, tokenizer) -> dict[str, Path]:
    """Write every tiny run under ``root`` (``root/<name>``) and return name -> directory: the region tasks of
    :data:`REGION_RUNS` over ``easy``'s regions made by ``detector`` (a DetectorConfig), a BBC News classifier
    (``bbc-news``) and a text pretraining run (``text-default``)."""
    runs = {}
    dim = easy.store["0"].feature_dim
    provenance = {
        "fingerprint": detector.fingerprint(),
        "config": asdict(detector),
        "extractor": easy.store["0"].detector,
    }
    torch.manual_seed(0)
    for name, (cls, task, config_extra, info_extra) in REGION_RUNS.items():
        config = VLBertConfig(vocab_size=len(tokenizer), region_feature_dim=dim, **TINY, **config_extra)
        runs[name] = _save(
            root / name,
            cls(config),
            tokenizer,
            {
                "task": task,
                "max_text_length": 32,
                "max_regions": 16,
                "region_feature_dim": dim,
                "detector": provenance,
                **info_extra,
            },
        )
    labels = ["business", "entertainment", "politics", "sport", "tech"]
    text = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=64, num_labels=len(labels), **TINY)
    runs["bbc-news"] = _save(
        root / "bbc-news",
        BertForSequenceClassification(text),
        tokenizer,
        {"task": "text", "type": "classification", "labels": labels, "max_text_length": 64},
    )
    text = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=64, **TINY)
    runs["text-default"] = _save(
        root / "text-default", BertForPreTraining(text), tokenizer, {"task": "text-pretraining", "max_text_length": 64}
    )
    return runs


def _save(directory: Path, model, tokenizer, info: dict) -> Path:
    model.save_pretrained(directory, tokenizer=tokenizer)
    write_processor_record(directory, info)
    return directory
