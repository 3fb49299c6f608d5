"""vlbert: vision-language BERT in PyTorch.

Text: :class:`BertModel`, :class:`BertForPreTraining` (MLM + NSP) and the fine-tuning heads, loading any Hugging Face
BERT checkpoint with ``from_pretrained`` and saving in the Hugging Face layout with ``save_pretrained``; ModernBERT
beside it (:class:`ModernBertModel`, :class:`ModernBertForMaskedLM`, :class:`ModernBertForSequenceClassification`,
:class:`ModernBertForTokenClassification`, :class:`ModernBertConfig`), reading and writing transformers' ModernBERT
directories.
Vision-language: :class:`VLBertModel` (text + detector regions in one encoder), :class:`VLBertForPreTraining`
(MLM, MRFR, MRC, MRC-kl, ITM as units of :mod:`vlbert.objectives`), :class:`VLBertForVQA`,
:class:`VLBertForImageTextRetrieval`, :class:`VLBertForSequenceClassification` and the other task heads, UNITER's
SNLI-VE and NLVR2 heads among them (:class:`VLBertForVisualEntailment`, :class:`VLBertForNLVR2Paired`,
:class:`VLBertForNLVR2PairedAttention`: its published checkpoints convert to them). :class:`VLProcessor` turns raw
texts and images into a model's batch and is saved with every model. Tasks are recipes
(:mod:`vlbert.recipes`): ``vlbert.recipes.run(vlbert.recipes.RECIPES["vqa"], config)`` is what the tools do. A
trained run answers about raw images through :func:`pipeline` (:mod:`vlbert.inference`: ``pipeline("runs/vqa")(image,
question)``).
"""

import vlbert._source_tree  # noqa: F401  (first: detectors/ as vlbert.detectors in a checkout)
from vlbert.config import BertConfig, VLBertConfig
from vlbert.inference import pipeline
from vlbert.models import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    EncoderOutput,
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
    ObjectiveOutput,
    PreTrainedModel,
    PreTrainingOutput,
    VLBertForImagePairClassification,
    VLBertForImageTextRetrieval,
    VLBertForMaskedTokenVQA,
    VLBertForNLVR2Paired,
    VLBertForNLVR2PairedAttention,
    VLBertForPreTraining,
    VLBertForReferringExpressions,
    VLBertForSequenceClassification,
    VLBertForVisualEntailment,
    VLBertForVisualReasoning,
    VLBertForVQA,
    VLBertModel,
)
from vlbert.modernbert_config import ModernBertConfig
from vlbert.processing import VLProcessor

__version__ = "0.1.0"

__all__ = [
    "BertConfig",
    "VLBertConfig",
    "BertModel",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertForMultipleChoice",
    "ModernBertConfig",
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
    "VLBertForReferringExpressions",
    "VLBertForVisualReasoning",
    "VLBertForMaskedTokenVQA",
    "VLBertForVisualEntailment",
    "VLBertForNLVR2Paired",
    "VLBertForNLVR2PairedAttention",
    "VLProcessor",
    "pipeline",
    "EncoderOutput",
    "ObjectiveOutput",
    "PreTrainingOutput",
    "PreTrainedModel",
    "__version__",
]
