"""Every shipped run config parses and builds its model (checked on the meta device: no memory is used)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vlbert import BertForPreTraining, ModernBertForMaskedLM
from vlbert.recipes.text_pretraining import ARCHITECTURES, TextDataConfig, read_model_section
from vlbert.training.run_config import dataclass_from_section, load_run_config, set_dotted
from vlbert.training.trainer import TrainingConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "text").glob("*.yaml"))
PAPER_SIZES = {"base": (12, 768, 12, 110e6), "large": (24, 1024, 16, 340e6)}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_is_valid(path):
    run = load_run_config(path)
    TrainingConfig.from_dict(run["training"]).validate()
    data = dataclass_from_section(TextDataConfig, run["data"], "data")
    model = read_model_section(run["model"])
    cls = ARCHITECTURES[model.pop("architecture")]
    config = cls.config_class.from_dict({"vocab_size": 30522, **model}, strict=True)
    assert data.max_seq_length <= config.max_position_embeddings
    if path.stem.startswith("modernbert"):  # MLM only: ModernBERT has no NSP head
        assert cls is ModernBertForMaskedLM and data.running == ("mlm",)
    for size, (layers, hidden, heads, params) in PAPER_SIZES.items():
        if path.stem.startswith(f"bert-{size}"):
            assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (layers, hidden, heads)
            with torch.device("meta"):
                n = BertForPreTraining(config).num_parameters()
            assert abs(n - params) / params < 0.05, f"{n / 1e6:.0f}M parameters vs the paper's {params / 1e6:.0f}M"
            t = run["training"]
            assert t["batch_size"] * t["grad_accum_steps"] == 256


def test_set_dotted_parses_yaml_values():
    config = {"training": {"max_steps": 3}}
    for item in ("training.max_steps=10", "training.learning_rate=5e-4", "data.corpus=my.txt", "x.flag=true"):
        set_dotted(config, item)
    assert config == {
        "training": {"max_steps": 10, "learning_rate": 5e-4},
        "data": {"corpus": "my.txt"},
        "x": {"flag": True},
    }
    with pytest.raises(ValueError, match="key=value"):
        set_dotted(config, "training.max_steps")


def test_config_values_are_type_checked_and_numbers_coerced():
    assert TrainingConfig.from_dict({"learning_rate": "1e-4", "max_steps": "10"}).learning_rate == 1e-4
    with pytest.raises(ValueError, match="training.max_steps must be an int >= 1, got 'ten'"):
        TrainingConfig.from_dict({"max_steps": "ten"})
    with pytest.raises(ValueError, match="training.group_by_length must be a bool"):
        TrainingConfig.from_dict({"group_by_length": "yes"})
    # --set training.mixed_precision=no: YAML 1.1 reads the word as False; a text field takes it as written.
    from vlbert.training.run_config import load_run_config

    section = load_run_config(None, ["training.mixed_precision=no"])["training"]
    assert TrainingConfig.from_dict(section).mixed_precision == "no"


def test_region_tasks_share_one_data_config_and_check_their_datasets(tmp_path):
    from vlbert.recipes import RECIPES
    from vlbert.recipes.nlvr2 import DATASETS as NLVR2_DATASETS
    from vlbert.recipes.nlvr2 import NLVR2DataConfig
    from vlbert.recipes.regions import RegionTaskDataConfig, load_examples
    from vlbert.recipes.vqa import DATASETS as VQA_DATASETS
    from vlbert.recipes.vqa import VQADataConfig

    region_tasks = [r for r in RECIPES.values() if r.uses_regions and r.name != "vl-pretraining"]
    assert len(region_tasks) == 5 and all(issubclass(r.data_config, RegionTaskDataConfig) for r in region_tasks)
    with pytest.raises(ValueError, match="data.dataset must be one of 'easy-vqa', 'vqa-v2', 'gqa', got 'coco'"):
        load_examples(VQA_DATASETS, VQADataConfig(dataset="coco"), 0)
    with pytest.raises(ValueError, match="dataset nlvr2 needs data.train_file, data.eval_file, data.shards"):
        load_examples(NLVR2_DATASETS, NLVR2DataConfig(dataset="nlvr2"), 0)
    (tmp_path / "dev.json").write_text(json.dumps({"identifier": "dev-7-1-0", "sentence": "x", "label": "True"}))
    data = NLVR2DataConfig(
        dataset="nlvr2", train_file=str(tmp_path / "dev.json"), eval_file=str(tmp_path / "dev.json"), shards="regions/"
    )
    train, _ = load_examples(NLVR2_DATASETS, data, 0)
    assert (train[0].left_image, data.image_id_format) == ("dev-7-1-img0", "{stem}-img{k}")  # the dataset's default
    data.image_id_format = "{stem}.img{k}"
    assert load_examples(NLVR2_DATASETS, data, 0)[0][0].right_image == "dev-7-1.img1"  # the user's


def test_base_includes(tmp_path):
    """``_base_``: the bases merged in order, section by section, the including file's own entries winning; a cycle
    or a missing base is one error naming the files. The easy-VQA configs share one detector file."""
    from vlbert.training.run_config import load_run_config

    (tmp_path / "det.yaml").write_text("detector: {backend: timm, input_size: 160, max_proposals: 16}\n")
    (tmp_path / "train.yaml").write_text("training: {batch_size: 8, max_steps: 10}\n")
    (tmp_path / "run.yaml").write_text("_base_: [det.yaml, train.yaml]\ntraining: {max_steps: 3}\n")
    config = load_run_config(tmp_path / "run.yaml", ["detector.max_proposals=8"])
    assert config == {
        "detector": {"backend": "timm", "input_size": 160, "max_proposals": 8},
        "training": {"batch_size": 8, "max_steps": 3},
    }
    (tmp_path / "a.yaml").write_text("_base_: b.yaml\n")
    (tmp_path / "b.yaml").write_text("_base_: a.yaml\n")
    with pytest.raises(ValueError, match="cycle"):
        load_run_config(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("_base_: missing.yaml\n")
    with pytest.raises(FileNotFoundError, match="missing.yaml does not exist .included by .*c.yaml"):
        load_run_config(tmp_path / "c.yaml")
    root = Path(__file__).resolve().parents[2] / "configs"
    shared = load_run_config(root / "detectors" / "easy-vqa.yaml")["detector"]
    for path in [root / "vl" / "default.yaml", *sorted((root / "finetune").glob("*easy-vqa.yaml"))]:
        assert load_run_config(path)["detector"] == shared, path


def test_the_modernbert_recipe_is_modernberts_yaml():
    """configs/text/modernbert-base-1024.yaml against AnswerDotAI/ModernBERT at 00220af2,
    yamls/modernbert/modernbert-base-pretrain.yaml (and the decay run's yaml), steps at 4608 x 1024 tokens."""
    run = load_run_config(CONFIGS[0].parent / "modernbert-base-1024.yaml")
    training = TrainingConfig.from_dict(run["training"])
    data = dataclass_from_section(TextDataConfig, run["data"], "data")
    tokens_per_step = 4608 * 1024
    assert training.batch_size * training.grad_accum_steps == 4608 and data.max_seq_length == 1024
    assert (training.optimizer, training.learning_rate, training.adam_beta1, training.adam_beta2) == (
        "stable_adamw",
        8e-4,
        0.9,
        0.98,
    )
    assert (training.adam_epsilon, training.weight_decay, training.max_grad_norm) == (1e-6, 1e-5, 0.0)
    assert (training.schedule, training.warmup_steps) == ("wsd", round(3e9 / tokens_per_step))
    assert training.max_steps - training.decay_steps == round(1.719e12 / tokens_per_step)  # the stable phase ends
    assert (training.decay_steps, training.decay_shape, training.final_lr_ratio) == (
        round(50e9 / tokens_per_step),
        "1-sqrt",
        0.001,
    )
    assert (data.objectives, data.mlm_probability, data.eval_mlm_probability) == ({"mlm": 1}, 0.3, 0.15)
    model = read_model_section(run["model"])
    assert model.pop("architecture") == "modernbert"
    config = ModernBertForMaskedLM.config_class.from_dict({"vocab_size": 50368, **model}, strict=True)
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.num_attention_heads) == (
        22,
        768,
        1152,
        12,
    )
    assert (config.local_attention, config.layer_types[:4]) == (
        128,
        ["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
    )
    assert (config.global_rope_theta, config.local_rope_theta) == (10_000.0, 10_000.0)  # 160,000: after extension
    assert not (config.norm_bias or config.attention_bias or config.mlp_bias) and config.hidden_activation == "gelu"
    with torch.device("meta"):  # ModernBERT-base: 149M parameters with its 50,368-piece vocabulary (its model card)
        n = ModernBertForMaskedLM(config).num_parameters()
    assert abs(n - 149e6) / 149e6 < 0.02, f"{n / 1e6:.1f}M"
