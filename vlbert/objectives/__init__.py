"""Pretraining objectives as units: each one's batch preparation, head and loss (see :mod:`.base`).

``OBJECTIVES`` maps a name (as in configs and logs) to its unit; models and collators look units up here.
"""

from vlbert.objectives.base import Encoded, Objective, ObjectiveResult, PrepareContext
from vlbert.objectives.image_text_matching import ImageTextMatching
from vlbert.objectives.masked_lm import MaskedLanguageModeling
from vlbert.objectives.masked_regions import (MaskedRegionClassification, MaskedRegionClassificationKL,
                                              MaskedRegionFeatureRegression)
from vlbert.objectives.mix import ObjectiveMix
from vlbert.objectives.next_sentence import NextSentencePrediction

OBJECTIVES: dict[str, Objective] = {unit.name: unit for unit in (
    MaskedLanguageModeling(), NextSentencePrediction(), ImageTextMatching(), MaskedRegionFeatureRegression(),
    MaskedRegionClassification(), MaskedRegionClassificationKL())}

__all__ = ["OBJECTIVES", "Objective", "ObjectiveResult", "Encoded", "PrepareContext", "ObjectiveMix",
           "MaskedLanguageModeling", "NextSentencePrediction", "ImageTextMatching", "MaskedRegionFeatureRegression",
           "MaskedRegionClassification", "MaskedRegionClassificationKL"]
