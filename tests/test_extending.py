"""Extension points are tables: a new pretraining objective is its unit module, one registry line and a config
entry; nothing in vlbert/models or vlbert/training changes (issue 30)."""

from __future__ import annotations

import json

import torch
import yaml
from safetensors.torch import load_file
from torch import nn

from conftest import tool
from vlbert.layers.losses import classification_loss
from vlbert.objectives import OBJECTIVES, Objective, ObjectiveResult


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
        tmp_path, monkeypatch):
    monkeypatch.setitem(OBJECTIVES, "caption_length", CaptionLength())  # the registry line
    config = {"model": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64},
              "detector": {"input_size": 96, "max_proposals": 16},
              "data": {"max_images": 48, "cache_dir": str(tmp_path / "regions"), "eval_fraction": 0.25,
                       "objectives": {"mlm": 1, "caption_length": 1}},  # the config entry
              "training": {"max_steps": 8, "batch_size": 8, "learning_rate": 1e-3, "warmup_steps": 1,
                           "log_every": 1, "progress_bar": False}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert tool("pretrain")(["--modality", "vl", "--config", str(tmp_path / "run.yaml"), "--output-dir",
                             str(out)]) in (0, None)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    drawn = {k for r in log if r["split"] == "train" for k in ("mlm", "caption_length") if k in r}
    assert drawn == {"mlm", "caption_length"}  # both drawn as steps' objectives, each logged with its metric
    metrics = json.loads((out / "metrics.json").read_text())
    assert "eval_caption_length_loss" in metrics and "eval_caption_length_accuracy" in metrics
    saved = load_file(str(out / "model.safetensors"))
    assert saved["caption_length_head.weight"].shape == (2, 32)  # the head trained and saved with the model
