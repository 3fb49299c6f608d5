"""Models: the BERT encoder, its pretraining heads, and (in later modules) the vision-language models."""

from vlbert.models.bert import BertForPreTraining, BertModel
from vlbert.models.outputs import EncoderOutput, ObjectiveOutput, PreTrainingOutput
from vlbert.models.pretrained import PreTrainedModel

__all__ = ["BertModel", "BertForPreTraining", "EncoderOutput", "ObjectiveOutput", "PreTrainingOutput",
           "PreTrainedModel"]
