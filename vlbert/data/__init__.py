"""Data pipelines: corpora, BERT pretraining pairs and masking, batching."""

from vlbert.data.corpus import load_documents, split_sentences, train_eval_split
from vlbert.data.pretraining import (LengthGroupedBatchSampler, MaskingCollator, TextPretrainingDataset,
                                     create_segment_pairs, tokenize_documents)

__all__ = ["load_documents", "split_sentences", "train_eval_split", "LengthGroupedBatchSampler",
           "MaskingCollator", "TextPretrainingDataset", "create_segment_pairs", "tokenize_documents"]
