"""Text pretraining (``tools/pretrain.py --modality text``): BERT's MLM + NSP on a document corpus.

corpus -> sentences -> wordpieces -> segment pairs -> masking collator -> :class:`BertForPreTraining`.
Source: BERT paper section 3.1 and appendix A.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from vlbert.data.corpus import load_documents, split_sentences, train_eval_split
from vlbert.data.corpus_pairs import CorpusPairsDataset, split_documents
from vlbert.data.pretraining import MaskingCollator, TextPretrainingDataset, tokenize_documents
from vlbert.data.token_corpus import TokenCorpus, prepare_corpus
from vlbert.models.bert import BertForPreTraining
from vlbert.models.losses import IGNORE_INDEX
from vlbert.recipes.runner import Recipe, RunContext, TaskData, load_model


@dataclass
class TextDataConfig:
    """Corpus and pretraining-data settings (YAML section ``data``).

    corpus: "bbc-news", a local .txt/.jsonl file or directory, or a ``datasets`` hub name.
    eval_fraction: share of documents held out for evaluation (whole documents, so no leakage).
    max_seq_length: wordpieces per pair including [CLS] and two [SEP] (BERT: 128, then 512).
    short_seq_prob: probability of a shorter target length (BERT: 0.1).
    mlm_probability: share of wordpieces chosen for prediction (BERT: 0.15).
    max_eval_batches: cap on held-out batches per evaluation (0 = all).
    memory_map: tokenise the corpus once into on-disk arrays read by position (cached under ``corpus_cache_dir``
        by corpus and tokenizer) and draw pairs from them at load time (:mod:`vlbert.data.corpus_pairs`): memory
        does not grow with the corpus. False: tokenise into memory (small corpora; the embedded default).
    num_proc: processes for the one-time tokenisation (``datasets.map``).
    """

    corpus: str = "bbc-news"
    text_field: str = "text"
    eval_fraction: float = 0.05
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    mlm_probability: float = 0.15
    max_eval_batches: int = 0
    memory_map: bool = False
    num_proc: int = 1
    corpus_cache_dir: str = "~/.cache/vlbert/corpora"


def most_frequent_token(documents: list[list[list[int]]], special_ids: set[int]) -> int:
    """The most frequent non-special wordpiece id in tokenized documents (the majority-class MLM baseline)."""
    counts = collections.Counter(t for doc in documents for sentence in doc for t in sentence)
    for token, _ in counts.most_common():
        if token not in special_ids:
            return token
    raise ValueError("the corpus has no ordinary wordpieces")


class TextPretrainingData(TaskData):
    """Training and held-out batches for MLM + NSP from one corpus (see :class:`TextDataConfig`).

    Raises:
        FileNotFoundError / ValueError: from the corpus readers (missing or empty corpus).
    """

    eval_batch_factor = 1

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        data, tokenizer = ctx.data, ctx.tokenizer
        self.collator = MaskingCollator.from_tokenizer(tokenizer, mlm_probability=data.mlm_probability)
        self.max_eval_batches = data.max_eval_batches
        if data.memory_map:
            self._memory_mapped(data, tokenizer)
            return
        documents = load_documents(data.corpus, text_field=data.text_field)
        train_docs, eval_docs = train_eval_split(documents, data.eval_fraction, self.seed)
        self.train_documents = tokenize_documents(train_docs, tokenizer, split_sentences)
        eval_documents = tokenize_documents(eval_docs, tokenizer, split_sentences) if eval_docs else []
        self.train = TextPretrainingDataset(self.train_documents, tokenizer, data.max_seq_length,
                                            data.short_seq_prob, seed=self.seed)
        if len(eval_documents) >= 2:
            self.eval = TextPretrainingDataset(eval_documents, tokenizer, data.max_seq_length, data.short_seq_prob,
                                               seed=self.seed + 1)
        self.majority_token = most_frequent_token(self.train_documents, set(tokenizer.all_special_ids))

    def _memory_mapped(self, data: TextDataConfig, tokenizer) -> None:
        """Train / held-out pairs drawn from the prepared on-disk corpus."""
        corpus = TokenCorpus(prepare_corpus(data.corpus, tokenizer, data.corpus_cache_dir, data.text_field,
                                            num_proc=data.num_proc))
        train_docs, eval_docs = split_documents(corpus.num_documents, data.eval_fraction, self.seed)
        self.train = CorpusPairsDataset(corpus, train_docs, tokenizer, data.max_seq_length, data.short_seq_prob,
                                        self.seed, "train")
        if len(eval_docs) >= 2:
            self.eval = CorpusPairsDataset(corpus, eval_docs, tokenizer, data.max_seq_length, data.short_seq_prob,
                                           self.seed + 1, "eval")
        counts = corpus.token_counts(len(tokenizer))
        counts[list(tokenizer.all_special_ids)] = -1
        self.majority_token = int(counts.argmax())

    def majority_baseline_accuracy(self) -> float:
        """Held-out MLM accuracy of always predicting the training corpus's most frequent wordpiece."""
        hits = total = 0
        for batch in self.eval_batches():
            labels = batch["labels"][batch["labels"] != IGNORE_INDEX]
            hits += int((labels == self.majority_token).sum())
            total += labels.numel()
        return hits / max(total, 1)


def build_model(ctx: RunContext, data) -> BertForPreTraining:
    """A fresh BERT from the ``model`` section (vocab_size from the tokenizer), or ``init_from`` with ``model``
    entries as overrides.

    Raises:
        ValueError: ``data.max_seq_length`` beyond the model's ``max_position_embeddings``.
    """
    model = load_model(BertForPreTraining, ctx)
    if ctx.data.max_seq_length > model.config.max_position_embeddings:
        raise ValueError(f"data.max_seq_length={ctx.data.max_seq_length} exceeds the model's "
                         f"max_position_embeddings={model.config.max_position_embeddings}; lower max_seq_length")
    return model


def baselines(ctx: RunContext, data: TextPretrainingData, model) -> dict:
    return {"eval_mlm_accuracy_majority_baseline": data.majority_baseline_accuracy()} if data.eval else {}


RECIPE = Recipe("text-pretraining", TextDataConfig, TextPretrainingData, build_model, baselines=baselines, default_init=None)

__all__ = ["RECIPE", "TextDataConfig", "TextPretrainingData", "most_frequent_token"]
