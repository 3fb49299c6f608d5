"""Vision-language pretraining (``tools/pretrain.py --modality vl``): MLM conditioned on regions, masked region
modelling (MRFR, MRC-kl) and image-text matching on one shared encoder initialised from BERT (UNITER section 3).

Embedded default: the easy-VQA images with one caption per image derived from its own annotations ("a blue
circle"); regions from Felzenszwalb proposals + the whole-image box, features and class distributions from the
offline EfficientNet-Lite0 ImageNet backbone (see :mod:`detectors.backbone`). Shards are extracted on first use
into a cache directory and reused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from detectors.shards import load_regions, write_shards
from vlbert.utils import evaluation
from vlbert.config import VLBertConfig
from vlbert.data.corpus import train_eval_split
from vlbert.data.easy_vqa import CAPTION_TEMPLATES, captions as easy_vqa_captions, image_paths
from vlbert.data.loading import eval_loader, train_loader
from vlbert.data.pretraining import MaskingCollator
from vlbert.data.vl_pretraining import TASKS, Caption, VLCollator, VLPretrainingDataset, pad_regions
from vlbert.models.vl import VLBertForPreTraining
from vlbert.tokenization import check_tokenizer_matches, load_tokenizer, resolve_tokenizer_path
from vlbert.training.run_config import check_sections, dataclass_from_section
from vlbert.training.trainer import Trainer, TrainingConfig, set_seed

logger = logging.getLogger(__name__)

TOP_LEVEL_KEYS = ("modality", "init_from", "tokenizer", "model", "data", "detector", "training")


@dataclass
class DetectorConfig:
    """How regions are extracted (YAML section ``detector``): the offline timm backbone + Felzenszwalb proposals.

    input_size: backbone input (pixels, square); roi_output_size: RoIAlign grid; max_proposals: boxes per image
    including the whole image; low_level_stage: also pool this early backbone stage and append it (keeps colour;
    -1 = final stage only).
    """

    backend: str = "timm"
    input_size: int = 160
    roi_output_size: int = 3
    max_proposals: int = 16
    low_level_stage: int = 2

    def build(self, device: str = "cpu"):
        """The extractor this config describes. Raises ValueError for an unknown backend."""
        if self.backend != "timm":
            raise ValueError(f"detector.backend={self.backend!r}: the built-in pretraining data extracts with 'timm'; "
                             "extract other backends with tools/extract_regions.py and set data.shards")
        from functools import partial

        from detectors.backbone import BackboneRegionExtractor
        from detectors.proposals import felzenszwalb_proposals

        return BackboneRegionExtractor(input_size=self.input_size, roi_output_size=self.roi_output_size,
                                       proposals=partial(felzenszwalb_proposals, max_proposals=self.max_proposals),
                                       device=device,
                                       low_level_stage=self.low_level_stage if self.low_level_stage >= 0 else None)

    def fingerprint(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


@dataclass
class VLDataConfig:
    """Image-text data (YAML section ``data``).

    dataset: "easy-vqa" (the embedded default). shards: a directory of region shards to use instead of
    extracting (image ids "train/<n>"). cache_dir: where extracted shards are kept. eval_fraction: images held out.
    max_text_length, max_regions: truncation. task_weights: objective mix (relative frequency of batches).
    max_images: use only the first N captioned training images (0 = all), e.g. for a quick run.
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
    task_weights: dict = field(default_factory=lambda: {"mlm": 2.0, "mrfr": 1.0, "mrc": 1.0, "itm": 1.0})


def easy_vqa_shards(detector: DetectorConfig, cache_dir: str | Path, image_ids: list[str] | None = None) -> list[Path]:
    """Region shards of the easy-VQA images (default all, train and test), extracted once per detector config
    and image set, and cached. A ``complete.json`` marker is written last, so an interrupted extraction is
    redone, never half-used."""
    from PIL import Image
    from tqdm.auto import tqdm

    paths = {**image_paths("train"), **image_paths("test")}
    tag = detector.fingerprint()
    if image_ids is not None:
        paths = {i: paths[i] for i in image_ids}
        tag += "-" + hashlib.sha1("\n".join(image_ids).encode()).hexdigest()[:8]
    directory = Path(cache_dir).expanduser() / f"easy-vqa-{tag}"
    marker = directory / "complete.json"
    if marker.is_file():
        return [directory / name for name in json.loads(marker.read_text())["shards"]]
    extractor = detector.build()
    logger.info("extracting regions of %d easy-VQA images into %s (first use only)", len(paths), directory)

    def regions(batch_size: int = 32):
        items = list(paths.items())
        with tqdm(total=len(items), desc="extract regions", unit="img", dynamic_ncols=True) as bar:
            for start in range(0, len(items), batch_size):
                chunk = items[start:start + batch_size]
                images = [Image.open(path).convert("RGB") for _, path in chunk]
                yield from extractor.extract_batch(images, [image_id for image_id, _ in chunk])
                bar.update(len(chunk))

    shards = write_shards(regions(), directory)
    marker.write_text(json.dumps({"detector": extractor.name, "config": asdict(detector),
                                  "shards": [p.name for p in shards], "images": len(paths)}, indent=2))
    return shards


def easy_vqa_pairs(tokenizer, split: str = "train", seed: int = 0) -> list[Caption]:
    """One caption per easy-VQA image of ``split``, from its colour and shape, with a template chosen per image."""
    rng = random.Random(f"captions-{seed}")
    pairs = []
    for image_id, (color, shape) in easy_vqa_captions(split).items():
        text = rng.choice(CAPTION_TEMPLATES).format(color=color, shape=shape)
        pairs.append(Caption(image_id, tokenizer(text, add_special_tokens=False)["input_ids"], text))
    return pairs


class VLPretrainingData:
    """Training and held-out batches for the VL objectives."""

    def __init__(self, data: VLDataConfig, detector: DetectorConfig, tokenizer, batch_size: int, seed: int = 0,
                 loader_options: dict | None = None):
        if data.dataset != "easy-vqa":
            raise ValueError(f"data.dataset={data.dataset!r}: the built-in image-text data is 'easy-vqa'")
        pairs = easy_vqa_pairs(tokenizer, "train", seed)
        if data.max_images:
            pairs = pairs[: data.max_images]
        if data.shards:
            shards = sorted(Path(data.shards).glob("*.tar"))
        else:
            shards = easy_vqa_shards(detector, data.cache_dir, [p.image_id for p in pairs] if data.max_images else None)
        if not shards:
            raise FileNotFoundError(f"no region shards (*.tar) in {data.shards}")
        self.regions = load_regions(shards)
        self.tokenizer = tokenizer
        train_pairs, eval_pairs = train_eval_split(pairs, data.eval_fraction, seed)
        self.text = MaskingCollator.from_tokenizer(tokenizer, mlm_probability=data.mlm_probability)
        self.collator = VLCollator(self.text, dict(data.task_weights), data.region_mask_probability)
        self.train = VLPretrainingDataset(train_pairs, self.regions, tokenizer, data.max_text_length,
                                          data.max_regions, seed)
        self.eval = VLPretrainingDataset(eval_pairs, self.regions, tokenizer, data.max_text_length,
                                         data.max_regions, seed + 1) if len(eval_pairs) >= 2 else None
        self.eval_pairs = eval_pairs
        self.batch_size, self.seed = batch_size, seed
        self.loader_options = loader_options or {}
        any_regions = next(iter(self.regions.values()))
        self.feature_dim = any_regions.feature_dim
        self.num_classes = any_regions.class_probs.shape[1] if any_regions.class_probs is not None else 0

    def train_batches(self, epoch: int, start: int, rank: int, world_size: int):
        return train_loader(self.train, self.collator, self.batch_size, self.seed, epoch, start, rank, world_size,
                            **self.loader_options)

    def eval_batches(self):
        """Every held-out batch once per active task (fixed masking)."""
        for task in TASKS:
            if self.collator.task_weights.get(task, 0) <= 0 or (task == "mrc" and not self.num_classes):
                continue
            yield from eval_loader(self.eval, VLCollator(self.text, self.collator.task_weights,
                                                         self.collator.region_mask_probability, force_task=task),
                                   self.batch_size)

    @evaluation
    def grounding_accuracy(self, model) -> dict[str, float]:
        """Held-out accuracy of predicting a caption's masked colour or shape word, with the image's regions and
        with every region masked out (region_mask = 0): the gap is what the model reads from the image."""
        from vlbert.data.easy_vqa import COLORS, SHAPES

        word_ids = {self.tokenizer.convert_tokens_to_ids(w) for w in COLORS + SHAPES}
        device = next(model.parameters()).device
        hits = {"with_regions": 0, "without_regions": 0}
        total = 0
        for start in range(0, len(self.eval_pairs), 64):
            rows = []
            for k in range(start, min(start + 64, len(self.eval_pairs))):
                item = self.eval[k]
                for pos, tid in enumerate(item["input_ids"]):
                    if tid in word_ids:
                        rows.append((item, pos, tid))
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


def build_vl_model(run_config: dict[str, Any], tokenizer, feature_dim: int, num_classes: int) -> VLBertForPreTraining:
    """VLBertForPreTraining from ``init_from`` (a BERT checkpoint; "minilm" = the packaged one) or from the
    ``model`` section; region sizes come from the shards."""
    model_section = dict(run_config.get("model") or {})
    model_section.setdefault("region_feature_dim", feature_dim)
    model_section.setdefault("num_region_classes", num_classes)
    init_from = run_config.get("init_from")
    if init_from:
        model = VLBertForPreTraining.from_pretrained(resolve_tokenizer_path(init_from), **model_section)
    else:
        model_section.setdefault("vocab_size", len(tokenizer))
        model = VLBertForPreTraining(VLBertConfig.from_dict(model_section, strict=True))
    if model.config.region_feature_dim != feature_dim:
        raise ValueError(f"the shards hold {feature_dim}-d region features but model.region_feature_dim is "
                         f"{model.config.region_feature_dim}; make them equal")
    check_tokenizer_matches(tokenizer, model.config)
    return model


def run_vl_pretraining(run_config: dict[str, Any], resume: bool = False) -> dict[str, Any]:
    """Pretrain the VL model as ``run_config`` says; returns the final metrics (also in metrics.json)."""
    check_sections(run_config, TOP_LEVEL_KEYS)
    # Batches carry one objective each, so a step leaves the other heads unused: DDP must expect that.
    training = TrainingConfig.from_dict({"find_unused_parameters": True, **(run_config.get("training") or {})})
    data_config = dataclass_from_section(VLDataConfig, run_config.get("data"), "data")
    detector = dataclass_from_section(DetectorConfig, run_config.get("detector"), "detector")
    tokenizer = load_tokenizer(resolve_tokenizer_path(run_config.get("tokenizer") or run_config.get("init_from")))
    data = VLPretrainingData(data_config, detector, tokenizer, training.batch_size, seed=training.seed,
                             loader_options=training.loader_options())
    set_seed(training.seed)
    model = build_vl_model(run_config, tokenizer, data.feature_dim, data.num_classes)
    logger.info("VL model: %.1fM parameters; %d training pairs, %d held-out", model.num_parameters() / 1e6,
                len(data.train), len(data.eval) if data.eval else 0)
    trainer = Trainer(model, training, data.train_batches, data.eval_batches if data.eval else None,
                      run_config=run_config, tokenizer=tokenizer)
    if resume and not trainer.resume():
        logger.warning("--resume: no checkpoint under %s/checkpoints; starting from step 0", training.output_dir)
    before = {k + "_before": v for k, v in data.grounding_accuracy(trainer.unwrapped).items()} if data.eval else {}
    extra = dict(before)
    metrics = trainer.train(extra_metrics=extra, final_metrics=lambda model: data.grounding_accuracy(model))
    return metrics


__all__ = ["run_vl_pretraining", "VLDataConfig", "DetectorConfig", "VLPretrainingData", "easy_vqa_shards",
           "easy_vqa_pairs", "build_vl_model"]
