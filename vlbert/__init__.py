"""vlbert: vision-language BERT in PyTorch.

Text core: :class:`BertModel`, :class:`BertForPreTraining` (MLM + NSP), loading any Hugging Face BERT
checkpoint with ``from_pretrained`` and saving in the Hugging Face layout with ``save_pretrained``.
"""

from vlbert.config import BertConfig, VLBertConfig
from vlbert.models import (BertForPreTraining, BertModel, EncoderOutput, ObjectiveOutput, PreTrainedModel,
                           PreTrainingOutput)

__version__ = "0.1.0"

__all__ = ["BertConfig", "VLBertConfig", "BertModel", "BertForPreTraining", "EncoderOutput", "ObjectiveOutput",
           "PreTrainingOutput", "PreTrainedModel", "__version__"]
