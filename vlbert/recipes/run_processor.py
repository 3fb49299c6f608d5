"""The run's processor, built once: :func:`build_run_processor` makes the complete
:class:`~vlbert.processing.VLProcessor` a run trains with and saves (processor.json) from the three things that
decide it, and refuses the combinations that silently degrade a model, in one place:

- ``init_from``: a vision-language checkpoint's limits (its saved processor's ``max_regions`` and
  ``max_text_length``, e.g. UNITER's 100 regions and 60 wordpieces) where the config sets none, its image
  preprocessing where the model has a visual backbone, and the check that this run's regions come from the
  detector it was trained on (:meth:`~vlbert.processing.VLProcessor.check_compatible`, unless
  ``allow_other_detector``);
- the run config: the ``data`` section's limits and image preprocessing, the task, its pipeline and the task's own
  record fields (:attr:`~vlbert.recipes.runner.Recipe.processor_fields`: labels, shortlist, ...);
- the region source: what made the regions the run reads (:class:`~vlbert.processing.RegionSource`), with the
  visual backbone's feature size where the model computes the features itself.

The task's datasets, collator and evaluation take every input rule from the processor this returns.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from vlbert import checkpoint as ckpt
from vlbert.models.visual_backbone import RegionFeatureExtractor
from vlbert.processing import RegionSource, VLProcessor
from vlbert.processing.images import ImagePreprocessing, backbone_preprocessing, image_preprocessing
from vlbert.run_files import read_run_file

logger = logging.getLogger(__name__)

#: The data limits a vision-language checkpoint was trained with, read from its saved processor.
CHECKPOINT_LIMITS = ("max_regions", "max_text_length")


def init_processor(ctx) -> VLProcessor | None:
    """The processor saved with ``ctx.init_from`` (a run or conversion), or None (none saved: the packaged MiniLM,
    a converted text BERT; no ``init_from``).

    Raises:
        ValueError: a damaged record (the file named)."""
    return VLProcessor.saved(ckpt.resolve_checkpoint_dir(ctx.init_from)) if ctx.init_from else None


def decided_limits(ctx, trained: VLProcessor | None) -> dict[str, int]:
    """``max_text_length`` and ``max_regions`` of the run: the ``data`` section's, or those of a vision-language
    ``trained`` processor (``init_from``'s) where the config (file or ``--set``) sets none; where it sets one below
    the checkpoint's, one warning line says so. A text checkpoint's lengths are another task's and are not taken.
    Limits the ``data`` section does not have are left out."""
    limits = {name: getattr(ctx.data, name) for name in CHECKPOINT_LIMITS if hasattr(ctx.data, name)}
    if trained is None or not trained.uses_regions:
        return limits
    given, cuts = ctx.config.get("data") or {}, []
    for name in limits:
        saved = int(getattr(trained, name))
        if name not in given:
            limits[name] = saved
        elif limits[name] < saved:
            cuts.append(f"data.{name}={limits[name]} (init_from: {saved})")
    if cuts:
        logger.warning(
            "the config cuts below what init_from %s was trained on: %s; leave them unset to use the checkpoint's",
            ctx.init_from,
            ", ".join(cuts),
        )
    return limits


def build_run_processor(ctx, data, source: RegionSource | None = None) -> VLProcessor:
    """The run's processor, complete: the run's tokenizer, task and pipeline (``ctx.recipe``), the limits
    (:func:`decided_limits`), the region ``source`` (None: a text task) with a visual backbone's feature size and
    image preprocessing (:func:`~vlbert.recipes.regions.task_preprocessing`) where the model has one, and the
    recipe's own record fields (``processor_fields(ctx, data)``: ``labels`` and the task's extra fields, read as
    :meth:`~vlbert.processing.VLProcessor.from_record` reads a record, e.g. a text task's ``max_text_length``).

    Raises:
        ValueError: this run's regions come from another detector than ``init_from``'s and the config does not say
            ``allow_other_detector: true`` (:meth:`~vlbert.processing.VLProcessor.check_compatible`); a bad record
            field; a bad ``visual_backbone`` section or image preprocessing name.
    """
    recipe = getattr(ctx, "recipe", None)
    fields: dict[str, Any] = dict(recipe.processor_fields(ctx, data)) if recipe and recipe.processor_fields else {}
    trained = init_processor(ctx)
    preprocessing = None
    if source is not None:
        backbone = run_visual_backbone(ctx)
        if backbone:
            preprocessing = task_preprocessing(ctx.data, backbone, trained_preprocessing(trained))
            source = dataclasses.replace(source, feature_dim=backbone_feature_dim(backbone))
    limits = {**decided_limits(ctx, trained), **{k: fields.pop(k) for k in CHECKPOINT_LIMITS if k in fields}}
    processor = VLProcessor(
        ctx.tokenizer,
        task=recipe.name if recipe else None,
        pipeline=recipe.pipeline if recipe else None,
        labels=fields.pop("labels", None),
        **limits,
        region_source=source,
        image_preprocessing=preprocessing,
        extra=fields,
    )
    if trained is not None and not ctx.config.get("allow_other_detector"):
        trained.check_compatible(processor)
    return processor


def trained_preprocessing(trained: VLProcessor | None) -> ImagePreprocessing | None:
    """The image preprocessing ``init_from``'s saved processor records (a run or conversion whose model has a
    visual backbone: how its backbone saw images), or None."""
    return trained.image_preprocessing if trained is not None else None


def run_visual_backbone(ctx) -> dict | None:
    """The ``visual_backbone`` section of the model this run trains: ``init_from``'s own where its config.json has
    the field (a checkpoint decides its architecture), else the run's ``model`` section's (None: no backbone)."""
    if ctx.init_from:
        config = ckpt.resolve_checkpoint_dir(ctx.init_from) / ckpt.CONFIG_NAME
        saved = read_run_file(config) if config.is_file() else {}
        if "visual_backbone" in saved:
            return saved["visual_backbone"]
    return ctx.model_section.get("visual_backbone")


def task_preprocessing(data, backbone: dict, trained=None) -> ImagePreprocessing:
    """How a run whose model has a visual ``backbone`` (its config section) preprocesses images:
    ``data.image_preprocessing`` (default: ``trained``, the preprocessing ``init_from`` recorded (an
    :class:`ImagePreprocessing` or its record), else the backbone kind's,
    :func:`~vlbert.processing.images.backbone_preprocessing`) with ``data.image_short_side`` / ``image_max_side``.

    Raises:
        ValueError: an unknown preprocessing name.
    """
    if trained and not data.image_preprocessing:  # init_from's own, its sizes overridable
        base = trained if isinstance(trained, ImagePreprocessing) else ImagePreprocessing.from_record(trained)
        return image_preprocessing(
            base.name, data.image_short_side or base.short_side or -1, data.image_max_side or base.max_side or -1
        )
    return backbone_preprocessing(backbone, data.image_preprocessing, data.image_short_side, data.image_max_side)


def backbone_feature_dim(backbone: dict) -> int:
    """The region feature size of a ``visual_backbone`` section, from the extractor built on the meta device (no
    weights allocated). Raises ValueError for a bad section (:class:`RegionFeatureExtractor`)."""
    with torch.device("meta"):
        return RegionFeatureExtractor(backbone).feature_dim


__all__ = [
    "build_run_processor",
    "run_visual_backbone",
    "task_preprocessing",
    "backbone_feature_dim",
    "decided_limits",
    "init_processor",
    "CHECKPOINT_LIMITS",
]
