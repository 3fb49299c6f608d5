"""Extension points are tables: a new pretraining objective is its unit module, one registry line and a config
entry; a new region task is a data module, a recipe and a pipeline with their table lines; nothing in vlbert/models,
vlbert/training, vlbert/inference or tools/ changes (issue 30)."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass

import torch
import yaml
from helpers.builders import EASY_DETECTOR, tool, write_jsonl
from safetensors.torch import load_file
from torch import nn

from vlbert.data.easy_vqa import COLORS
from vlbert.data.grounded_text import GroundedTextDataset
from vlbert.inference import PIPELINES, Pipeline
from vlbert.inference.base import label_result, label_row
from vlbert.layers.losses import classification_loss
from vlbert.models.vl_classification import VLBertForSequenceClassification
from vlbert.objectives import OBJECTIVES, Objective, ObjectiveResult
from vlbert.recipes import TASKS, Recipe, Task, load_model
from vlbert.recipes.regions import DatasetBuilder, RegionTaskData, RegionTaskDataConfig, evaluate


class CaptionLength(Objective):
    """A toy objective with its own label key: is the caption longer than 8 wordpieces (from the pooled [CLS])?"""

    name, metric, head, inputs = "caption_length", "caption_length_accuracy", "caption_length_head", ("long_caption",)
    reads = ("bert.pooler",)

    def build_head(self, config) -> nn.Module:
        return nn.Linear(config.hidden_size, 2)

    def prepare(self, batch, items, ctx) -> None:
        batch["long_caption"] = torch.tensor([int(len(x["input_ids"]) > 8) for x in items])

    def loss(self, encoded, labels) -> ObjectiveResult:
        logits = getattr(encoded.model, self.head)(encoded.pooled)
        loss, accuracy, n = classification_loss(logits, labels["long_caption"])
        return ObjectiveResult(loss, accuracy, n, logits)


def test_a_new_objective_trains_through_the_vl_tool_with_a_unit_a_registry_line_and_a_config_entry(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(OBJECTIVES, "caption_length", CaptionLength())  # the registry line
    config = {
        "model": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64},
        "detector": {"input_size": 96, "max_proposals": 16},
        "data": {
            "max_images": 48,
            "cache_dir": str(tmp_path / "regions"),
            "eval_fraction": 0.25,
            "objectives": {"mlm": 1, "caption_length": 1},
        },  # the config entry
        "training": {
            "max_steps": 8,
            "batch_size": 8,
            "learning_rate": 1e-3,
            "warmup_steps": 1,
            "log_every": 1,
            "progress_bar": False,
        },
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert tool("pretrain")(["--modality", "vl", "--config", str(tmp_path / "run.yaml"), "--output-dir", str(out)]) in (
        0,
        None,
    )
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    drawn = {k for r in log if r["split"] == "train" for k in ("mlm", "caption_length") if k in r}
    assert drawn == {"mlm", "caption_length"}  # both drawn as steps' objectives, each logged with its metric
    metrics = json.loads((out / "metrics.json").read_text())
    assert "eval_caption_length_loss" in metrics and "eval_caption_length_accuracy" in metrics
    saved = load_file(str(out / "model.safetensors"))
    assert saved["caption_length_head.weight"].shape == (2, 32)  # the head trained and saved with the model


# Text units added the documented way (one module and one OBJECTIVES line each, vlbert/objectives/): ALBERT's
# sentence-order prediction and whole-word masking, trained through the text tool and checked for what they promise.
def test_sop_and_wwm_train_through_the_text_tool_as_units(small_corpus, tmp_path):
    config = {
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
        },
        "data": {
            "corpus": str(small_corpus),
            "max_seq_length": 64,
            "eval_fraction": 0.1,
            "corpus_cache_dir": str(tmp_path / "corpora"),
            "max_eval_batches": 2,
            "objectives": {"wwm": 1, "sop": 1},
        },
        "training": {
            "max_steps": 8,
            "batch_size": 8,
            "learning_rate": 2e-3,
            "warmup_steps": 1,
            "log_every": 1,
            "progress_bar": False,
        },
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert tool("pretrain")(
        ["--modality", "text", "--config", str(tmp_path / "run.yaml"), "--output-dir", str(out)]
    ) in (0, None)
    train = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    train = [r for r in train if r["split"] == "train"]
    assert all(
        {"wwm", "sop", "wwm_accuracy", "sop_accuracy"} <= set(r) and "mlm" not in r and "nsp" not in r for r in train
    )  # every batch trains exactly the two configured units
    assert train[-1]["wwm"] < train[0]["wwm"]  # the (whole-word) masked LM learns
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0 < metrics["eval_wwm_accuracy_majority_baseline"] < 1 and "eval_sop_accuracy" in metrics
    saved = load_file(str(out / "model.safetensors"))  # BERT's keys: both units use BERT's heads
    assert "cls.seq_relationship.weight" in saved and not any(k.startswith(("sop", "wwm")) for k in saved)


def test_wwm_masks_whole_words_and_sop_swaps_the_same_two_segments(small_token_corpus, tokenizer):
    from vlbert.data.corpus_pairs import CorpusPairsDataset
    from vlbert.data.pretraining import MaskingCollator
    from vlbert.objectives.sentence_order import swap_segments

    data = CorpusPairsDataset(
        small_token_corpus,
        torch.arange(small_token_corpus.num_documents).numpy(),
        tokenizer,
        64,
        seed=3,
        cache_name="extending",
        random_next=False,
    )
    items = [data[i] for i in range(0, min(len(data), 400), 2)]
    batch = MaskingCollator.from_tokenizer(tokenizer, objectives=("sop", "wwm"))(items)
    labels, ids = batch["wwm_labels"], batch["input_ids"]
    original = torch.where(labels != -100, labels, ids)
    pieces = tokenizer.convert_ids_to_tokens(original.reshape(-1).tolist())
    continuation = torch.tensor([p.startswith("##") for p in pieces]).reshape(original.shape)
    special = torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    chosen = labels != -100
    # a '##' piece is chosen exactly when the piece before it (its word, back to the word's start) is
    follows = continuation[:, 1:] & ~special[:, :-1]
    assert torch.equal(chosen[:, 1:][follows], chosen[:, :-1][follows])
    assert continuation[chosen].any() and (~continuation[chosen]).any()  # words of several pieces were masked
    share = chosen.sum() / (~special & (batch["attention_mask"] == 1)).sum()
    assert 0.10 < share < 0.17  # BERT's 15% of the pieces, in whole words
    swapped = batch["sentence_order_label"].bool()
    assert 0.4 < swapped.float().mean() < 0.6  # positives and negatives balanced
    for row, item in enumerate(items):  # a negative is the same two segments, swapped; a positive the pair as is
        expected = swap_segments(item) if swapped[row] else item
        n = len(item["input_ids"])
        assert original[row, :n].tolist() == expected["input_ids"]
        assert batch["token_type_ids"][row, :n].tolist() == expected["token_type_ids"]


# A new region task, "shape-colour": which colour is the shape? Its data module, recipe and pipeline follow.
@dataclass(frozen=True)
class ColourQuestion:
    question_id: str
    image_id: str
    question: str
    label: int


class ColourDataset(GroundedTextDataset):  # the data module: what an example is and its target
    kind, id_field, text_field = "question", "question_id", "question"

    def targets(self, example, regions) -> dict:
        return {"labels": example.label}


def colour_questions(easy) -> list[ColourQuestion]:
    return [
        ColourQuestion(f"q{k}", k, "which colour is the shape?", COLORS.index(colour))
        for k, (colour, _) in easy.truth.items()
    ]


class ColourData(RegionTaskData):  # the recipe: data, model, evaluation, what inference needs
    dataset_class = ColourDataset

    def predict(self, model) -> tuple[list[dict], dict[str, float]]:
        index, gold, predicted = self.predict_labels(model)
        rows = [
            {"question_id": self.eval.examples[i].question_id, "prediction": COLORS[p]}
            for i, p in zip(index, predicted, strict=True)
        ]
        return rows, {"accuracy": sum(g == p for g, p in zip(gold, predicted, strict=True)) / len(gold)}


def colour_recipe(easy) -> Recipe:
    ColourData.datasets = {
        "easy-colours": DatasetBuilder(lambda data, seed: (colour_questions(easy),) * 2, needs=("shards",))
    }
    return Recipe(
        "shape-colour",
        RegionTaskDataConfig,
        ColourData,
        lambda ctx, data: load_model(
            VLBertForSequenceClassification, ctx, num_labels=len(COLORS), region_feature_dim=data.feature_dim
        ),
        evaluate=evaluate,
        uses_regions=True,
        processor_fields=lambda ctx, data: {"labels": list(COLORS)},
    )


class ColourPipeline(Pipeline):  # the pipeline: its inputs, id, output and results format
    name = "shape-colour"
    model_class = VLBertForSequenceClassification
    input_fields = {"image": ("image",), "text": ("text", "question")}
    id_field = "question_id"
    formats = {"colours-csv": lambda rows: "".join(f"{r['question_id']},{r['prediction']}\n" for r in rows)}
    row = staticmethod(label_row)

    def postprocess(self, outputs, examples) -> list[dict]:
        return [label_result(p, self.labels) for p in outputs["logits"].softmax(-1)]


def test_a_new_region_task_trains_and_predicts_through_the_tools_with_a_data_module_recipe_and_pipeline(
    easy, tmp_path, monkeypatch
):
    monkeypatch.setitem(PIPELINES, "shape-colour", ColourPipeline)  # the pipeline's line
    task = Task(colour_recipe(easy), ColourPipeline, "finetune/vqa-easy-vqa")  # its task line names it
    monkeypatch.setitem(TASKS, "shape-colour", task)
    config = {
        "task": "shape-colour",
        "init_from": "minilm",
        "detector": asdict(EASY_DETECTOR),
        "data": {"dataset": "easy-colours", "shards": str(easy.shards), "max_text_length": 12},
        "training": {
            "max_steps": 30,
            "batch_size": 6,
            "learning_rate": 5e-4,
            "warmup_steps": 2,
            "log_every": 10,
            "progress_bar": False,
        },
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert tool("finetune")(
        ["--task", "shape-colour", "--config", str(tmp_path / "run.yaml"), "--output-dir", str(out)]
    ) in (0, None)
    evaluated = {
        r["question_id"]: r["prediction"] for r in map(json.loads, (out / "predictions.jsonl").read_text().splitlines())
    }
    assert json.loads((out / "metrics.json").read_text())["accuracy"] > 0.5  # 3 colours: chance is 1/3

    questions = colour_questions(easy)
    write_jsonl(
        tmp_path / "questions.jsonl",
        [
            {"question_id": q.question_id, "image": str(easy.files[q.image_id]), "question": q.question}
            for q in questions
        ],
    )
    assert (
        tool("predict")(
            [
                str(out),
                "--input",
                str(tmp_path / "questions.jsonl"),
                "--format",
                "colours-csv",
                "--output",
                str(tmp_path / "answers.csv"),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    # Image files through the run's own detector give the evaluation's predictions on the stored regions.
    answers = dict(csv.reader((tmp_path / "answers.csv").read_text().splitlines()))
    assert answers == evaluated
