"""vlbert: vision-language BERT in PyTorch.

Text: :class:`BertModel`, :class:`BertForPreTraining` (MLM + NSP) and the fine-tuning heads, loading any Hugging Face
BERT checkpoint with ``from_pretrained`` and saving in the Hugging Face layout with ``save_pretrained``.
Vision-language: :class:`VLBertModel` (text + detector regions in one encoder), :class:`VLBertForPreTraining`
(MLM, MRFR, MRC, MRC-kl, ITM as units of :mod:`vlbert.objectives`), :class:`VLBertForVQA`,
:class:`VLBertForImageTextRetrieval`, :class:`VLBertForSequenceClassification`. Tasks are recipes
(:mod:`vlbert.recipes`): ``vlbert.recipes.run(vlbert.recipes.RECIPES["vqa"], config)`` is what the tools do. A
trained run answers about raw images through :func:`vlbert.inference.pipeline` (``pipeline("runs/vqa")(image,
question)``).
"""

from vlbert.config import BertConfig, VLBertConfig
from vlbert.models import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    EncoderOutput,
    ObjectiveOutput,
    PreTrainedModel,
    PreTrainingOutput,
    VLBertForImagePairClassification,
    VLBertForImageTextRetrieval,
    VLBertForMaskedTokenVQA,
    VLBertForPreTraining,
    VLBertForReferringExpressions,
    VLBertForSequenceClassification,
    VLBertForVisualReasoning,
    VLBertForVQA,
    VLBertModel,
)

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
    "VLBertModel",
    "VLBertForPreTraining",
    "VLBertForVQA",
    "VLBertForImageTextRetrieval",
    "VLBertForSequenceClassification",
    "VLBertForImagePairClassification",
    "VLBertForReferringExpressions",
    "VLBertForVisualReasoning",
    "VLBertForMaskedTokenVQA",
    "EncoderOutput",
    "ObjectiveOutput",
    "PreTrainingOutput",
    "PreTrainedModel",
    "__version__",
]
