"""Pretraining objectives as units: each one's batch preparation, head and loss (see :mod:`.base`).

``OBJECTIVES`` (:mod:`.registry`) maps a name (as in configs and logs) to its unit; models and collators look units
up here. The units build their heads from :mod:`vlbert.layers` and import no model: the models import them.
"""

from vlbert.objectives.base import Encoded, Objective, ObjectiveResult, PrepareContext
from vlbert.objectives.contrastive import ImageTextContrastive
from vlbert.objectives.image_text_matching import ImageTextMatching
from vlbert.objectives.masked_lm import MaskedLanguageModeling
from vlbert.objectives.masked_regions import (
    MaskedRegionClassification,
    MaskedRegionClassificationKL,
    MaskedRegionFeatureRegression,
)
from vlbert.objectives.mix import ObjectiveMix
from vlbert.objectives.next_sentence import NextSentencePrediction
from vlbert.objectives.registry import OBJECTIVES, units_for
from vlbert.objectives.word_region_alignment import WordRegionAlignment

__all__ = [
    "OBJECTIVES",
    "units_for",
    "Objective",
    "ObjectiveResult",
    "Encoded",
    "PrepareContext",
    "ObjectiveMix",
    "MaskedLanguageModeling",
    "NextSentencePrediction",
    "ImageTextMatching",
    "ImageTextContrastive",
    "MaskedRegionFeatureRegression",
    "MaskedRegionClassification",
    "MaskedRegionClassificationKL",
    "WordRegionAlignment",
]
