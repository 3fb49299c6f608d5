"""Use a trained model: one pipeline per task, loaded from a run directory, taking image files, PIL images or
arrays and text (or text alone, for text runs) (:mod:`vlbert.inference.pipelines`); what a run saves for it and the
detector check (:mod:`vlbert.inference.run`).

    from vlbert.inference import pipeline
    vqa = pipeline("runs/vqa")
    vqa("photo.jpg", "what color is the shape?", top_k=3)   # [{"answer": "red", "score": 0.97}, ...]
    itm = pipeline("models/uniter-base", task="image-text-matching")
    itm("photo.jpg", ["a red circle", "a blue square"])      # [{"text", "score", "match", "index"}, ...]
"""

from vlbert.inference.pipelines import (PIPELINES, EntailmentPipeline, FillMaskPipeline, ImageIndex, ImagePairPipeline,
                                        ImageTextMatchingPipeline, Pipeline, ReferringPipeline, RetrievalPipeline,
                                        TextClassificationPipeline, TextFillMaskPipeline, VQAPipeline, pipeline,
                                        pipeline_class)
from vlbert.inference.run import RunInputs, detector_for_run, read_inference_info

__all__ = ["pipeline", "PIPELINES", "Pipeline", "VQAPipeline", "RetrievalPipeline", "ImageIndex",
           "ImagePairPipeline", "ImageTextMatchingPipeline", "EntailmentPipeline", "ReferringPipeline",
           "FillMaskPipeline", "TextClassificationPipeline", "TextFillMaskPipeline", "pipeline_class", "RunInputs",
           "read_inference_info", "detector_for_run"]
