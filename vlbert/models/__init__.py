"""Models: the BERT and ModernBERT encoders and their pretraining heads, the fine-tuning heads, and the
vision-language models."""

from vlbert.models.bert import BertForPreTraining, BertModel
from vlbert.models.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    ScalarMix,
    best_span,
    layer_features,
)
from vlbert.models.modernbert import ModernBertForMaskedLM, ModernBertModel
from vlbert.models.modernbert_heads import ModernBertForSequenceClassification, ModernBertForTokenClassification
from vlbert.models.outputs import EncoderOutput, ObjectiveOutput, PreTrainingOutput
from vlbert.models.pretrained import PreTrainedModel
from vlbert.models.referring import VLBertForReferringExpressions
from vlbert.models.region_embeddings import REGION_EMBEDDINGS, region_location_features
from vlbert.models.retrieval import VLBertForImageTextRetrieval
from vlbert.models.uniter_heads import VLBertForNLVR2Paired, VLBertForNLVR2PairedAttention, VLBertForVisualEntailment
from vlbert.models.vl import VLBertForPreTraining, VLBertModel
from vlbert.models.vl_classification import (
    VLBertForImagePairClassification,
    VLBertForSequenceClassification,
    VLBertForVisualReasoning,
)
from vlbert.models.vqa import VLBertForMaskedTokenVQA, VLBertForVQA

__all__ = [
    "BertModel",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertForMultipleChoice",
    "ScalarMix",
    "best_span",
    "layer_features",
    "ModernBertModel",
    "ModernBertForMaskedLM",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
    "VLBertModel",
    "VLBertForPreTraining",
    "VLBertForVQA",
    "VLBertForImageTextRetrieval",
    "VLBertForSequenceClassification",
    "VLBertForImagePairClassification",
    "VLBertForVisualReasoning",
    "VLBertForMaskedTokenVQA",
    "VLBertForReferringExpressions",
    "VLBertForVisualEntailment",
    "VLBertForNLVR2Paired",
    "VLBertForNLVR2PairedAttention",
    "REGION_EMBEDDINGS",
    "region_location_features",
    "EncoderOutput",
    "ObjectiveOutput",
    "PreTrainingOutput",
    "PreTrainedModel",
]
