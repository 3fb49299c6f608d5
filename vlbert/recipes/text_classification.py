"""Text fine-tuning (``vlbert finetune --task text``): one output layer on the pretrained encoder, the whole network
fine-tuned (BERT section 4; recipe of appendix A.3: 2-4 epochs, batch 16-32, lr 2e-5..5e-5, warmup).

Every figure is the field's own on the whole evaluation set (:mod:`vlbert.evaluation.text`; docs/metrics.md
"Text tasks"), and the predictions it was computed from are written to the run directory:

* classification: ``accuracy`` and ``macro_f1`` (over the task's whole label set); a GLUE task (``data.dataset:
  glue``): GLUE's metrics under GLUE's names (cola ``matthews_correlation``, mrpc/qqp ``accuracy`` and ``f1``, ...).
  regression: ``pearson`` and ``spearmanr``. File ``predictions.jsonl``: ``{"id", "label", "prediction"}`` per
  example.
* tagging: ``entity_f1`` (seqeval's default mode = conlleval) and ``token_accuracy`` over every word of every
  sentence (long sentences windowed; a word without a wordpiece tagged "O"), with ``eval_sentences``,
  ``eval_words`` and ``eval_words_without_wordpieces``. File ``predictions.jsonl``: ``{"id", "tokens", "tags",
  "predicted_tags"}`` per sentence.
* qa, SQuAD v1.1: ``exact_match`` and ``f1`` in percent, as ``evaluate-v1.1.py``. SQuAD 2.0
  (``data.version_2_with_negative``): ``evaluate-v2.0.py``'s ``exact``, ``f1``, ``total``, ``HasAns_*``,
  ``NoAns_*`` and ``best_exact``/``best_f1`` with their thresholds, and ``null_score_diff_threshold``, the
  threshold the predictions used. Files ``predictions.json`` (question id -> answer, "" for no answer: the file
  the official scripts read), and for v2 ``null_odds.json`` (question id -> s_null - s_best: their
  ``--na-prob-file``) and ``best_non_null_predictions.json`` (each question's best span, before the threshold).
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from vlbert import checkpoint as ckpt
from vlbert.data.finetuning import (
    GLUE_TASKS,
    OUTSIDE_TAG,
    TextTaskCollator,
    TextTaskConfig,
    TextTaskDataset,
    bbc_news_split,
    label_space,
    load_records,
)
from vlbert.evaluation import text as text_metrics
from vlbert.models import heads
from vlbert.recipes.init_from import load_model
from vlbert.recipes.runner import Recipe, RunContext, TaskData, write_output_file

logger = logging.getLogger(__name__)

HEADS = {
    "classification": heads.BertForSequenceClassification,
    "regression": heads.BertForSequenceClassification,
    "tagging": heads.BertForTokenClassification,
    "qa": heads.BertForQuestionAnswering,
}

#: The hub's copy of GLUE, in ``datasets``' glue layout (``data.dataset: glue`` reads it unless train/eval are given).
GLUE_HUB_NAME = "nyu-mll/glue"


class TransformersAdapter(torch.nn.Module):
    """Wrap a transformers ``BertForSequenceClassification`` so the trainer can run it exactly as ours (same
    data, recipe and seed): returns an :class:`~vlbert.models.heads.ClassificationOutput` with ``cls`` loss and
    accuracy. Used only for side-by-side comparisons."""

    objectives = ("cls",)

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None):
        out = self.model(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, labels=labels
        )
        result = heads.ClassificationOutput(logits=out.logits)
        if labels is not None:
            with torch.no_grad():
                acc = (out.logits.argmax(-1) == labels).float().mean()
            result.add("cls", out.loss, "cls_accuracy", acc, labels.numel())
        return result

    def save_pretrained(self, directory, tokenizer=None, state_dict=None):
        """The transformers model's ``save_pretrained`` (``state_dict``: in this adapter's names, ``model.`` first)."""
        if state_dict is not None:
            state_dict = {k.removeprefix("model."): v for k, v in state_dict.items()}
        self.model.save_pretrained(str(directory), state_dict=state_dict)
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
    """Train/eval datasets of one text task, their batches, and the task's evaluation (:meth:`predict`).

    Raises:
        ValueError: an unknown task or GLUE task, a custom task without its files, a window setting below 1, a
            SQuAD v1.1 evaluation question without an answer, repeated evaluation ids; errors of the record
            readers.
    """

    train_drop_last = False

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        config, tokenizer = ctx.data, ctx.tokenizer
        self.glue_task = None
        if config.dataset == "bbc-news":
            config.type = "classification"
            train, evaluation, names = bbc_news_split(seed=0, eval_fraction=config.eval_fraction)
            labels = list(range(len(names)))
            self.label_names = names
        elif config.dataset == "glue":
            train, evaluation, labels = self._glue_records(config)
        elif config.dataset == "custom":
            train, evaluation, labels = self._custom_records(config)
        else:
            raise ValueError(f"data.dataset must be 'bbc-news', 'glue' or 'custom', got {config.dataset!r}")
        # (doc_stride, max_answer_length and the threshold's type: the typed reading of the data section)
        if config.null_score_diff_threshold is not None and not config.version_2_with_negative:
            raise ValueError(
                "data.null_score_diff_threshold decides SQuAD 2.0's 'no answer': it needs "
                "data.version_2_with_negative: true"
            )
        if config.max_train_examples:
            train = train[: config.max_train_examples]
        self.config, self.labels = config, labels
        train_source, eval_source = self._sources(config)
        self.train = TextTaskDataset(train, tokenizer, config, labels, source=train_source)
        self.eval = TextTaskDataset(evaluation, tokenizer, config, labels, source=eval_source)
        self.collator = TextTaskCollator(tokenizer, config.type)
        self.ids = self._ids(evaluation)

    def _glue_records(self, config) -> tuple[list[dict], list[dict], list[int] | None]:
        """(train records, evaluation records, label indices; None for a regression) of ``data.glue_task``; sets
        the data section's type and fields to GLUE's columns, label and id in ``datasets``' glue layout."""
        if config.glue_task not in GLUE_TASKS:
            raise ValueError(
                f"data.glue_task must name a GLUE task, one of {sorted(GLUE_TASKS)}; got {config.glue_task!r}"
            )
        glue = GLUE_TASKS[config.glue_task]
        self.glue_task = config.glue_task
        config.type = "regression" if glue.label_names is None else "classification"
        config.text_field, config.text_pair_field = (*glue.text_fields, "")[:2]
        config.label_field, config.id_field = "label", "idx"
        eval_split = glue.eval_split if config.eval_split == "validation" else config.eval_split
        name = config.dataset_config or config.glue_task
        train = load_records(config.train or GLUE_HUB_NAME, config.train_split, name)
        evaluation = load_records(config.eval or GLUE_HUB_NAME, eval_split, name)
        self.label_names = list(glue.label_names) if glue.label_names else None
        return train, evaluation, list(range(len(glue.label_names))) if glue.label_names else None

    def _custom_records(self, config) -> tuple[list[dict], list[dict], list | None]:
        """(train records, evaluation records, the label space: the train records' labels or tags; None for
        regression and QA) of a custom task's ``data.train`` / ``data.eval``."""
        if not (config.train and config.eval):
            raise ValueError("a custom task needs data.train and data.eval (files or datasets names)")
        train = load_records(config.train, config.train_split, config.dataset_config)
        evaluation = load_records(config.eval, config.eval_split, config.dataset_config)
        if config.type == "classification":
            labels = label_space(train, config.label_field)
        elif config.type == "tagging":
            labels = sorted({t for r in train for t in r[config.tags_field]})
        else:
            labels = None
        self.label_names = [str(x) for x in labels] if labels else None
        return train, evaluation, labels

    def _sources(self, config) -> tuple[str, str]:
        """How messages name the training and evaluation records: the file, or a datasets name and its split."""
        if config.dataset == "bbc-news":
            return "BBC News (train split)", "BBC News (test split)"
        hub = GLUE_HUB_NAME if config.dataset == "glue" else ""
        names = []
        for given, split in ((config.train, config.train_split), (config.eval, config.eval_split)):
            path = Path(given) if given else None
            local = path is not None and (path.is_file() or path.suffix in (".csv", ".json", ".jsonl", ".parquet"))
            names.append(str(path) if local else f"{given or hub} ({split} split)")
        return names[0], names[1]

    def _ids(self, records) -> list:
        """Each evaluation record's id (``data.id_field``; its position where it has none), checked unique."""
        ids = [r.get(self.config.id_field, k) for k, r in enumerate(records)]
        if self.config.type == "qa":
            ids = [str(i) for i in ids]  # SQuAD's prediction files are keyed by string ids
        seen: dict = {}
        for k, i in enumerate(ids):
            if i in seen:
                raise ValueError(
                    f"evaluation records {seen[i]} and {k} share the id {i!r} (data.id_field="
                    f"{self.config.id_field!r}); the predictions files name each record by its id"
                )
            seen[i] = k
        return ids

    @property
    def num_labels(self) -> int:
        return {"regression": 1, "qa": 2}.get(self.config.type) or len(self.labels)

    def keep(self, batch: dict, output) -> list[tuple[int, Any]]:
        """What the evaluation reads of one held-out batch's output, per window: the best spans (qa), each word's
        tag (tagging), the value (regression) or the class (classification)."""
        index, kind = batch["index"].tolist(), self.config.type
        if kind == "qa":
            return [
                (
                    i,
                    self._window_spans(
                        output.start_logits[row].float().cpu(), output.end_logits[row].float().cpu(), self.eval.items[i]
                    ),
                )
                for row, i in enumerate(index)
            ]
        if kind == "tagging":
            best = output.logits.argmax(-1).cpu()
            return [
                (i, [(w, int(best[row, p])) for w, p in self.eval.items[i]["words"]]) for row, i in enumerate(index)
            ]
        if kind == "regression":
            return list(zip(index, output.logits.squeeze(-1).float().cpu().tolist(), strict=True))
        return list(zip(index, output.logits.argmax(-1).cpu().tolist(), strict=True))

    @property
    def target_keys(self) -> tuple[str, ...]:
        """The batch keys of the targets (:class:`~vlbert.data.finetuning.TextTaskCollator`): the answer span's
        positions (qa), else ``labels``."""
        return ("start_positions", "end_positions") if self.config.type == "qa" else ("labels",)

    def predict(self, model) -> tuple[dict[str, str], dict[str, Any]]:
        """({file name: text} of the predictions files, the task's metrics) on the whole evaluation set (see module
        docstring), from every process's share of the windows: those the trainer's final held-out pass kept, else
        a pass of ``model`` (:meth:`~vlbert.recipes.runner.TaskData.predictions`)."""
        outputs = self.predictions(model)
        return {"qa": self._qa, "tagging": self._tagging}.get(self.config.type, self._sentences)(outputs)

    def _sentences(self, outputs: dict[int, Any]) -> tuple[dict[str, str], dict[str, Any]]:
        items = self.eval.items
        pred = [outputs[i] for i in range(len(items))]
        gold = [items[i]["labels"] for i in range(len(items))]
        if self.config.type == "regression":
            shown_pred, shown_gold = pred, gold
        else:
            names = self.label_names or [str(x) for x in self.labels]
            shown_pred, shown_gold = [names[p] for p in pred], [names[g] for g in gold]
        if self.glue_task is not None:
            metrics = text_metrics.glue_metrics(self.glue_task, pred, gold)
        elif self.config.type == "regression":
            metrics = text_metrics.pearson_and_spearman(pred, gold)
        else:
            metrics = {
                "accuracy": text_metrics.accuracy(pred, gold),
                "macro_f1": text_metrics.macro_f1(pred, gold, labels=range(len(self.labels))),
            }
        rows = [
            {"id": self.ids[items[i]["record"]], "label": shown_gold[i], "prediction": shown_pred[i]}
            for i in range(len(items))
        ]
        return {"predictions.jsonl": _jsonl(rows)}, metrics

    def _tagging(self, outputs: dict[int, Any]) -> tuple[dict[str, str], dict[str, Any]]:
        c, names = self.config, [str(x) for x in self.labels]
        records = self.eval.records
        predicted = [[OUTSIDE_TAG] * len(r[c.tokens_field]) for r in records]  # words without a wordpiece: O
        for i, words in outputs.items():
            record = self.eval.items[i]["record"]
            for w, label in words:
                predicted[record][w] = names[label]
        gold = [list(r[c.tags_field]) for r in records]
        metrics = {
            "entity_f1": text_metrics.entity_f1(predicted, gold),
            "token_accuracy": text_metrics.tag_accuracy(predicted, gold),
            "eval_sentences": len(records),
            "eval_words": sum(len(g) for g in gold),
            "eval_words_without_wordpieces": sum(len(w) for w in self.eval.words_without_wordpieces),
        }
        logger.info(
            "tagging evaluated on %d sentences, %d words (%d without a wordpiece, tagged %s) from %d windows",
            len(records),
            metrics["eval_words"],
            metrics["eval_words_without_wordpieces"],
            OUTSIDE_TAG,
            len(self.eval.items),
        )
        rows = [
            {"id": self.ids[k], "tokens": list(r[c.tokens_field]), "tags": gold[k], "predicted_tags": predicted[k]}
            for k, r in enumerate(records)
        ]
        return {"predictions.jsonl": _jsonl(rows)}, metrics

    def _window_spans(self, start_logits: torch.Tensor, end_logits: torch.Tensor, item: dict) -> tuple:
        """(s_null, best span score, first and last context wordpiece of the best span) of one window: the span's
        start among the context wordpieces this window is the max-context window of, its end among the window's
        context wordpieces, end >= start, at most ``max_answer_length`` long (Google BERT ``run_squad.py``
        ``write_predictions``, without its n-best shortlist: the exact maximum of BERT section 4.2's
        S.T_i + E.T_j); s_null = S.C + E.C, the [CLS] scores (section 4.3)."""
        o, n = item["doc_offset"], item["length"]
        s, e = start_logits[o : o + n], end_logits[o : o + n]
        i = torch.arange(n)
        valid = (i[None, :] >= i[:, None]) & (i[None, :] - i[:, None] < self.config.max_answer_length)
        valid &= torch.tensor(item["home"], dtype=torch.bool)[:, None]
        null = float(start_logits[0] + end_logits[0])
        if not valid.any():
            return null, -math.inf, 0, 0
        scores = (s[:, None] + e[None, :]).masked_fill(~valid, -math.inf)
        a, b = divmod(int(scores.flatten().argmax()), n)
        return null, float(scores[a, b]), item["doc_start"] + a, item["doc_start"] + b

    def _qa(self, outputs: dict[int, Any]) -> tuple[dict[str, str], dict[str, Any]]:
        c, records = self.config, self.eval.records
        null = [math.inf] * len(records)
        best: list[tuple] = [(-math.inf, 0, 0)] * len(records)
        for i in sorted(outputs):  # windows in order: the first wins a tie
            s_null, score, a, b = outputs[i]
            k = self.eval.items[i]["record"]
            null[k] = min(null[k], s_null)  # run_squad.py: the smallest null score over the windows
            if score > best[k][0]:
                best[k] = (score, a, b)
        answers, references = {}, {}
        for k, record in enumerate(records):
            offsets = self.eval.doc_offsets[k]
            _, a, b = best[k]
            answers[self.ids[k]] = record[c.context_field][offsets[a][0] : offsets[b][1]]
            references[self.ids[k]] = list(record[c.answers_field]["text"])
        counts = {"eval_questions": len(records), "eval_windows": len(self.eval.items)}
        if not c.version_2_with_negative:
            return (
                {"predictions.json": json.dumps(answers, indent=2) + "\n"},
                {**text_metrics.squad_v1_evaluate(answers, references), **counts},
            )
        odds = {self.ids[k]: null[k] - best[k][0] for k in range(len(records))}  # s_null - s_best (section 4.3)
        search = text_metrics.squad_v2_evaluate(answers, references, na_probs=odds)
        threshold = c.null_score_diff_threshold
        if threshold is None:  # evaluate-v2.0.py's best_f1_thresh
            unanswerable = sum(not golds for golds in references.values())
            threshold = search["best_f1_thresh"]
            if search["best_f1"] == 100.0 * unanswerable / len(references):
                # Answering nothing is best; the script then reports 0.0, which would answer some: stay below all.
                threshold = min(odds.values()) - 1.0
        predictions = {qid: "" if odds[qid] > threshold else text for qid, text in answers.items()}
        metrics = {
            **text_metrics.squad_v2_evaluate(predictions, references),
            **{k: search[k] for k in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")},
            "null_score_diff_threshold": threshold,
            **counts,
        }
        logger.info(
            "SQuAD 2.0: 'no answer' where s_null - s_best > %g: %d of %d questions",
            threshold,
            sum(not p for p in predictions.values()),
            len(predictions),
        )
        return (
            {
                "predictions.json": json.dumps(predictions, indent=2) + "\n",
                "null_odds.json": json.dumps(odds, indent=2) + "\n",
                "best_non_null_predictions.json": json.dumps(answers, indent=2) + "\n",
            },
            metrics,
        )


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def evaluate(ctx: RunContext, data: TextTaskData, model) -> dict[str, Any]:
    """The recipe's final evaluation: :meth:`TextTaskData.predict`'s metrics, its predictions files written to the
    run directory."""
    files, metrics = data.predict(model)
    for name, text in files.items():
        write_output_file(ctx, name, text)
    return metrics


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

        return TransformersAdapter(
            transformers.BertForSequenceClassification.from_pretrained(
                ctx.init_from,
                num_labels=data.num_labels,
                id2label=names,
                label2id=names and {v: k for k, v in names.items()},
                **ctx.model_section,
            )
        )
    if implementation != "vlbert":
        raise ValueError(f"implementation must be 'vlbert' or 'transformers', got {implementation!r}")
    return load_model(HEADS[data.config.type], ctx, num_labels=data.num_labels, id2label=names)


def processor_fields(ctx: RunContext, data: TextTaskData) -> dict:
    """The task type, label names and maximum length, for :class:`vlbert.inference.TextClassificationPipeline`."""
    return {"type": data.config.type, "labels": data.label_names, "max_text_length": data.config.max_seq_length}


RECIPE = Recipe(
    "text",
    TextTaskConfig,
    TextTaskData,
    build_model,
    evaluate=evaluate,
    baselines=majority_baseline,
    sections=("implementation",),
    processor_fields=processor_fields,
)

__all__ = ["RECIPE", "TextTaskData", "TransformersAdapter", "evaluate", "GLUE_HUB_NAME"]
