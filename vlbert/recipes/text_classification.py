"""Text fine-tuning (``tools/finetune_text.py``): one output layer on the pretrained encoder, the whole network
fine-tuned (BERT section 4; recipe of appendix A.3: 2-4 epochs, batch 16-32, lr 2e-5..5e-5, warmup).

Metrics in metrics.json: classification ``accuracy`` and ``macro_f1``; regression ``pearson``; tagging
``entity_f1`` and ``token_accuracy``; QA ``exact_match`` and ``f1``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from vlbert.data.finetuning import (TextTaskCollator, TextTaskConfig, TextTaskDataset, bbc_news_split, label_space,
                                    load_records)
from vlbert import checkpoint as ckpt
from vlbert.evaluation import text as text_metrics
from vlbert.models import heads
from vlbert.recipes.runner import Recipe, RunContext, TaskData, load_model
from vlbert.utils import evaluation, gather_objects

HEADS = {"classification": heads.BertForSequenceClassification, "regression": heads.BertForSequenceClassification,
         "tagging": heads.BertForTokenClassification, "qa": heads.BertForQuestionAnswering}


class TransformersAdapter(torch.nn.Module):
    """Wrap a transformers ``BertForSequenceClassification`` so the trainer can run it exactly as ours (same
    data, recipe and seed): returns an :class:`~vlbert.models.heads.ClassificationOutput` with ``cls`` loss and
    accuracy. Used only for side-by-side comparisons."""

    objectives = ("cls",)

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None):
        out = self.model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                         labels=labels)
        result = heads.ClassificationOutput(logits=out.logits)
        if labels is not None:
            with torch.no_grad():
                acc = (out.logits.argmax(-1) == labels).float().mean()
            result.add("cls", out.loss, "cls_accuracy", acc, labels.numel())
        return result

    def save_pretrained(self, directory, tokenizer=None):
        self.model.save_pretrained(str(directory))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(directory))

    def load_converted_state_dict(self, state, source: str = "checkpoint", strict: bool = False) -> None:
        """The trainer's resume contract: ``state`` in our names (as the trainer reads any checkpoint), loaded
        into the transformers model under its own names.

        Raises: ValueError: with ``strict``, a parameter missing or a tensor with no place (both named)."""
        result = self.model.load_state_dict(ckpt.vlbert_to_hf(state), strict=False)
        missing = [k for k in result.missing_keys if not k.endswith("position_ids")]
        if strict and (missing or result.unexpected_keys):
            raise ValueError(f"loading {source}: missing {missing}, unexpected {result.unexpected_keys}")


class TextTaskData(TaskData):
    """Train/eval datasets of one text task and their batches.

    Raises:
        ValueError: an unknown task, a custom task without its files; errors of the record readers.
    """

    train_drop_last = False

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        config, tokenizer = ctx.data, ctx.tokenizer
        if config.task == "bbc-news":
            config.type = "classification"
            train, evaluation, names = bbc_news_split(seed=0, eval_fraction=config.eval_fraction)
            labels = list(range(len(names)))
            self.label_names = names
        elif config.task == "custom":
            if not (config.train and config.eval):
                raise ValueError("a custom task needs data.train and data.eval (files or datasets names)")
            train = load_records(config.train, config.train_split)
            evaluation = load_records(config.eval, config.eval_split)
            if config.type == "classification":
                labels = label_space(train, config.label_field)
            elif config.type == "tagging":
                labels = sorted({t for r in train for t in r[config.tags_field]})
            else:
                labels = None
            self.label_names = [str(x) for x in labels] if labels else None
        else:
            raise ValueError(f"data.task must be 'bbc-news' or 'custom', got {config.task!r}")
        if config.max_train_examples:
            train = train[: config.max_train_examples]
        self.config, self.labels = config, labels
        self.train = TextTaskDataset(train, tokenizer, config, labels)
        self.eval = TextTaskDataset(evaluation, tokenizer, config, labels)
        self.collator = TextTaskCollator(tokenizer, config.type)

    @property
    def num_labels(self) -> int:
        return {"regression": 1, "qa": 2}.get(self.config.type) or len(self.labels)

    @evaluation
    def score(self, model) -> dict[str, float]:
        """The task's metrics on the evaluation set (see module docstring)."""
        device = next(model.parameters()).device
        preds: dict[int, Any] = {}
        for batch in self.rank_eval_batches():
            index = batch.pop("index").tolist()
            inputs = {k: batch[k].to(device) for k in ("input_ids", "token_type_ids", "attention_mask")}
            out = model(**inputs)
            if self.config.type == "qa":
                s, e, _ = heads.best_span(out.start_logits, out.end_logits, allowed=batch["context_mask"].to(device))
                for i, a, b in zip(index, s.tolist(), e.tolist()):
                    preds[i] = (a, b)
            elif self.config.type == "tagging":
                for row, i in enumerate(index):
                    preds[i] = out.logits[row].argmax(-1).tolist()
            elif self.config.type == "regression":
                preds.update(zip(index, out.logits.squeeze(-1).tolist()))
            else:
                preds.update(zip(index, out.logits.argmax(-1).tolist()))
        preds = dict(gather_objects(list(preds.items())))  # each rank predicted its share
        items = self.eval.items
        order = range(len(items))
        if self.config.type == "classification":
            p, r = [preds[i] for i in order], [items[i]["labels"] for i in order]
            return {"accuracy": text_metrics.accuracy(p, r), "macro_f1": text_metrics.macro_f1(p, r)}
        if self.config.type == "regression":
            return {"pearson": text_metrics.pearson([preds[i] for i in order], [items[i]["labels"] for i in order])}
        if self.config.type == "tagging":
            names = [str(x) for x in self.labels]
            pred_tags, gold_tags, hits, total = [], [], 0, 0
            for i in order:
                gold = items[i]["labels"]
                keep = [k for k, g in enumerate(gold) if g != -100]
                pred_tags.append([names[preds[i][k]] for k in keep])
                gold_tags.append([names[gold[k]] for k in keep])
                hits += sum(preds[i][k] == gold[k] for k in keep)
                total += len(keep)
            return {"entity_f1": text_metrics.entity_f1(pred_tags, gold_tags), "token_accuracy": hits / max(total, 1)}
        em = f1 = 0.0
        for i in order:
            record, (a, b) = self.eval.records[i], preds[i]
            offsets = items[i]["offsets"]
            context = record[self.config.context_field]
            answer = context[offsets[a][0]:offsets[b][1]] if items[i]["context_mask"][a] else ""
            e, f = text_metrics.squad_scores(answer, record[self.config.answers_field]["text"])
            em, f1 = em + e, f1 + f
        return {"exact_match": em / len(items), "f1": f1 / len(items)}


def majority_baseline(ctx: RunContext, data: TextTaskData, model) -> dict:
    """Accuracy of always answering the most frequent training label (classification only)."""
    if data.config.type != "classification":
        return {}
    counts = Counter(item["labels"] for item in data.train.items)
    majority = counts.most_common(1)[0][0]
    gold = [item["labels"] for item in data.eval.items]
    return {"accuracy_majority_baseline": sum(g == majority for g in gold) / len(gold)}


def build_model(ctx: RunContext, data: TextTaskData):
    """The head for the task type from ``init_from``; ``implementation: transformers`` trains transformers'
    BertForSequenceClassification instead (classification only), for same-recipe comparisons.

    Raises:
        ValueError: an unknown implementation, or transformers for a task other than classification.
    """
    implementation = ctx.config.get("implementation", "vlbert")
    # The label names travel with the model (config.json's id2label, as transformers writes and reads it).
    names = dict(enumerate(data.label_names)) if data.label_names else None
    if implementation == "transformers":
        if data.config.type != "classification":
            raise ValueError("implementation: transformers is offered for classification comparisons only")
        import transformers

        return TransformersAdapter(transformers.BertForSequenceClassification.from_pretrained(
            ctx.init_from, num_labels=data.num_labels, id2label=names, label2id=names and {
                v: k for k, v in names.items()}, **ctx.model_section))
    if implementation != "vlbert":
        raise ValueError(f"implementation must be 'vlbert' or 'transformers', got {implementation!r}")
    return load_model(HEADS[data.config.type], ctx, num_labels=data.num_labels, id2label=names)


def inference_info(ctx: RunContext, data: TextTaskData) -> dict:
    """The task type, label names and maximum length, for :class:`vlbert.inference.TextClassificationPipeline`."""
    return {"type": data.config.type, "labels": data.label_names, "max_text_length": data.config.max_seq_length}


RECIPE = Recipe("text", TextTaskConfig, TextTaskData, build_model, evaluate=lambda ctx, data, model: data.score(model),
                baselines=majority_baseline, sections=("implementation",), inference_info=inference_info,
                pipeline="text")

__all__ = ["RECIPE", "TextTaskData", "TransformersAdapter"]
