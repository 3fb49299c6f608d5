"""Text classification from a fine-tuned text run (``vlbert finetune --task text``): transformers'
``pipeline("text-classification")`` shape, with the run's label names."""

from __future__ import annotations

from typing import Any

from vlbert.inference.base import Pipeline, label_result
from vlbert.models.heads import BertForSequenceClassification


class TextClassificationPipeline(Pipeline):
    """(text[, text_pair]) -> ``{"label", "score", "scores"}`` (softmax over the run's labels: BERT section 4.1's
    classifier) for a classification run, ``{"score": the predicted value}`` for a regression run; lists -> a
    list of them. Texts are tokenised as the run's dataset (pair as segment B, truncated to its maximum length).

    Raises:
        ValueError: a run of another text task type (tagging, qa): their heads load with ``from_pretrained``.
    """

    name = "text-classification"
    model_class = BertForSequenceClassification
    input_fields = {"text": ("text", "sentence", "sentence1"), "text_pair": ("text_pair", "sentence2")}
    image_fields = ()
    optional_fields = ("text_pair",)

    def __init__(self, model, **kwargs):
        super().__init__(model, **kwargs)
        self.type = self.processor.info.get("type", "classification")
        if self.type not in ("classification", "regression"):
            raise ValueError(
                f"{model} is a {self.type} run; pipelines answer classification and regression runs "
                "(load its head with from_pretrained)"
            )

    def preprocess(self, examples: list[dict], **parameters) -> dict[str, Any]:
        texts = [ex["text"] for ex in examples]
        pairs = [ex.get("text_pair") for ex in examples]
        if any(p is not None for p in pairs) and not all(p is not None for p in pairs):
            raise ValueError("give a text_pair with every text or with none")
        enc = self.tokenizer(
            texts,
            pairs if pairs[0] is not None else None,
            truncation=True,
            padding=True,
            max_length=self.processor.max_text_length,
            return_tensors="pt",
        )
        return {"batch": {k: enc[k].to(self.device) for k in ("input_ids", "token_type_ids", "attention_mask")}}

    def postprocess(self, outputs, examples) -> list[dict]:
        if self.type == "regression":
            return [{"score": float(v)} for v in outputs["logits"][:, 0]]
        labels = self.label_names(outputs["logits"].shape[1])
        return [label_result(row, labels) for row in outputs["logits"].softmax(-1)]

    def row(self, result: dict) -> dict:
        return {"prediction": result["label"], **result} if "label" in result else result


__all__ = ["TextClassificationPipeline"]
