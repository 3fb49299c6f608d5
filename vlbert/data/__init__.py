"""Data pipelines: corpora, BERT pretraining pairs and masking, batching."""

from vlbert.data.corpus import load_documents, split_sentences, train_eval_split
from vlbert.data.corpus_pairs import CorpusPairsDataset
from vlbert.data.pretraining import LengthGroupedBatchSampler, MaskingCollator
from vlbert.data.token_corpus import TokenCorpus, prepare_corpus

__all__ = [
    "load_documents",
    "split_sentences",
    "train_eval_split",
    "LengthGroupedBatchSampler",
    "MaskingCollator",
    "CorpusPairsDataset",
    "TokenCorpus",
    "prepare_corpus",
]
