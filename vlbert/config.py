"""Model configuration, field-for-field compatible with Hugging Face ``BertConfig`` / ``config.json``.

Source: transformers ``BertConfig`` (field names and defaults) and the BERT paper, Devlin et al. 2019, section 3.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from vlbert.common.typed_config import AsMapping, ConfigValueError, Range, Takes, check_fields, from_section
from vlbert.common.user_files import expect, read_json
from vlbert.text_tower_config import modernbert_tower_config, vl_values_from_modernbert

logger = logging.getLogger(__name__)

#: model_type values whose config.json describes the BERT architecture this library implements.
BERT_MODEL_TYPES = ("bert", "vlbert")

#: Hugging Face config.json keys that carry no architecture information and are dropped quietly.
_HF_BOOKKEEPING_KEYS = {
    "architectures",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "classifier_dropout",
    "_name_or_path",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "output_past",
    "directionality",
    "pooler_fc_size",
    "pooler_num_attention_heads",
    "pooler_num_fc_layers",
    "pooler_size_per_head",
    "pooler_type",
    "label2id",
    "problem_type",
    "tie_word_embeddings",
    "is_decoder",
    "add_cross_attention",
    "chunk_size_feed_forward",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "torchscript",
    "finetuning_task",
    "tokenizer_class",
    "prefix",
    "sep_token_id",
    "decoder_start_token_id",
    "task_specific_params",
}

#: transformers' attn_implementation names that mean one of ours (its flash-attention paths unpad: varlen).
_HF_ATTENTION_NAMES = {"flash_attention_2": "varlen", "flash_attention_3": "varlen", "flash_attention_4": "varlen"}
#: the attn_implementation names both libraries share: the only ones written to config.json.
_SHARED_ATTENTION_NAMES = ("eager", "sdpa")

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


@dataclass
class VisualBackboneConfig:
    """The fields of ``VLBertConfig.visual_backbone``, the region feature extractor a model runs on its images
    (:class:`vlbert.models.visual_backbone.RegionFeatureExtractor`, whose module docstring says what each does;
    VL-BERT's e2e, Su et al. 2020 section 3.3). ``config.json`` keeps the mapping as given; these are its types,
    ranges and defaults.

    Raises:
        ValueError: ``layers`` that are not three block counts (res2-res4).
    """

    kind: Literal["caffe-resnet", "torchvision-resnet", "timm"] = "caffe-resnet"
    layers: Annotated[
        list[Annotated[int, Range(ge=1)]], Takes("three block counts of res2-res4, e.g. [3, 4, 23] (ResNet-101)")
    ] = field(default_factory=lambda: [3, 4, 23])
    depth: Literal[18, 34, 50, 101, 152] = 50
    model: str = "resnet18"
    roi_size: Annotated[int, Range(ge=1)] = 14
    sampling_ratio: int = 1  # RoIAlign's; <= 0: adaptive (torchvision.ops.roi_align)
    aligned: bool = False
    frozen_stages: Annotated[
        list[Annotated[int, Range(ge=1)]],
        Takes(
            "a list of the stages to freeze (1 = the stem, 2 = res2 or the first timm level, ...), e.g. [1, 2]; [] for "
            "none"
        ),
    ] = field(default_factory=lambda: [1, 2])
    frozen_bn: bool = True
    mask_pixels: bool = True
    checkpointing: bool = False
    learning_rate: Annotated[
        Annotated[float, Range(gt=0)] | None, Takes("null (the run's learning rate) or a float > 0")
    ] = None
    pretrained: bool = False
    weights: str | None = None

    def __post_init__(self) -> None:
        if len(self.layers) != 3:
            raise ConfigValueError(
                "visual_backbone.layers", self.layers, "three block counts of res2-res4, e.g. [3, 4, 23] (ResNet-101)"
            )

    @classmethod
    def options(cls, values: dict | None, section: str = "config.visual_backbone") -> dict[str, Any]:
        """Every field of a ``visual_backbone`` mapping, defaults filled, read through the typed layer.

        Raises:
            ValueError: an unknown field, a value of the wrong type or out of range (one line naming the key).
        """
        return dataclasses.asdict(from_section(cls, values, section))


@dataclass
class BertConfig:
    """Architecture of a BERT encoder (Devlin et al. 2019, section 3; transformers ``BertConfig``).

    Field names and defaults are Hugging Face's, so a ``config.json`` written by transformers loads here and one
    written here loads in transformers. Defaults describe BERT-base uncased (L=12, H=768, A=12).
    ``attn_implementation`` (transformers' key) names the attention kernel, a key of
    :data:`vlbert.layers.attention.ATTENTION_FUNCTIONS` (``eager``, ``sdpa``, ``varlen``; transformers'
    ``flash_attention_*`` read as ``varlen``); None picks ``varlen`` on CUDA in bf16/fp16 and ``sdpa`` elsewhere,
    and a kernel that cannot run on the device (flash before compute capability 8.0, head sizes flash does not
    take) falls back to the next one with a log line (:func:`vlbert.layers.attention.select_attention`).
    ``gradient_checkpointing`` (transformers' name) recomputes each encoder layer in the backward instead of
    keeping its activations: less memory for about a third more compute; a run-time choice, not written to
    config.json.

    Raises:
        ValueError: from :meth:`validate` when ``hidden_size`` is not divisible by ``num_attention_heads``,
            an activation or position embedding type is unsupported, or a size is not positive.
    """

    vocab_size: Annotated[int, Range(ge=1)] = 30522
    hidden_size: Annotated[int, Range(ge=1)] = 768
    num_hidden_layers: Annotated[int, Range(ge=1)] = 12
    num_attention_heads: Annotated[int, Range(ge=1)] = 12
    intermediate_size: Annotated[int, Range(ge=1)] = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: Annotated[float, Range(ge=0, lt=1)] = 0.1
    attention_probs_dropout_prob: Annotated[float, Range(ge=0, lt=1)] = 0.1
    max_position_embeddings: Annotated[int, Range(ge=1)] = 512
    type_vocab_size: Annotated[int, Range(ge=1)] = 2
    initializer_range: Annotated[float, Range(ge=0)] = 0.02
    layer_norm_eps: Annotated[float, Range(gt=0)] = 1e-12
    position_embedding_type: str = "absolute"
    pad_token_id: Annotated[int, Range(ge=0)] | None = 0
    num_labels: Annotated[int, Range(ge=1)] = 2
    classifier_dropout: Annotated[float, Range(ge=0, lt=1)] | None = None
    id2label: dict[int, str] | None = None
    attn_implementation: str | None = None
    gradient_checkpointing: bool = False

    model_type = "bert"
    #: Fields that fix the weights' shapes or the function they compute: a checkpoint's values decide these.
    ARCHITECTURE_FIELDS = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "max_position_embeddings",
        "type_vocab_size",
        "layer_norm_eps",
        "position_embedding_type",
        "region_feature_dim",
        "region_location_dim",
        "num_region_classes",
        "region_embedding",
        "region_head_norm",
        "visual_backbone",
        "encoder",
        "l_layers",
        "r_layers",
        "x_layers",
        "num_attribute_classes",
        "num_qa_labels",
        "text_tower",
        "modernbert",
    )

    def __post_init__(self) -> None:
        self.attn_implementation = _HF_ATTENTION_NAMES.get(self.attn_implementation, self.attn_implementation)
        self.validate()  # (config.json's id2label keys are strings: read as the ints they name)

    def validate(self) -> None:
        """Check every field's type and range as its annotation says (the typed reading of config values,
        :func:`vlbert.common.typed_config.check_fields`), then the fields' consistency; raise ``ValueError`` naming
        the field and the fix."""
        check_fields(self, "config")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"config.hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}); pick a head count that divides it"
            )
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(
                f"config.hidden_act={self.hidden_act!r} is not supported; use one of {SUPPORTED_ACTIVATIONS}"
            )
        if self.id2label is not None and sorted(self.id2label) != list(range(self.num_labels)):
            raise ValueError(
                f"config.id2label must name labels 0..{self.num_labels - 1} (num_labels), got {sorted(self.id2label)}"
            )
        if self.position_embedding_type != "absolute":
            raise ValueError(
                f"config.position_embedding_type={self.position_embedding_type!r} is not supported; "
                "only BERT's learned 'absolute' position embeddings are implemented"
            )

    @property
    def head_dim(self) -> int:
        """Size of one attention head, ``hidden_size // num_attention_heads``."""
        return self.hidden_size // self.num_attention_heads

    # ------------------------------------------------------------------ (de)serialisation
    @classmethod
    def from_dict(cls, values: dict[str, Any], strict: bool = False) -> "BertConfig":
        """Build a config from a dict such as a parsed ``config.json`` or a YAML ``model:`` section.

        Args:
            values: field name -> value.
            strict: if True (run configs written by people), an unknown key is an error; if False (config.json
                files written by transformers), known Hugging Face bookkeeping keys are dropped and other unknown
                keys are logged and dropped.

        Raises:
            ValueError: ``model_type`` names another architecture, an unknown key with ``strict=True``, or a
                field fails :meth:`validate`.
        """
        values = dict(values)
        if "num_labels" not in values and isinstance(values.get("id2label"), dict):
            values["num_labels"] = len(values["id2label"])  # transformers stores the label count as id2label
        if isinstance(values.get("id2label"), dict) and all(
            str(v) == f"LABEL_{k}" for k, v in values["id2label"].items()
        ):
            values["id2label"] = None  # transformers' placeholder names: no names known
        model_type = values.get("model_type")
        if model_type is not None and model_type not in cls.accepted_model_types():
            fix = (
                "load it with vlbert.ModernBertModel / ModernBertForMaskedLM (rotary positions, not BERT's table)"
                if model_type == "modernbert"
                else "use a BERT checkpoint (e.g. bert-base-uncased)"
            )
            raise ValueError(
                f"this checkpoint's config.json has model_type={model_type!r}, but {cls.__name__} loads "
                f"{cls.accepted_model_types()} checkpoints; {fix}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if strict and unknown:
            raise ValueError(f"unknown model config key(s) {unknown}; valid keys are {sorted(known)}")
        surprising = [k for k in unknown if k not in _HF_BOOKKEEPING_KEYS]
        if surprising:
            logger.info("ignoring config keys with no meaning for %s: %s", cls.__name__, surprising)
        return cls(**{k: v for k, v in values.items() if k in known})

    @classmethod
    def accepted_model_types(cls) -> tuple[str, ...]:
        return BERT_MODEL_TYPES

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "BertConfig":
        """Read a Hugging Face style ``config.json``.

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: the file is not valid JSON, or see :meth:`from_dict`.
        """
        values = read_json(
            path,
            "model config",
            "is this a model directory's config.json? write it again (save_pretrained or the conversion)",
        )
        return cls.from_dict(expect(values, dict, str(path), "a config.json"))

    def to_dict(self) -> dict[str, Any]:
        """All fields plus ``model_type`` and transformers' ``id2label``/``label2id`` (from which transformers
        derives num_labels; the label names when the run knew them, else ``LABEL_i``), the form written to
        ``config.json``."""
        out = dataclasses.asdict(self)
        del out["attn_implementation"]  # a run-time choice, not architecture: config.json gets it where shared
        del out["gradient_checkpointing"]  # a run-time choice too (memory for compute)
        out["model_type"] = self.model_type
        names = self.id2label or {i: f"LABEL_{i}" for i in range(self.num_labels)}
        out["id2label"] = {str(i): name for i, name in sorted(names.items())}
        out["label2id"] = {name: i for i, name in sorted(names.items())}
        return out

    def to_json_file(self, path: str | os.PathLike, architectures: list[str] | None = None) -> None:
        """Write ``config.json`` in the Hugging Face format. Text models' files (``model_type`` "bert") load in
        ``transformers.AutoConfig``; VL models' (``model_type`` "vlbert") are read by this library only:
        transformers has no such model type."""
        values = self.to_dict()
        if self.attn_implementation in _SHARED_ATTENTION_NAMES:  # transformers refuses names it lacks (varlen)
            values["attn_implementation"] = self.attn_implementation
        if architectures:
            values["architectures"] = architectures
        with open(path, "w", encoding="utf-8") as f:
            json.dump(values, f, indent=2, sort_keys=True)
            f.write("\n")


@dataclass
class VLBertConfig(BertConfig):
    """A BERT encoder plus the region pathway of a single-stream vision-language model (UNITER, VisualBERT,
    Oscar/VinVL).

    Extra fields:
        region_feature_dim: size D of one RoI feature vector (2048 for bottom-up-attention Faster R-CNN).
        region_embedding: the region pathway, a key of :data:`vlbert.models.region_embeddings.REGION_EMBEDDINGS`:
            "uniter" (default), "visualbert", "oscar", "vinvl" or "vl-bert" (their equations are in that module).
        region_location_dim: size of the location feature the pathway reads, as the pathway declares it
            (``RegionEmbedding.location_dim``): 7 = [x1, y1, x2, y2, w, h, w*h] (uniter), 6 = [x1, y1, x2, y2, w, h]
            (oscar, vinvl), 4 = the box (vl-bert's sin/cos geometry embedding, lxmert), 0 = no box input
            (visualbert); normalised units. None (default): the pathway's, filled in when the model is built; a
            value other than the pathway's is refused there.
        region_token_type: the token type regions get when the inputs give none: a row of the text's
            token-type table (uniter, default 1 = segment B) or of VisualBERT's visual token-type table
            (VisualBERT's VQA/COCO checkpoints were trained with 0).
        num_region_classes: size of the detector's class distribution used by masked region classification
            without a background class (1600 for Visual Genome bottom-up-attention; 0 disables MRC). Whether MRC
            uses the top class (``mrc``) or the distribution (``mrc_kl``) is the objective mix's choice.
        projection_dim: size of the contrastive (ITC) embeddings of image-text retrieval (ALBEF: 256).
        contrastive_head: build the ``itc`` pretraining head (ALBEF's image-text contrastive projections and
            temperature, :mod:`vlbert.objectives.contrastive`); the VL pretraining recipe sets it where its objective
            mix has ``itc``, so models that never train ITC (a converted UNITER) carry no such head.
        wra_layer: the hidden states word-region alignment (the ``wra`` objective, and the plans
            ``vlbert explain alignment`` draws) transports between: -1 the last layer's (UNITER section 3.2), 0
            the embeddings (the first layer's input, before any word has seen a region), k the output of layer k.
            In a single-stream encoder the last layer's word and region states both know whether the pair
            matches, and on easy-VQA captions WRA there is met by making them all alike (docs/experiments.md);
            below the first cross-modal attention a matched pair can only be brought close through content.
        region_head_norm: whether the masked-region heads have a LayerNorm after their dense layer (UNITER: yes;
            VL-BERT's ``mvrc_head``: dense + GELU + classifier, no LayerNorm).
        visual_backbone: None (region features come precomputed), or the region feature extractor the model runs on
            the batch's images under the given boxes (:class:`vlbert.models.visual_backbone.RegionFeatureExtractor`:
            ``kind`` "caffe-resnet" (VL-BERT's e2e), "torchvision-resnet" or "timm", and its options).
        encoder: "single-stream" (default: text and regions in one encoder of ``num_hidden_layers`` layers) or
            "two-stream" (LXMERT, Tan and Bansal 2019 section 2.2: ``l_layers`` text layers, ``r_layers`` region
            layers, then ``x_layers`` cross-modality layers; ``num_hidden_layers`` is then not read; see
            :mod:`vlbert.models.two_stream`).
        l_layers, r_layers, x_layers: the two-stream encoder's layer counts (LXMERT: 9, 5, 5).
        num_attribute_classes: size of the detector's attribute vocabulary for attribute classification (LXMERT's
            400 Visual Genome attributes; 0 disables it).
        num_qa_labels: the answer count of the pretraining ``qa`` objective (LXMERT: 9500; 0 disables it).
        text_tower: the text encoder under the region pathway, a key of
            :data:`vlbert.models.text_towers.TEXT_TOWERS`: "bert" (default: BERT's embeddings and post-LN layers,
            this config's BERT fields) or "modernbert" (Warner et al. 2024: rotary positions, GeGLU, pre-norm; its
            own fields in ``modernbert``, :mod:`vlbert.text_tower_config`; single-stream only). A ModernBERT
            ``config.json`` (``model_type`` "modernbert") read as this config chooses it.
        modernbert: with ``text_tower`` "modernbert", the tower's :class:`~vlbert.modernbert_config.ModernBertConfig`
            fields other than the sizes this config holds (``local_attention``, ``global_attn_every_n_layers``,
            ``global_rope_theta``, ``norm_eps``, ...); None: ModernBERT's defaults.
    """

    region_feature_dim: Annotated[int, Range(ge=1)] = 2048
    # None: the region pathway's own size (the pathway checks a given one)
    region_location_dim: Annotated[int, Range(ge=0)] | None = None
    num_region_classes: Annotated[int, Range(ge=0)] = 1600
    region_embedding: str = "uniter"
    region_token_type: Annotated[int, Range(ge=0)] = 1
    projection_dim: Annotated[int, Range(ge=1)] = 256
    contrastive_head: bool = False
    wra_layer: Annotated[int, Range(ge=-1)] = -1
    region_head_norm: bool = True
    visual_backbone: (
        Annotated[
            dict,
            AsMapping(VisualBackboneConfig),
            Takes(
                "a mapping of visual backbone fields (kind, layers, depth, model, roi_size, frozen_stages, learning_rate, "
                "...), e.g. {kind: timm, model: resnet18}"
            ),
        ]
        | None
    ) = None
    encoder: Literal["single-stream", "two-stream"] = "single-stream"
    l_layers: Annotated[int, Range(ge=0)] = 9
    r_layers: Annotated[int, Range(ge=0)] = 5
    x_layers: Annotated[int, Range(ge=0)] = 5
    num_attribute_classes: Annotated[int, Range(ge=0)] = 0
    num_qa_labels: Annotated[int, Range(ge=0)] = 0
    text_tower: Literal["bert", "modernbert"] = "bert"
    modernbert: (
        Annotated[
            dict,
            Takes(
                "a mapping of ModernBERT fields (local_attention, global_attn_every_n_layers, global_rope_theta, "
                "local_rope_theta, norm_eps, hidden_activation, ...), e.g. {local_attention: 16}"
            ),
        ]
        | None
    ) = None

    model_type = "vlbert"
    #: config.encoder values (the classes are :data:`vlbert.models.two_stream.ENCODERS`).
    ENCODER_KINDS = ("single-stream", "two-stream")

    def validate(self) -> None:
        super().validate()
        if self.region_token_type >= self.type_vocab_size:
            raise ValueError(
                f"config.region_token_type must be in [0, type_vocab_size={self.type_vocab_size}), "
                f"got {self.region_token_type!r}"
            )
        if self.wra_layer > self.num_hidden_layers:
            raise ValueError(
                f"config.wra_layer must be -1 (the last layer), 0 (the embeddings) or a layer in "
                f"1..num_hidden_layers={self.num_hidden_layers}, got {self.wra_layer!r}"
            )
        if self.encoder == "two-stream" and self.x_layers < 1:
            raise ValueError(
                "config.x_layers must be >= 1 for encoder='two-stream': without a cross-modality layer "
                "the text never sees the regions"
            )
        if self.text_tower == "modernbert":
            self.check_modernbert_tower()

    def check_modernbert_tower(self) -> None:
        """Raise ``ValueError`` in one line naming the fix where a ModernBERT text tower cannot serve this config:
        LXMERT's two streams (their language and cross-modality layers are BERT layers), VL-BERT's pathway (it adds
        the text's learned position table to the regions, which ModernBERT's rotary positions lack), or tower
        fields :func:`~vlbert.text_tower_config.modernbert_tower_config` refuses."""
        if self.encoder == "two-stream":
            raise ValueError(
                "config.encoder='two-stream' (LXMERT) takes a BERT text tower only (its language, region and "
                "cross-modality layers are BERT layers), not text_tower='modernbert'; use encoder 'single-stream' "
                "with the ModernBERT tower, or --init-from a BERT checkpoint for LXMERT"
            )
        if self.region_embedding == "vl-bert":
            raise ValueError(
                "config.region_embedding='vl-bert' adds the text's learned position table to the regions, which "
                "text_tower='modernbert' (rotary positions) has not; use region_embedding 'uniter', 'visualbert', "
                "'oscar' or 'vinvl' with ModernBERT, or a BERT checkpoint for VL-BERT"
            )
        modernbert_tower_config(self)

    def text_config(self):
        """The text tower's own config: a :class:`~vlbert.modernbert_config.ModernBertConfig` for ``text_tower``
        "modernbert" (:func:`~vlbert.text_tower_config.modernbert_tower_config`), else this config (BERT's fields
        are its own)."""
        return modernbert_tower_config(self) if self.text_tower == "modernbert" else self

    @classmethod
    def from_dict(cls, values: dict[str, Any], strict: bool = False) -> "VLBertConfig":
        """As :meth:`BertConfig.from_dict`; a ModernBERT ``config.json`` (``model_type`` "modernbert") becomes a
        config with that text tower (:func:`~vlbert.text_tower_config.vl_values_from_modernbert`).

        Raises:
            ValueError: as :meth:`BertConfig.from_dict`, or as ``vl_values_from_modernbert``."""
        if values.get("model_type") == "modernbert":
            values = vl_values_from_modernbert(values)
        return super().from_dict(values, strict)

    @classmethod
    def accepted_model_types(cls) -> tuple[str, ...]:
        # A plain BERT checkpoint initialises the shared encoder of a VL model.
        return BERT_MODEL_TYPES


__all__ = ["BertConfig", "VLBertConfig", "VisualBackboneConfig", "SUPPORTED_ACTIVATIONS"]
