"""vlbert: vision-language BERT in PyTorch.

Text: :class:`BertModel`, :class:`BertForPreTraining` (MLM + NSP) and the fine-tuning heads, loading any Hugging Face
BERT checkpoint with ``from_pretrained`` and saving in the Hugging Face layout with ``save_pretrained``.
Vision-language: :class:`VLBertModel` (text + detector regions in one encoder), :class:`VLBertForPreTraining`
(MLM, MRFR, MRC, ITM), :class:`VLBertForVQA`, :class:`VLBertForImageTextRetrieval`.
"""

from vlbert.config import BertConfig, VLBertConfig
from vlbert.models import (BertForMultipleChoice, BertForPreTraining, BertForQuestionAnswering,
                           BertForSequenceClassification, BertForTokenClassification, BertModel, EncoderOutput,
                           ObjectiveOutput, PreTrainedModel, PreTrainingOutput, VLBertForImageTextRetrieval,
                           VLBertForPreTraining, VLBertForVQA, VLBertModel)

__version__ = "0.1.0"

__all__ = ["BertConfig", "VLBertConfig", "BertModel", "BertForPreTraining", "BertForSequenceClassification",
           "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice", "VLBertModel",
           "VLBertForPreTraining", "VLBertForVQA", "VLBertForImageTextRetrieval", "EncoderOutput",
           "ObjectiveOutput", "PreTrainingOutput", "PreTrainedModel", "__version__"]
