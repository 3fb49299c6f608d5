"""``python -m benchmarks text-encoders`` at a tiny size: a BERT row and a ModernBERT row of the same budget, each
trained at its own masking rate and evaluated at the same one (measured on the batches, not read from the config)."""

from __future__ import annotations

import json

import pytest

from benchmarks import text_encoders


def test_both_encoders_are_evaluated_at_the_same_masking_rate(small_corpus, tmp_path, capsys):
    sets = [
        f"data.corpus={small_corpus}",
        f"data.corpus_cache_dir={tmp_path / 'cache'}",
        "data.max_seq_length=32",
        "data.max_eval_batches=2",
        "training.batch_size=8",
        "model.hidden_size=32",  # (keys both architectures have)
        "model.num_attention_heads=2",
        "model.intermediate_size=48",
    ]
    argv = ["--steps", "3", "--workdir", str(tmp_path), *[w for s in sets for w in ("--set", s)]]
    assert text_encoders.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    bert, modern = (json.loads(line) for line in out[:2])
    assert (bert["run"], modern["run"]) == ("bert", "modernbert")
    for key in ("steps", "batch_size", "max_seq_length"):  # the same budget
        assert bert[key] == modern[key] == {"steps": 3, "batch_size": 8, "max_seq_length": 32}[key]
    # Trained at 15% (BERT) and 30% (ModernBERT's recipe), both evaluated at 15%: counted on the batches.
    assert bert["train_masked_share"] == pytest.approx(0.15, abs=0.02)
    assert modern["train_masked_share"] == pytest.approx(0.30, abs=0.02)
    assert bert["eval_masked_share"] == pytest.approx(0.15, abs=0.015)
    assert modern["eval_masked_share"] == pytest.approx(bert["eval_masked_share"], abs=0.015)
    assert (bert["objectives"], modern["objectives"]) == ("mlm+nsp", "mlm")
    assert (modern["optimizer"], modern["schedule"]) == ("stable_adamw", "wsd")
    assert all(0 <= r["eval_mlm_accuracy"] <= 1 and r["steps_per_s"] > 0 for r in (bert, modern))
    table = "\n".join(out[2:])
    assert table.count("\n| bert |") == 1 and table.count("\n| modernbert |") == 1


def test_the_roofline_benchmark_says_where_the_proxy_is_missing(tmp_path):
    """The proxy lives beside a developer's checkout (../shared/gpu/roofline.py), not in the repository."""
    from benchmarks import text_encoder_roofline

    with pytest.raises(FileNotFoundError, match="no roofline proxy at .*; pass its path with --roofline"):
        text_encoder_roofline.main(["--roofline", str(tmp_path / "roofline.py")])
