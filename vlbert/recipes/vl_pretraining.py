"""Vision-language pretraining (``tools/pretrain.py --modality vl``): MLM conditioned on regions, masked region
modelling (MRFR, MRC, MRC-kl) and image-text matching on one shared encoder initialised from BERT (UNITER
section 3), one objective per step drawn from ``data.objectives``.

Embedded default: the easy-VQA images with one caption per image derived from its own annotations ("a blue
circle"); regions from the ``detector`` section, extracted on first use into a cache and reused.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from vlbert.data.corpus import train_eval_split
from vlbert.data.easy_vqa import CAPTION_TEMPLATES, COLORS, SHAPES, captions as easy_vqa_captions
from vlbert.data.pretraining import MaskingCollator
from vlbert.data.vl_pretraining import Caption, VLCollator, VLPretrainingDataset
from vlbert.models.vl import VLBertForPreTraining
from vlbert.objectives import ObjectiveMix
from vlbert.recipes.regions import task_regions
from vlbert.recipes.runner import Recipe, RunContext, TaskData, load_model
from vlbert.utils import evaluation


@dataclass
class VLDataConfig:
    """Image-text data (YAML section ``data``).

    dataset: "easy-vqa" (the embedded default). shards: a directory of region shards to use instead of
    extracting (image ids "train/<n>"). cache_dir: where extracted shards are kept. eval_fraction: images held out.
    max_text_length, max_regions: truncation. objectives: the objective mix (relative frequency of steps; names
    in :data:`vlbert.objectives.OBJECTIVES`). max_images: use only the first N captioned training images (0 = all).
    """

    dataset: str = "easy-vqa"
    max_images: int = 0
    shards: str = ""
    cache_dir: str = "~/.cache/vlbert/regions"
    eval_fraction: float = 0.05
    max_text_length: int = 24
    max_regions: int = 16
    mlm_probability: float = 0.15
    region_mask_probability: float = 0.15
    objectives: dict = field(default_factory=lambda: {"mlm": 2.0, "mrfr": 1.0, "mrc_kl": 1.0, "itm": 1.0})


def easy_vqa_pairs(tokenizer, split: str = "train", seed: int = 0) -> list[Caption]:
    """One caption per easy-VQA image of ``split``, from its colour and shape, with a template chosen per image;
    the content key is "<colour> <shape>"."""
    rng = random.Random(f"captions-{seed}")
    pairs = []
    for image_id, (color, shape) in easy_vqa_captions(split).items():
        text = rng.choice(CAPTION_TEMPLATES).format(color=color, shape=shape)
        pairs.append(Caption(image_id, tokenizer(text, add_special_tokens=False)["input_ids"], f"{color} {shape}"))
    return pairs


class VLPretrainingData(TaskData):
    """Training and held-out batches for the VL objectives.

    Raises:
        ValueError: a dataset other than easy-VQA, an unknown objective, MRC without class distributions.
    """

    eval_batch_factor = 1

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        data, tokenizer = ctx.data, ctx.tokenizer
        if data.dataset != "easy-vqa":
            raise ValueError(f"data.dataset={data.dataset!r}: the built-in image-text data is 'easy-vqa'")
        self.objectives = ObjectiveMix(dict(data.objectives))
        pairs = easy_vqa_pairs(tokenizer, "train", self.seed)
        if data.max_images:
            pairs = pairs[: data.max_images]
        self.regions = task_regions(ctx, [p.image_id for p in pairs] if data.max_images else None)
        any_regions = next(iter(self.regions.values()))
        self.feature_dim = any_regions.feature_dim
        self.num_classes = any_regions.class_probs.shape[1] if any_regions.class_probs is not None else 0
        if not self.num_classes and {"mrc", "mrc_kl"} & set(self.objectives.active):
            raise ValueError("data.objectives has mrc/mrc_kl but the regions have no class distributions; extract "
                             "with a detector that writes them or set their weight to 0")
        self.tokenizer = tokenizer
        train_pairs, self.eval_pairs = train_eval_split(pairs, data.eval_fraction, self.seed)
        self.text = MaskingCollator.from_tokenizer(tokenizer, mlm_probability=data.mlm_probability)
        self.collator = VLCollator(self.text, data.region_mask_probability)
        self.train = VLPretrainingDataset(train_pairs, self.regions, tokenizer, data.max_text_length,
                                          data.max_regions, self.seed)
        if len(self.eval_pairs) >= 2:
            self.eval = VLPretrainingDataset(self.eval_pairs, self.regions, tokenizer, data.max_text_length,
                                             data.max_regions, self.seed + 1)

    @evaluation
    def grounding_accuracy(self, model) -> dict[str, float]:
        """Held-out accuracy of predicting a caption's masked colour or shape word, with the image's regions and
        with every region masked out (region_mask = 0): the gap is what the model reads from the image."""
        from detectors.batch import pad_regions

        word_ids = {self.tokenizer.convert_tokens_to_ids(w) for w in COLORS + SHAPES}
        device = next(model.parameters()).device
        hits = {"with_regions": 0, "without_regions": 0}
        total = 0
        for start in range(0, len(self.eval), 64):
            rows = []
            for k in range(start, min(start + 64, len(self.eval))):
                item = self.eval[k]
                rows += [(item, pos, tid) for pos, tid in enumerate(item["input_ids"]) if tid in word_ids]
            if not rows:
                continue
            batch = self.text.pad([{"input_ids": it["input_ids"]} for it, _, _ in rows])
            batch.update(pad_regions([it for it, _, _ in rows]))
            labels = torch.full_like(batch["input_ids"], -100)
            for i, (_, pos, tid) in enumerate(rows):
                batch["input_ids"][i, pos] = self.tokenizer.mask_token_id
                labels[i, pos] = tid
            batch = {k: v.to(device) for k, v in batch.items()}
            for name, region_mask in (("with_regions", batch["region_mask"]),
                                      ("without_regions", torch.zeros_like(batch["region_mask"]))):
                out = model(**{**batch, "region_mask": region_mask}, labels=labels.to(device))
                hits[name] += int(round(float(out.metrics["mlm_accuracy"]) * out.counts["mlm"]))
            total += len(rows)
        return {f"eval_color_shape_mlm_accuracy_{k}": v / max(total, 1) for k, v in hits.items()}


def build_model(ctx: RunContext, data: VLPretrainingData) -> VLBertForPreTraining:
    """VLBertForPreTraining from ``init_from`` (a BERT checkpoint) or the ``model`` section; region sizes come
    from the shards.

    Raises:
        ValueError: ``model.region_feature_dim`` differs from the shards' feature size.
    """
    model = load_model(VLBertForPreTraining, ctx, region_feature_dim=data.feature_dim,
                       num_region_classes=data.num_classes)
    if model.config.region_feature_dim != data.feature_dim:
        raise ValueError(f"the shards hold {data.feature_dim}-d region features but model.region_feature_dim is "
                         f"{model.config.region_feature_dim}; make them equal")
    return model


def baselines(ctx: RunContext, data: VLPretrainingData, model) -> dict:
    if data.eval is None:
        return {}
    return {k + "_before": v for k, v in data.grounding_accuracy(model).items()}


def evaluate(ctx: RunContext, data: VLPretrainingData, model) -> dict:
    return data.grounding_accuracy(model) if data.eval is not None else {}


RECIPE = Recipe("vl-pretraining", VLDataConfig, VLPretrainingData, build_model, evaluate=evaluate,
                baselines=baselines, uses_regions=True, default_init=None)

__all__ = ["RECIPE", "VLDataConfig", "VLPretrainingData", "easy_vqa_pairs"]
