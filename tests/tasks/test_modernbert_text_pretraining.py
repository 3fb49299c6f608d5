"""Text pretraining builds a ModernBERT (``model.architecture: modernbert``, or ``--init-from`` a ModernBERT
directory): MLM only, the saved run is transformers' ModernBertForMaskedLM, and configurations it cannot train are
refused in one line before anything is written."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import vlbert
from vlbert.recipes import RECIPES, run
from vlbert.recipes.runner import RunContext

MODERNBERT = {
    "architecture": "modernbert",
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "intermediate_size": 48,
    "max_position_embeddings": 64,
    "local_attention": 8,  # 4 tokens each side: local layers 1 and 2 see less than the 64-token pairs
}


def config_for(corpus, output_dir, model=MODERNBERT, **data):
    return {
        "modality": "text",
        "tokenizer": "minilm",
        "model": dict(model),
        "data": {"corpus": str(corpus), "max_seq_length": 64, "eval_fraction": 0.1, "objectives": {"mlm": 1}, **data},
        "training": {
            "output_dir": str(output_dir),
            "max_steps": 6,
            "batch_size": 8,
            "learning_rate": 3e-3,
            "warmup_steps": 1,
            "log_every": 1,
            "progress_bar": False,
            "optimizer": "stable_adamw",
            "weight_decay": 1e-5,
            "schedule": "wsd",
            "decay_steps": 2,
        },
    }


def test_a_modernbert_run_trains_mlm_and_saves_a_transformers_modernbert(small_corpus, tmp_path):
    out = tmp_path / "run"
    metrics = run(RECIPES["text-pretraining"], config_for(small_corpus, out, mlm_probability=0.3))
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    train = [r for r in log if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 7)) and "nsp" not in train[0]
    assert train[-1]["mlm"] < train[0]["mlm"]
    assert 0 <= metrics["eval_mlm_accuracy"] <= 1 and "eval_mlm_accuracy_majority_baseline" in metrics
    saved = json.loads((out / "config.json").read_text())
    assert saved["model_type"] == "modernbert" and saved["architectures"] == ["ModernBertForMaskedLM"]
    assert (saved["vocab_size"], saved["cls_token_id"], saved["sep_token_id"]) == (30522, 101, 102)  # the tokenizer's
    # transformers loads the run with nothing missing and gives the same logits (a pair longer than the window).
    hf, info = transformers.ModernBertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours = vlbert.ModernBertForMaskedLM.from_pretrained(out).eval()
    ids = torch.randint(1000, 30000, (2, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    with torch.no_grad():
        theirs = hf.eval()(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, mask).prediction_logits
    torch.testing.assert_close(got[mask.bool()], theirs[mask.bool()], atol=1e-5, rtol=0)

    # --init-from the run: its architecture decides over a BERT model section, which is ignored.
    again = config_for(small_corpus, tmp_path / "again", model={"hidden_size": 256, "num_hidden_layers": 4})
    again.update(init_from=str(out))
    again["training"].update(max_steps=1, schedule="linear", decay_steps=None)
    run(RECIPES["text-pretraining"], again)
    assert json.loads((tmp_path / "again" / "config.json").read_text())["model_type"] == "modernbert"
    # ... but a BERT entry set on the command line is refused, naming the fix.
    ctx = RunContext({"model": {"hidden_size": 64}}, None, None, None, None, str(out), ("model.hidden_size",))
    with pytest.raises(ValueError, match="is a modernbert checkpoint, which decides the architecture: drop those"):
        RECIPES["text-pretraining"].build_model(ctx, None)


@pytest.mark.parametrize(
    "model, data, message",
    [
        (MODERNBERT, {"objectives": {"mlm": 1, "nsp": 1}}, r"no NSP\); set data.objectives: \{mlm: 1\}"),
        (MODERNBERT, {"objectives": {"wwm": 1}}, r"set data.objectives: \{mlm: 1\}"),
        ({**MODERNBERT, "hidden_dropout_prob": 0.1}, {}, r"unknown model config key\(s\) \['hidden_dropout_prob'\]"),
        (
            {**MODERNBERT, "architecture": "deberta"},
            {},
            r"model.architecture='deberta' .* one of \['bert', 'modernbert'\]",
        ),
        ({**MODERNBERT, "local_attention": 200}, {}, "local_attention=200 .* covers every position"),
    ],
)
def test_what_a_modernbert_cannot_train_is_refused_in_one_line(small_corpus, tmp_path, model, data, message):
    with pytest.raises(ValueError, match=message) as refused:
        run(RECIPES["text-pretraining"], config_for(small_corpus, tmp_path / "out", model=model, **data))
    assert "\n" not in str(refused.value)
