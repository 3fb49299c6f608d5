"""Text pretraining (``tools/pretrain.py --modality text``): BERT's MLM + NSP on a document corpus.

Wires corpus -> sentences -> wordpieces -> segment pairs -> masking collator -> :class:`BertForPreTraining` ->
:class:`Trainer`. Source: BERT paper section 3.1 and appendix A.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass
from typing import Any

from vlbert.config import BertConfig
from vlbert.data.corpus import load_documents, split_sentences, train_eval_split
from vlbert.data.loading import eval_loader, train_loader
from vlbert.data.pretraining import MaskingCollator, TextPretrainingDataset, tokenize_documents
from vlbert.models.bert import IGNORE_INDEX, BertForPreTraining
from vlbert.tokenization import check_tokenizer_matches, load_tokenizer
from vlbert.training.run_config import check_sections, dataclass_from_section
from vlbert.training.trainer import Trainer, TrainingConfig, set_seed

logger = logging.getLogger(__name__)

TOP_LEVEL_KEYS = ("modality", "init_from", "tokenizer", "model", "data", "training")


@dataclass
class TextDataConfig:
    """Corpus and pretraining-data settings (YAML section ``data``).

    corpus: "bbc-news", a local .txt/.jsonl file or directory, or a ``datasets`` hub name.
    eval_fraction: share of documents held out for evaluation (whole documents, so no leakage).
    max_seq_length: wordpieces per pair including [CLS] and two [SEP] (BERT: 128, then 512).
    short_seq_prob: probability of a shorter target length (BERT: 0.1).
    mlm_probability: share of wordpieces chosen for prediction (BERT: 0.15).
    max_eval_batches: cap on held-out batches per evaluation (0 = all).
    """

    corpus: str = "bbc-news"
    text_field: str = "text"
    eval_fraction: float = 0.05
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    mlm_probability: float = 0.15
    max_eval_batches: int = 0

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TextDataConfig":
        """Build from the YAML ``data`` section; raises ``ValueError`` for unknown keys or wrong types."""
        return dataclass_from_section(cls, values, "data")


def build_model(run_config: dict[str, Any], tokenizer) -> BertForPreTraining:
    """A fresh BERT from the ``model`` section (vocab_size defaults to the tokenizer's), or the ``init_from``
    checkpoint with ``model`` entries as overrides."""
    model_section = dict(run_config.get("model") or {})
    init_from = run_config.get("init_from")
    if init_from:
        model = BertForPreTraining.from_pretrained(init_from, **model_section)
    else:
        model_section.setdefault("vocab_size", len(tokenizer))
        model_section.setdefault("pad_token_id", tokenizer.pad_token_id)
        model = BertForPreTraining(BertConfig.from_dict(model_section, strict=True))
    check_tokenizer_matches(tokenizer, model.config)
    return model


def most_frequent_token(documents: list[list[list[int]]], special_ids: set[int]) -> int:
    """The most frequent non-special wordpiece id in tokenized documents (the majority-class MLM baseline)."""
    counts = collections.Counter(t for doc in documents for sentence in doc for t in sentence)
    for token, _ in counts.most_common():
        if token not in special_ids:
            return token
    raise ValueError("the corpus has no ordinary wordpieces")


class TextPretrainingData:
    """Training and held-out batches for MLM + NSP from one corpus (see :class:`TextDataConfig`)."""

    def __init__(self, data: TextDataConfig, tokenizer, batch_size: int, seed: int = 0,
                 loader_options: dict | None = None, max_position_embeddings: int = 512):
        if data.max_seq_length > max_position_embeddings:
            raise ValueError(f"data.max_seq_length={data.max_seq_length} exceeds the model's "
                             f"max_position_embeddings={max_position_embeddings}; lower max_seq_length")
        documents = load_documents(data.corpus, text_field=data.text_field)
        train_docs, eval_docs = train_eval_split(documents, data.eval_fraction, seed)
        self.train_documents = tokenize_documents(train_docs, tokenizer, split_sentences)
        self.eval_documents = tokenize_documents(eval_docs, tokenizer, split_sentences) if eval_docs else []
        self.train = TextPretrainingDataset(self.train_documents, tokenizer, data.max_seq_length,
                                            data.short_seq_prob, seed=seed)
        self.eval = TextPretrainingDataset(self.eval_documents, tokenizer, data.max_seq_length, data.short_seq_prob,
                                           seed=seed + 1) if len(self.eval_documents) >= 2 else None
        self.collator = MaskingCollator.from_tokenizer(tokenizer, mlm_probability=data.mlm_probability)
        self.batch_size, self.seed = batch_size, seed
        self.loader_options = loader_options or {}
        self.max_eval_batches = data.max_eval_batches
        self.majority_token = most_frequent_token(self.train_documents, set(tokenizer.all_special_ids))

    def train_batches(self, epoch: int, start: int, rank: int, world_size: int):
        """Batches of ``epoch`` from batch index ``start`` on, for one data-parallel rank."""
        return train_loader(self.train, self.collator, self.batch_size, self.seed, epoch, start, rank, world_size,
                            **self.loader_options)

    def eval_batches(self):
        """The held-out batches: fixed pairs and fixed masking, the same at every evaluation."""
        return eval_loader(self.eval, self.collator, self.batch_size, self.max_eval_batches) if self.eval else []

    def majority_baseline_accuracy(self) -> float:
        """Held-out MLM accuracy of always predicting the training corpus's most frequent wordpiece."""
        hits = total = 0
        for batch in self.eval_batches():
            labels = batch["labels"][batch["labels"] != IGNORE_INDEX]
            hits += int((labels == self.majority_token).sum())
            total += labels.numel()
        return hits / max(total, 1)


def run_text_pretraining(run_config: dict[str, Any], resume: bool = False) -> dict[str, Any]:
    """Pretrain BERT with MLM + NSP as ``run_config`` says; returns the final metrics (also in metrics.json).

    Raises:
        ValueError / FileNotFoundError: bad config keys or values, missing or empty corpus, tokenizer and model
            vocabularies that differ, sequences longer than the model's positions. All raised before any file
            is written.
    """
    check_sections(run_config, TOP_LEVEL_KEYS)
    training = TrainingConfig.from_dict(run_config.get("training") or {})
    data_config = TextDataConfig.from_dict(run_config.get("data") or {})
    tokenizer = load_tokenizer(run_config.get("tokenizer") or run_config.get("init_from"))
    set_seed(training.seed)  # before the model is built: initial weights depend on it
    model = build_model(run_config, tokenizer)
    data = TextPretrainingData(data_config, tokenizer, training.batch_size, seed=training.seed,
                               loader_options=training.loader_options(),
                               max_position_embeddings=model.config.max_position_embeddings)
    logger.info("model: %.1fM parameters; %d training pairs per epoch, %d held-out pairs",
                model.num_parameters() / 1e6, len(data.train), len(data.eval) if data.eval else 0)
    trainer = Trainer(model, training, data.train_batches, data.eval_batches if data.eval else None,
                      run_config=run_config, tokenizer=tokenizer)
    if resume and not trainer.resume():
        logger.warning("--resume: no checkpoint under %s/checkpoints; starting from step 0", training.output_dir)
    extra = {}
    if data.eval is not None:
        extra["eval_mlm_accuracy_majority_baseline"] = data.majority_baseline_accuracy()
    metrics = trainer.train(extra_metrics=extra)
    return metrics


__all__ = ["TextDataConfig", "TextPretrainingData", "run_text_pretraining", "build_model", "most_frequent_token"]
