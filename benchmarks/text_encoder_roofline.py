"""The roofline proxy's predicted H100 training step of ModernBERT-base beside BERT-base (issue 67 item 4).

    python -m benchmarks text-encoder-roofline [--roofline ../shared/gpu/roofline.py] [--shapes 256x128 32x1024]

``../shared/gpu/roofline.py`` (beside a developer's checkout; not in the repository) traces one steady-state step
on fake CUDA tensors and prices each aten op on an H100; its ``--model text`` builds ``BertForPreTraining`` only.
This benchmark imports it and gives its ``trace`` a text step of any text pretraining architecture
(:data:`vlbert.recipes.text_pretraining.ARCHITECTURES`): the model of a run config's ``model`` section
(``configs/text/bert-base-128.yaml``, ``configs/text/modernbert-base-1024.yaml``; vocabulary, [PAD], [CLS] and
[SEP] from the packaged tokenizer, max_position_embeddings raised to the shape's length where it is shorter) on
the BBC News pairs of ``tools/benchmark.py``, masked as the recipe does (the config's objectives: MLM + NSP for BERT,
MLM for ModernBERT) in a padded batch: the proxy's batch holds tensors only, so both models compute the unpadded
layout in the step (one host sync each; roofline.py's own BERT step has it from the collator). Both run with the project's default
attention kernel on CUDA, bf16 autocast over float32 weights and fused AdamW (the proxy's optimizer for every
model). Prints one JSON line per (config, shape): predicted step ms, GPU-busy ms, matmul and attention ms, real
tokens and the proxy's warnings. The proxy's MFU counts BERT's FLOPs per token and is left out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from functools import partial
from pathlib import Path
from unittest import mock

import torch

from vlbert.data.pretraining import MaskingCollator
from vlbert.recipes.text_pretraining import ARCHITECTURES, TextDataConfig, read_model_section
from vlbert.training.run_config import dataclass_from_section, load_run_config

#: The checkout's root (roofline.py is run from it, and finds tools/benchmark.py there).
ROOT = Path(__file__).resolve().parents[1]
#: The configs compared: BERT-base (phase 1) and ModernBERT-base.
CONFIGS = ("text/bert-base-128", "text/modernbert-base-1024")


def load_roofline(path: Path):
    """The roofline proxy's module from ``path``.

    Raises:
        FileNotFoundError: no file at ``path`` (it lives beside a developer's checkout, not in the repository).
    """
    if not path.is_file():
        raise FileNotFoundError(
            f"no roofline proxy at {path}: it lives beside a developer's checkout (../shared/gpu/roofline.py); "
            "pass its path with --roofline"
        )
    spec = importlib.util.spec_from_file_location("roofline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def text_step(impl, batch_size, seq_len, pad_fraction, config_path, attn, tok):
    """roofline's ``text_step`` for any text architecture: (model factory, batch, config, positions per row)."""
    from benchmarks.train import bbc_news_pairs

    run = load_run_config(config_path)
    section = read_model_section(run.get("model"))
    cls = ARCHITECTURES[section.pop("architecture")]
    seq = seq_len or run.get("data", {}).get("max_seq_length", 128)
    section["max_position_embeddings"] = max(section.get("max_position_embeddings", 512), seq)
    ids = {"vocab_size": len(tok), "pad_token_id": tok.pad_token_id}
    if cls.config_class.model_type == "modernbert":
        ids.update(cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id)
        ids["eos_token_id"] = tok.sep_token_id
    config = cls.config_class.from_dict({**section, **ids}, strict=True)
    objectives = dataclass_from_section(TextDataConfig, run.get("data"), "data").running
    data = bbc_news_pairs(tok, seq)
    collate = MaskingCollator.from_tokenizer(tok, objectives=objectives)  # tensors only: the layout in the step
    batch = collate([data[i] for i in range(batch_size)])
    return partial(build, cls, config), batch, config, batch["input_ids"].shape[1]


def build(cls, config):
    """``cls(config)`` on the proxy's fake tensors: a truncated-normal initialisation (ModernBERT's) reads values,
    which fake tensors have not, so it is skipped (the values never matter to the trace)."""
    with mock.patch.object(torch.nn.init, "trunc_normal_", lambda tensor, *args, **kwargs: tensor):
        return cls(config)


def predict(roofline, config_path: str, batch_size: int, seq_len: int) -> dict:
    """The proxy's prediction for one step of ``config_path``'s model at ``batch_size`` x ``seq_len``."""
    roofline.text_step = text_step  # trace() calls it by name
    ops, config, real, seq = roofline.trace("vlbert", batch_size, seq_len, None, config_path, "sdpa", False, str(ROOT))
    res = roofline.predict(ops, config, real, seq, roofline.HOST_US["vlbert"])
    return {
        "config": config_path,
        "batch": [batch_size, seq],
        "real_tokens": real,
        **{k: round(res[k], 2) for k in ("step_ms", "gpu_busy_ms", "matmul_ms", "attention_ms", "host_ms")},
        "warnings": res["warnings"],
    }


def main(argv=None) -> int:
    """Run the benchmark with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit status
    (0). Errors propagate for :func:`vlbert.commands.run_tool` to report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--roofline", type=Path, default=ROOT.parent / "shared" / "gpu" / "roofline.py")
    p.add_argument("--shapes", nargs="+", default=["256x128", "32x1024"], help="batch x length, e.g. 256x128")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS))
    args = p.parse_args(argv)
    shapes = []
    for shape in args.shapes:
        b, _, s = shape.partition("x")
        if not (b.isdigit() and s.isdigit()):
            p.error(f"--shapes takes BATCHxLENGTH, e.g. 256x128; got {shape!r}")
        shapes.append((int(b), int(s)))
    roofline = load_roofline(args.roofline)
    roofline.emulate_device((9, 0))
    for b, s in shapes:
        for config in args.configs:
            print(json.dumps(predict(roofline, str(ROOT / "configs" / f"{config}.yaml"), b, s)), flush=True)
    return 0


__all__ = ["CONFIGS", "ROOT", "main", "build", "load_roofline", "predict", "text_step"]
