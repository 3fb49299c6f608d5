"""Task metrics: VQA accuracy with its answer normalisation, retrieval Recall@K."""

from vlbert.data.vqa_answers import normalize_answer, soft_score
from vlbert.evaluation.retrieval import recall_at_k
from vlbert.evaluation.vqa import vqa_accuracy

__all__ = ["normalize_answer", "soft_score", "vqa_accuracy", "recall_at_k"]
