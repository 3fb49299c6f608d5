"""``OBJECTIVES``: every pretraining objective unit by its name (as in configs and logs). Models, collators and
the objective mix look units up here."""

from __future__ import annotations

from vlbert.objectives.base import Objective
from vlbert.objectives.contrastive import ImageTextContrastive
from vlbert.objectives.image_text_matching import ImageTextMatching
from vlbert.objectives.lxmert_units import AttributeClassification, PretrainingQuestionAnswering
from vlbert.objectives.masked_lm import MaskedLanguageModeling
from vlbert.objectives.masked_regions import (
    MaskedRegionClassification,
    MaskedRegionClassificationKL,
    MaskedRegionFeatureRegression,
)
from vlbert.objectives.next_sentence import NextSentencePrediction
from vlbert.objectives.sentence_order import SentenceOrderPrediction
from vlbert.objectives.whole_word_masking import WholeWordMasking
from vlbert.objectives.word_region_alignment import WordRegionAlignment

#: In this order collators prepare the units of a batch (a unit that rearranges the text, ``sop``, before the ones
#: that mask it) and models sum their losses.
OBJECTIVES: dict[str, Objective] = {
    unit.name: unit
    for unit in (
        SentenceOrderPrediction(),
        MaskedLanguageModeling(),
        NextSentencePrediction(),
        ImageTextMatching(),
        MaskedRegionFeatureRegression(),
        MaskedRegionClassification(),
        MaskedRegionClassificationKL(),
        WordRegionAlignment(),
        AttributeClassification(),
        PretrainingQuestionAnswering(),
        WholeWordMasking(),
        ImageTextContrastive(),
    )
}


def units_for(modality: str) -> list[Objective]:
    """The registered units a ``modality`` ("text" or "vl") pretraining model builds, in registry order (fixed:
    every rank weighs the losses in this order)."""
    return [unit for unit in OBJECTIVES.values() if modality in unit.modalities]


__all__ = ["OBJECTIVES", "units_for"]
