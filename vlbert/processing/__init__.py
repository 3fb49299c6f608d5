"""The processor saved with every model: raw texts and images -> the model's batch, and the input rules it was
trained with (tokenizer, region source, limits, image preprocessing, labels): :class:`VLProcessor`; the record of
what made the region features: :class:`RegionSource`; and how one machine extracts regions under it (detector,
weights, device), which a processor is given: :class:`Detection`. The item and its collation live here too
(regions.py, padding.py, collator.py, images.py), below the datasets that call them."""

from vlbert.processing.detection import Detection
from vlbert.processing.processor import (
    DEFAULT_MAX_REGIONS,
    DEFAULT_MAX_TEXT_LENGTH,
    ImageInput,
    VLProcessor,
)
from vlbert.processing.record import load_processor_record, local_run_dir, record_pipeline
from vlbert.processing.region_source import RegionSource

__all__ = [
    "VLProcessor",
    "RegionSource",
    "Detection",
    "ImageInput",
    "local_run_dir",
    "load_processor_record",
    "record_pipeline",
    "DEFAULT_MAX_REGIONS",
    "DEFAULT_MAX_TEXT_LENGTH",
]
