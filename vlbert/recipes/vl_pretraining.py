"""Vision-language pretraining (``vlbert pretrain --modality vl``): MLM conditioned on regions, masked region
modelling (MRFR, MRC, MRC-kl) and image-text matching on one shared encoder initialised from BERT (UNITER
section 3), one objective per step drawn from ``data.objectives``.

Data: ``data.sources``, a list of caption files each with its region shards (COCO captions JSON, Karpathy JSON,
Conceptual-Captions TSV, JSONL, a ``datasets`` name, LXMERT's JSON with its questions and answers for the ``qa``
unit; :mod:`vlbert.data.captions`), mixed with weights as UNITER
mixes COCO, VG, CC and SBU. Regions are read from disk per sample (:class:`vlbert.detectors.store.RegionStore`).
Embedded default (no ``sources``): the easy-VQA images with one caption per image derived from its own annotations
("a blue circle"); regions from the ``detector`` section, extracted on first use into a cache and reused.
"""

from __future__ import annotations

import functools
import logging
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Annotated, Literal

import torch

from vlbert.common.typed_config import Range, Takes, check_fields, from_section
from vlbert.data import captions as caption_files
from vlbert.data.corpus import train_eval_split
from vlbert.data.easy_vqa import CAPTION_TEMPLATES, COLORS, SHAPES, color_and_shape, first_images, load_questions
from vlbert.data.pretraining import MaskingCollator
from vlbert.data.vl_pretraining import Caption, VLCollator, VLPretrainingDataset, caption_content
from vlbert.detectors.store import NamespacedRegions, RegionStore
from vlbert.models.vl import VLBertForPreTraining
from vlbert.objectives import OBJECTIVES, ObjectiveMix, units_for
from vlbert.objectives.image_text_matching import NEGATIVES
from vlbert.objectives.momentum import MomentumOptions
from vlbert.processing import RegionSource
from vlbert.processing.regions import pad_regions
from vlbert.recipes.init_from import load_model
from vlbert.recipes.regions import (
    Count,
    ImageSide,
    Positive,
    TextLength,
    attach_images,
    region_store,
)
from vlbert.recipes.run_processor import build_run_processor
from vlbert.recipes.runner import Recipe, RunContext, TaskData
from vlbert.recipes.vl_baselines import TrainingPriors, held_out_baselines, itm_loss_chance, training_priors
from vlbert.training.momentum import MomentumDistillation
from vlbert.utils import GatherBounds, evaluation

logger = logging.getLogger(__name__)


SOURCE_FORMATS = ("easy-vqa",) + caption_files.CAPTION_FORMATS
_DEFAULT_ID_FORMAT = {
    "coco": "{image_id}",
    "karpathy": "{filename}",
    "tsv": "{key}",
    "jsonl": "{image_id}",
    "hf": "{image_id}",
    "lxmert": "{img_id}",
    "easy-vqa": "",
}


@dataclass
class CaptionSource:
    """One image-text source (an entry of ``data.sources``).

    name: a short name (prefixes its image ids when several sources mix: "coco/391895").
    format: "coco" (captions_*.json), "karpathy" (dataset_coco.json), "tsv" (caption<TAB>image key), "jsonl"
        ({"image_id", "caption"} lines), "hf" (a ``datasets`` name, online), "lxmert" (LXMERT's pretraining JSON:
        captions and questions with answers) or "easy-vqa" (the embedded images).
    path: the caption file (or the ``datasets`` name).
    shards: the directory of region shards of its images (easy-VQA: empty = extract with the run's detector).
    image_id_format: the shards' image id from the record's fields (:mod:`vlbert.data.captions`), e.g.
        "COCO_train2014_{image_id:012d}" for LXMERT's TSV features; default per format.
    weight: how often its captions are seen per epoch relative to once (UNITER-style mixing): 2 = twice, 0.5 = a
        seeded half.
    split: the Karpathy or ``datasets`` split; image_field, caption_field: JSONL / ``datasets`` columns.
    Raises:
        ValueError: an unknown format, no path for a file format, no shards, a weight <= 0.
    """

    name: str
    format: str
    path: str = ""
    shards: str = ""
    image_id_format: str = ""
    weight: Annotated[float, Range(gt=0)] = 1.0
    split: str = "train"
    image_field: str = "image_id"
    caption_field: str = "caption"

    def __post_init__(self) -> None:
        where = f"data.sources[{self.name!r}]"
        if self.format not in SOURCE_FORMATS:
            raise ValueError(f"{where}.format must be one of {SOURCE_FORMATS}, got {self.format!r}")
        if self.format != "easy-vqa" and not (self.path and self.shards):
            raise ValueError(
                f"{where} needs path (the caption file) and shards (its images' region shards, from vlbert extract)"
            )
        if not self.weight > 0:
            raise ValueError(f"{where}.weight must be > 0, got {self.weight}")
        if "/" in self.name or not self.name:
            raise ValueError(f"{where}.name must be a non-empty name without '/'")
        self.image_id_format = self.image_id_format or _DEFAULT_ID_FORMAT[self.format]

    def captioned_images(self) -> list[caption_files.CaptionedImage]:
        """The source's images and captions, under the shards' image ids."""
        f = caption_files
        if self.format == "coco":
            return f.load_coco_captions(self.path, self.image_id_format)
        if self.format == "karpathy":
            return f.load_karpathy_split(self.path, self.split, self.image_id_format)
        if self.format == "tsv":
            return f.load_caption_tsv(self.path, self.image_id_format)
        if self.format == "lxmert":
            return f.load_lxmert_json(self.path, self.image_id_format)
        if self.format == "jsonl":
            return f.load_caption_jsonl(self.path, self.image_id_format, self.image_field, self.caption_field)
        return f.load_hf_captions(self.path, self.split, self.image_id_format, self.image_field, self.caption_field)


@dataclass
class VLDataConfig:
    """Image-text data (YAML section ``data``).

    sources: the image-text sources (:class:`CaptionSource` fields); empty = the embedded easy-VQA source built from
    ``dataset``/``shards``. missing_regions: "error" (default: the count and first ids of captions whose image
    has no regions) or "skip" (dropped, counted in metrics.json as ``captions_without_regions_<source>``).
    dataset: "easy-vqa" (the embedded default). shards: a directory of region shards to use instead of
    extracting (image ids "train/<n>"). cache_dir: where extracted shards are kept. eval_fraction: images held out.
    max_text_length, max_regions: truncation. objectives: the objective mix (relative frequency of steps; names
    in :data:`vlbert.objectives.OBJECTIVES`; ``wra`` is a loss weight on ``itm`` batches). max_images: use only the
    first N images per source (0 = all; easy-VQA: the split's first N, those with a caption, and the regions of all
    N are extracted, the set a VQA run with ``data.max_train_images: N`` reads). easy_vqa_questions: questions per
    image added to the embedded easy-VQA source with their answers (the ``qa`` unit's data; 0 = captions only).
    itm_negatives: "random" (UNITER), "hard" (drawn from the global batch by the encoder's own unimodal similarity)
    or "itc" (ALBEF's: one negative image per caption and one negative caption per image, drawn by the ``itc``
    head's similarity; :mod:`vlbert.objectives.image_text_matching`). itc: ALBEF's momentum model, queue and
    distillation weights (:class:`~vlbert.objectives.momentum.MomentumOptions`; all off by default). image_dir, image_preprocessing, image_short_side,
    image_max_side: the images of a model with a ``visual_backbone``, as
    :class:`~vlbert.recipes.regions.RegionTaskDataConfig`'s (with several sources an image is
    ``<image_dir>/<source name>/<image id>``).
    Raises:
        ValueError: a source that is not valid (:class:`CaptionSource`), two with one name, ``missing_regions``
            other than error/skip, ``itm_negatives`` other than random/hard/itc, a negative ``easy_vqa_questions``;
            ``itm_negatives: itc`` without ``itc`` in the mix or with ``wra``; ``data.itc`` as
            :class:`~vlbert.objectives.momentum.MomentumOptions` refuses.
    """

    dataset: str = "easy-vqa"
    max_images: Count = 0
    easy_vqa_questions: Count = 0
    shards: str = ""
    sources: list[CaptionSource] = field(default_factory=list)
    missing_regions: Literal["error", "skip"] = "error"
    cache_dir: str = "~/.cache/vlbert/regions"
    eval_fraction: Annotated[float, Range(ge=0, lt=1)] = 0.05
    max_text_length: TextLength = 24
    max_regions: Positive = 16
    mlm_probability: Annotated[float, Range(ge=0, le=1)] = 0.15
    region_mask_probability: Annotated[float, Range(ge=0, le=1)] = 0.15
    objectives: Annotated[
        dict[str, float], Takes("a mapping of objective name to weight (relative frequency), e.g. {mlm: 2, itm: 1}")
    ] = field(default_factory=lambda: {"mlm": 2.0, "mrfr": 1.0, "mrc_kl": 1.0, "itm": 1.0})
    itm_negatives: str = "random"
    itc: MomentumOptions = field(default_factory=MomentumOptions)
    image_dir: str = ""
    image_preprocessing: str = ""
    image_short_side: ImageSide = 0
    image_max_side: ImageSide = 0

    def __post_init__(self) -> None:
        self.sources = [
            from_section(CaptionSource, s, f"data.sources[{i}]") if isinstance(s, dict) else s
            for i, s in enumerate(self.sources)
        ]  # (entries given as mappings in Python)
        check_fields(self, "data")
        if self.itm_negatives not in NEGATIVES:
            raise ValueError(f"data.itm_negatives must be one of {NEGATIVES}, got {self.itm_negatives!r}")
        if self.itm_negatives == "itc" and not self.objectives.get("itc", 0) > 0:
            raise ValueError(
                "data.itm_negatives: itc draws by the itc head's similarity: add itc to data.objectives "
                "(e.g. {mlm: 1, itm: 1, itc: 1}) or use itm_negatives: hard"
            )
        if self.itm_negatives == "itc" and self.objectives.get("wra", 0) > 0:
            raise ValueError(
                "data.itm_negatives: itc makes three ITM rows per pair, which wra does not read; set wra's weight "
                "to 0 or use itm_negatives: hard"
            )
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"data.sources names must differ, got {names}")


def easy_vqa_captions(
    tokenizer, split: str = "train", seed: int = 0, questions: int = 0, max_images: int = 0
) -> list[Caption]:
    """One caption per easy-VQA image of ``split``, from its colour and shape, with a template chosen per image;
    the content key is "<colour> <shape>". With ``questions`` > 0, each image also brings up to that many of its
    own questions (drawn with the seed) with their answer at score 1: the ``qa`` unit's data, as LXMERT's corpus
    holds the VQA, GQA and VG-QA questions of its images beside their captions (Tan and Bansal 2019, section 3.2).
    ``max_images``: only the first N images of the split (0 = all; :func:`~vlbert.data.easy_vqa.first_images`,
    the images whose regions a VQA run with ``data.max_train_images: N`` reads too), each with its caption and
    questions; those whose colour or shape their questions leave unknown (about one in nine) have no caption."""
    rng, ask = random.Random(f"captions-{seed}"), random.Random(f"questions-{seed}")
    images = list(color_and_shape(split).items())
    if max_images:
        first = set(first_images(split, max_images))
        images = [(image_id, attributes) for image_id, attributes in images if image_id in first]
    asked: dict[str, list] = {}
    if questions:
        for q in load_questions(split):
            asked.setdefault(q.image_id, []).append(q)
    texts = []
    for image_id, (color, shape) in images:
        texts.append((image_id, rng.choice(CAPTION_TEMPLATES).format(color=color, shape=shape), f"{color} {shape}", ()))
        own = asked.get(image_id, [])
        for q in ask.sample(own, min(questions, len(own))):
            texts.append((image_id, q.question, caption_content(q.question), ((q.answer, 1.0),)))
    ids = tokenizer(
        [t for _, t, _, _ in texts], add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False
    )["input_ids"]
    return [
        Caption(image_id, token_ids, content, answers)
        for (image_id, _, content, answers), token_ids in zip(texts, ids, strict=True)
    ]


class VLPretrainingData(TaskData):
    """Training and held-out batches for the VL objectives.

    Raises:
        ValueError: a dataset other than easy-VQA, an unknown objective, MRC without class distributions, ``qa``
            without a question with answers in any source.
    """

    eval_batch_factor = 1

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        data, tokenizer = ctx.data, ctx.tokenizer
        if not data.sources and data.dataset != "easy-vqa":
            raise ValueError(
                f"data.dataset={data.dataset!r}: the built-in image-text data is 'easy-vqa'; give other "
                "data as data.sources (caption files + region shards)"
            )
        self.objectives = ObjectiveMix(dict(data.objectives))
        runnable = [unit.name for unit in units_for("vl")]
        cannot = [name for name in self.objectives.active + self.objectives.paired if name not in runnable]
        if cannot:
            raise ValueError(
                f"data.objectives has {cannot}, which a vision-language pretraining model cannot run; "
                f"choose among {runnable}"
            )
        sources = data.sources or [CaptionSource("easy-vqa", "easy-vqa", shards=data.shards)]
        self.easy_vqa_only = all(s.format == "easy-vqa" for s in sources)
        # The run's detector made the regions only where it extracted them itself (no shards given).
        self.extracted_by_detector = self.easy_vqa_only and not any(s.shards for s in sources)
        self.skipped: dict[str, int] = {}
        stores, pairs = {}, []
        for source in sources:
            source_pairs, stores[source.name] = self._load_source(ctx, source)
            if len(sources) > 1:
                source_pairs = [replace(p, image_id=f"{source.name}/{p.image_id}") for p in source_pairs]
            pairs += _weighted(source_pairs, source.weight, random.Random(f"mix-{self.seed}-{source.name}"))
        self.regions = stores[sources[0].name] if len(sources) == 1 else NamespacedRegions(stores)
        any_regions = next(iter(self.regions.values()))
        self.num_classes = any_regions.class_probs.shape[1] if any_regions.class_probs is not None else 0
        if not self.num_classes and {"mrc", "mrc_kl"} & set(self.objectives.active):
            raise ValueError(
                "data.objectives has mrc/mrc_kl but the regions have no class distributions; extract "
                "with a detector that writes them or set their weight to 0"
            )
        self.qa_answers = (
            qa_vocabulary(pairs, ctx.model_section.get("num_qa_labels") or 0) if "qa" in self.objectives.active else []
        )
        if "qa" in self.objectives.active and not self.qa_answers:
            raise ValueError(
                "data.objectives has qa (image question answering) but no source holds questions with "
                "answers: add a source of format lxmert whose records have 'labelf' (LXMERT's "
                "data/lxmert/*.json; on the embedded easy-VQA data set "
                "data.easy_vqa_questions: 1), or set qa's weight to 0"
            )
        # the run's processor: the regions' source, the tokenizer and the limits every dataset takes
        source = RegionSource.from_store(self.regions, ctx.detector if self.extracted_by_detector else None)
        self.processor = build_run_processor(ctx, self, source)
        self.tokenizer = tokenizer = self.processor.tokenizer
        # Held out by image (all captions of an image on one side), images in order of first appearance.
        _, eval_images = train_eval_split(list(dict.fromkeys(p.image_id for p in pairs)), data.eval_fraction, self.seed)
        held = set(eval_images)
        train_pairs = [p for p in pairs if p.image_id not in held]
        self.eval_pairs = [p for p in pairs if p.image_id in held]
        self.text = MaskingCollator.from_tokenizer(tokenizer, mlm_probability=data.mlm_probability, unpadded=True)
        # what any rank's batch holds at most (train and held-out batches alike: eval_batch_factor), for the gathers
        # of the global batch (ITM's hard and itc negatives, ITC's held-out columns) that read no rank's sizes
        multiple = self.text.pad_to_multiple_of or 1
        bounds = GatherBounds(
            rows=ctx.training.batch_size * self.eval_batch_factor,
            text=-(-self.processor.max_text_length // multiple) * multiple,
            regions=self.processor.max_regions,
        )
        self.collator = VLCollator(
            self.text, data.region_mask_probability, self.objectives, data.itm_negatives, gather_bounds=bounds
        )
        self.train = VLPretrainingDataset(train_pairs, self.regions, self.processor, self.seed, self.qa_answers)
        if len(self.eval_pairs) >= 2:
            self.eval = VLPretrainingDataset(
                self.eval_pairs, self.regions, self.processor, self.seed + 1, self.qa_answers
            )
        self.images = attach_images(
            ctx, (self.train, self.eval), lambda d: [c.image_id for c in d.captions], self.processor
        )
        self.feature_dim = self.processor.region_source.feature_dim
        if self.images is not None and "mrfr" in self.objectives.active:
            raise ValueError(
                "data.objectives has mrfr, which regresses the detector's features, but "
                "model.visual_backbone computes its own from the images; set mrfr's weight to 0 "
                "(VL-BERT pretrains its e2e model with mlm and mrc_kl)"
            )

    def _load_source(self, ctx: RunContext, source: CaptionSource) -> tuple[list[Caption], object]:
        """A source's captions (tokenized; its first ``max_images`` images) and its region store; captions whose
        image has no regions are refused or skipped per ``data.missing_regions``."""
        data, tokenizer = ctx.data, ctx.tokenizer
        if source.format == "easy-vqa":
            pairs = easy_vqa_captions(tokenizer, source.split, self.seed, data.easy_vqa_questions, data.max_images)
            # every one of the first max_images images, captioned or not: the set a VQA run on them reads too
            store = region_store(
                source.shards, "easy-vqa", data.cache_dir, ctx.detector, first_images(source.split, data.max_images)
            )
        else:
            images = source.captioned_images()
            if data.max_images:
                images = images[: data.max_images]
            store = RegionStore(source.shards)
            texts = [
                (img.image_id, text, img.answers[k] if img.answers else ())
                for img in images
                for k, text in enumerate(img.captions)
            ]
            ids = tokenizer(
                [t for _, t, _ in texts],
                add_special_tokens=False,
                return_attention_mask=False,
                return_token_type_ids=False,
            )["input_ids"]
            pairs = [
                Caption(image_id, token_ids, caption_content(text), answers)
                for (image_id, text, answers), token_ids in zip(texts, ids, strict=True)
                if token_ids
            ]
        absent = {i for i in {p.image_id for p in pairs} if i not in store}  # one lookup per image
        if absent:
            missing = sorted(absent)
            count = sum(1 for p in pairs if p.image_id in absent)
            if data.missing_regions == "error":
                raise ValueError(
                    f"source {source.name!r}: {count} captions of {len(missing)} images have no regions "
                    f"in {source.shards or 'the extracted shards'} (e.g. {missing[:3]}; the shards hold ids "
                    f"like {next(iter(store), '?')!r}); fix image_id_format, extract those images, or set "
                    "data.missing_regions: skip"
                )
            logger.warning(
                "source %s: skipping %d captions whose %d images have no regions (e.g. %s)",
                source.name,
                count,
                len(missing),
                missing[:3],
            )
            self.skipped[source.name] = count
            pairs = [p for p in pairs if p.image_id not in absent]
        if not pairs:
            raise ValueError(f"source {source.name!r} has no caption with regions")
        return pairs, store

    @functools.cached_property
    def priors(self) -> TrainingPriors:
        """The training split's constants (:func:`~vlbert.recipes.vl_baselines.training_priors`), fitted once: new
        region heads start at them (:func:`build_model`) and the end-of-run baselines read them (:func:`baselines`)."""
        return training_priors(self.train, len(self.tokenizer), self.tokenizer.all_special_ids)

    @evaluation
    def grounding_accuracy(self, model) -> dict[str, float]:
        """Held-out accuracy of predicting a caption's masked colour or shape word, with the image's regions and
        with every region masked out (region_mask = 0): the gap is what the model reads from the image. Questions
        are left out ("is there a red shape?" names a colour the image need not have)."""
        word_ids = {self.tokenizer.convert_tokens_to_ids(w) for w in COLORS + SHAPES}
        device = next(model.parameters()).device
        hits = {"with_regions": 0, "without_regions": 0}
        total = 0
        for start in range(0, len(self.eval), 64):
            rows = []
            for k in range(start, min(start + 64, len(self.eval))):
                if self.eval.captions[k].answers:
                    continue
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
            for name, region_mask in (
                ("with_regions", batch["region_mask"]),
                ("without_regions", torch.zeros_like(batch["region_mask"])),
            ):
                out = model(**{**batch, "region_mask": region_mask}, labels=labels.to(device))
                hits[name] += int(round(float(out.metrics["mlm_accuracy"]) * out.counts["mlm"]))
            total += len(rows)
        return {f"eval_color_shape_mlm_accuracy_{k}": v / max(total, 1) for k, v in hits.items()}


def build_model(ctx: RunContext, data: VLPretrainingData) -> VLBertForPreTraining:
    """VLBertForPreTraining from ``init_from`` (a BERT checkpoint) or the ``model`` section; region sizes come
    from the shards. The collator then packs as the model runs: one layout per stream for a two-stream model.

    Raises:
        ValueError: ``model.region_feature_dim`` differs from the shards' feature size; an objective of the mix
            that this model cannot run (:meth:`~vlbert.objectives.base.Objective.unsupported`: ITC on a two-stream
            model).
    """
    answers = {"num_qa_labels": len(data.qa_answers)} if data.qa_answers else {}
    if "itc" in data.objectives.active:  # the ITC head (projections, temperature): only where the mix trains it
        answers["contrastive_head"] = True
    model = load_model(
        VLBertForPreTraining, ctx, region_feature_dim=data.feature_dim, num_region_classes=data.num_classes, **answers
    )
    if model.config.region_feature_dim != data.feature_dim:
        raise ValueError(
            f"the shards hold {data.feature_dim}-d region features but model.region_feature_dim is "
            f"{model.config.region_feature_dim}; make them equal"
        )
    for name in data.objectives.active + data.objectives.paired:
        problem = OBJECTIVES[name].unsupported(model.config)
        if problem:
            raise ValueError(f"data.objectives has {name}: {problem}")
    data.collator.two_stream = model.config.encoder == "two-stream"  # the unpadded layout per stream (VLCollator)
    fresh = set(model.loading_info.missing_keys) if ctx.init_from and hasattr(model, "loading_info") else None
    _start_region_heads_at_priors(model, data, fresh)
    return model


def _start_region_heads_at_priors(model, data: VLPretrainingData, fresh: set[str] | None) -> None:
    """Start a newly initialised MRFR head's output bias at the training regions' mean feature and the MRC head's
    (MRC and MRC-kl share it) at the log of the detector's class prior over them (:func:`training_priors`), where
    the mix trains them; ``fresh``: the parameters the init checkpoint lacked (None: a model from scratch, all new).
    A loaded head keeps its weights.

    UNITER starts both biases at zero (``model/pretrain.py``: the heads' ``nn.Linear``); detector features are not
    centred (a BUTD or timm block may have per-dimension means far from 0), so a zero-bias head must first learn that
    constant, which AdamW moves by about the learning rate a step: a short run's region losses then end behind the
    constant baselines the end-of-run table shows (docs/performance.md). Setting the bias to the target's prior
    is the usual start for an output layer (its loss at step 0 is close to the constant's)."""
    params = dict(model.named_parameters())
    wanted = {
        "mrfr.decoder.bias": "mrfr" in data.objectives.active,
        "mrc.decoder.bias": bool({"mrc", "mrc_kl"} & set(data.objectives.active)),
    }
    todo = [k for k, on in wanted.items() if on and k in params and (fresh is None or k in fresh)]
    if not todo or not len(data.train):
        return
    starts = {"mrfr.decoder.bias": data.priors.mean_feature, "mrc.decoder.bias": data.priors.log_class_prior()}
    with torch.no_grad():
        for name in todo:
            if starts.get(name) is not None and starts[name].shape == params[name].shape:
                params[name].copy_(starts[name])


def _probes_grounding(data: VLPretrainingData) -> bool:
    """Whether the run reports the colour/shape grounding probe: held-out easy-VQA captions, and a masked-word
    objective in the mix (the probe reads the masked-LM head, which a run of only ITM or region objectives leaves
    untrained)."""
    masks_words = any(OBJECTIVES[name].output == "prediction_logits" for name in data.objectives.active)
    return data.eval is not None and data.easy_vqa_only and masks_words


def baselines(ctx: RunContext, data: VLPretrainingData, model) -> dict:
    """The captions left out for want of regions (per source), every held-out objective result's baseline on the
    held-out batches (:mod:`vlbert.recipes.vl_baselines`: the most frequent wordpiece and the unigram prior, the
    detector's class prior, the mean region feature, ITM's chance loss) and the grounding probe before training."""
    out = {f"captions_without_regions_{name}": count for name, count in data.skipped.items()}
    if data.eval is None:
        return out
    out.update(held_out_baselines(data.rank_eval_batches(), data.priors))
    if "itm" in data.objectives.active:
        out["eval_itm_loss_chance"] = itm_loss_chance(ctx.data.itm_negatives)
    if not _probes_grounding(data):
        return out
    return {**out, **{k + "_before": v for k, v in data.grounding_accuracy(model).items()}}


def evaluate(ctx: RunContext, data: VLPretrainingData, model) -> dict:
    """The colour/shape grounding probe on easy-VQA data with a masked-word objective
    (:meth:`VLPretrainingData.grounding_accuracy`); other runs report the trainer's held-out losses."""
    return data.grounding_accuracy(model) if _probes_grounding(data) else {}


def qa_vocabulary(pairs: list[Caption], limit: int = 0) -> list[str]:
    """The ``qa`` unit's answers: every answer of the questions among ``pairs``, the most frequent first (ties in
    alphabetical order), at most ``limit`` of them (0 = all; ``model.num_qa_labels``). LXMERT reads a fixed table
    instead (``data/lxmert/all_ans.json``, 9,500 answers of its QA sets: airsplay/lxmert@077c596
    ``src/pretrain/qa_answer_table.py``); the most frequent answers of the same questions approximate it."""
    counts = Counter(a for p in pairs for a, score in p.answers if score > 0)
    ranked = sorted(counts, key=lambda a: (-counts[a], a))
    return ranked[:limit] if limit else ranked


def _weighted(pairs: list[Caption], weight: float, rng: random.Random) -> list[Caption]:
    """``pairs`` repeated ``int(weight)`` times plus a seeded ``weight % 1`` share of them."""
    whole, part = int(weight), weight - int(weight)
    return pairs * whole + (rng.sample(pairs, round(part * len(pairs))) if part else [])


def hooks(ctx: RunContext, data: VLPretrainingData, model) -> list:
    """ALBEF's momentum model where ``data.itc.momentum`` asks for it
    (:class:`~vlbert.training.momentum.MomentumDistillation`), else none."""
    options = ctx.data.itc
    if not options.enabled:
        return []
    return [MomentumDistillation(options, ctx.training.seed)]


def processor_fields(ctx: RunContext, data: VLPretrainingData) -> dict:
    """With the ``qa`` unit, its answers in label order (``qa_answers``); the rest of the run's processor record
    (limits, the regions' source, a visual backbone's image preprocessing: what fill-mask on an image needs,
    :mod:`vlbert.inference`) is ``data.processor``'s own."""
    return {"qa_answers": data.qa_answers} if data.qa_answers else {}


RECIPE = Recipe(
    "vl-pretraining",
    VLDataConfig,
    VLPretrainingData,
    build_model,
    evaluate=evaluate,
    baselines=baselines,
    uses_regions=True,
    default_init=None,
    processor_fields=processor_fields,
    hooks=hooks,
)

__all__ = ["RECIPE", "VLDataConfig", "CaptionSource", "VLPretrainingData", "easy_vqa_captions", "qa_vocabulary"]
