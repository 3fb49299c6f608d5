"""Use a trained model: one pipeline per task, loaded from a run directory or over a model in memory, taking image
files, PIL images or arrays and text (or text alone, for text runs) (:mod:`vlbert.inference.pipelines`); what a run
saves for it, the detector check and the inputs are its processor's (:class:`vlbert.processing.VLProcessor`).
Imports neither the trainer nor the recipes.

    from vlbert.inference import pipeline
    vqa = pipeline("runs/vqa")
    vqa("photo.jpg", "what color is the shape?", top_k=3)   # [{"answer": "red", "score": 0.97}, ...]
    itm = pipeline("image-text-matching", "models/uniter-base")
    itm("photo.jpg", ["a red circle", "a blue square"])      # [{"text", "score", "match", "index"}, ...]
    vqa = pipeline(model=model, tokenizer=tokenizer, detector=detector_config)   # a VLBertForVQA in memory
"""

from vlbert.inference.fill_mask import fill_masks
from vlbert.inference.pipelines import (
    PIPELINES,
    EntailmentPipeline,
    FillMaskPipeline,
    ImagePairPipeline,
    ImageTextMatchingPipeline,
    Pipeline,
    ReferringPipeline,
    RetrievalPipeline,
    TextClassificationPipeline,
    TextFillMaskPipeline,
    VQAPipeline,
    pipeline,
    pipeline_class,
)
from vlbert.inference.retrieval import ImageIndex
from vlbert.processing import VLProcessor, load_processor_record, record_pipeline

__all__ = [
    "pipeline",
    "PIPELINES",
    "Pipeline",
    "VQAPipeline",
    "RetrievalPipeline",
    "ImageIndex",
    "ImagePairPipeline",
    "ImageTextMatchingPipeline",
    "EntailmentPipeline",
    "ReferringPipeline",
    "FillMaskPipeline",
    "TextClassificationPipeline",
    "TextFillMaskPipeline",
    "pipeline_class",
    "VLProcessor",
    "fill_masks",
    "record_pipeline",
    "load_processor_record",
]
