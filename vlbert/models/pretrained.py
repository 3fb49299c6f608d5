"""``from_pretrained`` / ``save_pretrained`` shared by every model (transformers ``PreTrainedModel`` semantics)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from vlbert import checkpoint as ckpt
from vlbert.config import BertConfig
from vlbert.hub import push_model_directory
from vlbert.modernbert_checkpoint import modernbert_vl_from_hf, modernbert_vl_to_hf
from vlbert.tokenization import save_tokenizer

logger = logging.getLogger(__name__)


class OwnLearningRate:
    """Mixin of a submodule whose parameters may train at a learning rate of their own (``learning_rate``: a float,
    or None for the run's); :meth:`PreTrainedModel.learning_rates` collects them."""

    learning_rate: float | None = None


def _bert_layers_to_text_stream(state: dict[str, torch.Tensor], base: str) -> dict[str, torch.Tensor]:
    """A BERT checkpoint's layers (``{base}encoder.layers.{i}.*``) as a two-stream model's language layers
    (``{base}encoder.text.layers.{i}.*``), as LXMERT initialises its ``l_layers`` from BERT unless ``--fromScratch``
    (airsplay/lxmert@827087b ``src/lxrt/modeling.py``: "Using self.layer instead of self.l_layer to support
    loading BERT weights"); BERT layers beyond ``l_layers`` are then unused. A state that already has a text
    stream is returned unchanged."""
    if any(k.startswith(base + "encoder.text.") for k in state):
        return state
    old, new = base + "encoder.layers.", base + "encoder.text.layers."
    return {new + k[len(old) :] if k.startswith(old) else k: v for k, v in state.items()}


def _new_region_pathway(own: dict, state: dict, missing: list[str], base: str) -> list[str]:
    """The missing keys of a vision-language model's encoder (under ``base``, e.g. ``bert.``) when ``state`` is a
    text BERT's (no tensor whose name mentions regions) and the model has a region pathway: its region embeddings
    (and, two-stream, its region and cross-modality layers), which such a checkpoint cannot hold. Empty otherwise
    (a text model, or a checkpoint that was trained on regions)."""
    if not base or any("region" in k for k in state) or not any("region" in k for k in own):
        return []
    return [k for k in missing if k.startswith(base)]


def _parts(keys: list[str], base: str) -> str:
    """``keys`` (under ``base``) named by module, e.g. "region_embeddings (11), encoder.cross (40)"."""
    names = [k[len(base) :].split(".") for k in keys]
    counts = Counter(".".join(n[:2] if n[0] == "encoder" else n[:1]) for n in names)
    return ", ".join(f"{name} ({count})" for name, count in sorted(counts.items()))


#: The layers whose constructor draws weights that :meth:`PreTrainedModel.init_weights` draws again: built without
#: those draws inside :func:`_initial_weights_drawn_later`.
_REDRAWN_LAYERS = (nn.Linear, nn.Embedding, nn.LayerNorm)
_drawing_later = False


def _load_tensors(model: nn.Module, state: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` (whole tensors, the model's names, a subset of ``own``, its state dict) into ``model``; into a
    model sharded by FSDP2 (its state DTensors) through torch.distributed.checkpoint's ``set_model_state_dict``,
    each rank keeping its shard (collective: every rank loads the same ``state``)."""
    if not any(hasattr(v, "device_mesh") for v in own.values()):
        model.load_state_dict(state, strict=False)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))


@contextlib.contextmanager
def _initial_weights_drawn_later():
    """Build models without drawing the initial weights of their Linear, Embedding and LayerNorm layers (their
    ``reset_parameters`` and :meth:`PreTrainedModel.init_weights` do nothing; the parameters hold whatever
    ``torch.empty`` gave): :meth:`PreTrainedModel.from_pretrained` then draws only those the checkpoint lacks, as
    transformers' ``from_pretrained`` does (``no_init_weights``). Not thread-safe: it patches the layers' classes
    while a model is built."""
    global _drawing_later
    saved = {cls: cls.__dict__["reset_parameters"] for cls in _REDRAWN_LAYERS}
    for cls in _REDRAWN_LAYERS:
        cls.reset_parameters = lambda self: None
    _drawing_later = True
    try:
        yield
    finally:
        _drawing_later = False
        for cls, method in saved.items():
            cls.reset_parameters = method


def _children_first(module: nn.Module, prefix: str = ""):
    """(name, module) of ``module`` and every submodule, each after its children (``nn.Module.apply``'s order)."""
    for name, child in module.named_children():
        yield from _children_first(child, f"{prefix}{name}.")
    yield prefix.rstrip("."), module


class PreTrainedModel(nn.Module):
    """Base class: weight initialisation, loading from and saving to Hugging Face BERT checkpoint directories.

    Subclasses set ``config_class`` and ``base_model_prefix`` (the attribute holding the encoder, ``"bert"``;
    empty for the bare encoder).
    """

    config_class = BertConfig
    base_model_prefix = ""
    #: the architecture's name in messages (and, lower-cased, its config.json ``model_type``).
    architecture_name = "BERT"
    #: names of the objectives ``forward`` may report in ``losses`` (fixed order: multi-process loss weighting).
    objectives: tuple[str, ...] = ()

    def __init__(self, config: BertConfig):
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config

    # ------------------------------------------------------------------ initialisation
    def _init_module(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:  # (ModernBERT's norms have none)
                nn.init.zeros_(module.bias)
        own = getattr(module, "_init_own_weights", None)
        if callable(own):  # a module with its own published initialisation (after its children's, apply's order)
            own(std)

    def init_weights(self) -> None:
        """Initialise as BERT / transformers: N(0, initializer_range) weights, zero biases, LayerNorm = identity
        (nothing while :meth:`from_pretrained` builds the model: it draws what the checkpoint lacks)."""
        if not _drawing_later:
            self.apply(self._init_module)

    def _init_missing(self, missing: list[str]) -> None:
        """Initialise the parameters named in ``missing`` as :meth:`init_weights` would have (for a model built
        without its initial weights): the modules holding them, then the own initialisation of every module above
        them that has one, children first."""
        owners = {k.rpartition(".")[0] for k in missing}
        for name, module in _children_first(self):
            above = callable(getattr(module, "_init_own_weights", None)) and any(
                not name or o == name or o.startswith(name + ".") for o in owners
            )
            if name in owners or above:
                self._init_module(module)

    def learning_rates(self) -> dict[int, float]:
        """``id(parameter)`` -> its own learning rate, for parameters that have one: those of every submodule
        that is an :class:`OwnLearningRate` with a ``learning_rate`` set (a trainable visual backbone). The
        trainer gives them their own AdamW groups (:func:`vlbert.training.training_config.parameter_groups`)."""
        out: dict[int, float] = {}
        for module in self.modules():
            if isinstance(module, OwnLearningRate) and module.learning_rate:
                out.update({id(p): float(module.learning_rate) for p in module.parameters()})
        return out

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Number of parameters (each tied tensor counted once); optionally without embedding tables."""
        params = {id(p): p for n, p in self.named_parameters() if not (exclude_embeddings and "embeddings" in n)}
        return sum(p.numel() for p in params.values())

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls, name_or_path: str | os.PathLike, config: BertConfig | None = None, strict: bool = False, **config_overrides
    ):
        """Build the model from a Hugging Face BERT checkpoint directory (or a hub name when online).

        Any BERT checkpoint loads: a bare ``BertModel`` (as the packaged MiniLM), ``BertForPreTraining``, or one
        with task heads; old ``gamma``/``beta`` LayerNorm names too. Parameters the checkpoint lacks (e.g. a new
        classification head) keep their initial values; tensors the model has no place for are ignored. Both
        lists are logged and kept in ``model.loading_info`` (:class:`vlbert.checkpoint.LoadingInfo`).

        Args:
            name_or_path: checkpoint directory or hub name.
            config: use this config instead of the checkpoint's ``config.json``.
            strict: raise if any key is missing or unexpected.
            **config_overrides: config fields to change, e.g. ``hidden_dropout_prob=0.0``.
        Raises:
            FileNotFoundError: no such directory / weights, and not fetchable from the hub.
            ValueError: the checkpoint is another architecture (model_type, or no tensor maps onto a BERT
                encoder), tensor shapes differ from the config (e.g. another vocabulary size), or ``strict`` and
                keys differ.
        """
        directory = ckpt.resolve_checkpoint_dir(name_or_path)
        if config is None:
            if not (directory / ckpt.CONFIG_NAME).is_file():
                raise FileNotFoundError(f"{directory} has no config.json; pass config= or use a complete checkpoint")
            config = cls.config_class.from_json_file(directory / ckpt.CONFIG_NAME)
        if config_overrides:
            known = {f.name for f in dataclasses.fields(config)}
            unknown = sorted(set(config_overrides) - known)
            if unknown:
                raise ValueError(f"unknown model config key(s) {unknown}; valid keys are {sorted(known)}")
            if (
                "num_labels" in config_overrides
                and "id2label" not in config_overrides
                and config_overrides["num_labels"] != config.num_labels
            ):
                config_overrides["id2label"] = None  # another head: the checkpoint's label names do not apply
            config = dataclasses.replace(config, **config_overrides)
        with _initial_weights_drawn_later():  # the checkpoint sets them: drawn only where it has none
            model = cls(config)
        state = model.text_tower_state(ckpt.read_state_dict(directory))
        model.loading_info = model.load_converted_state_dict(
            state, source=str(directory), strict=strict, init_missing=True
        )
        return model

    @classmethod
    def from_hf_state_dict(cls, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A Hugging Face checkpoint's tensors in this model's names, encoder under ``bert.``
        (:func:`vlbert.checkpoint.hf_to_vlbert` for BERT; another architecture's models override it with their
        key map, :meth:`hf_state_dict` being its inverse)."""
        return ckpt.hf_to_vlbert(state)

    def text_tower_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A checkpoint's tensors in this model's names: for a vision-language model whose ``config.text_tower`` is
        "modernbert", :func:`~vlbert.modernbert_checkpoint.modernbert_vl_from_hf` (a ModernBERT directory or such a
        model's own); else :meth:`from_hf_state_dict`.

        Raises:
            ValueError: a ModernBERT tower given a BERT checkpoint (its learned positions named with the fix)."""
        if getattr(self.config, "text_tower", "bert") == "modernbert":
            return modernbert_vl_from_hf(state)
        return self.from_hf_state_dict(state)

    def load_converted_state_dict(
        self,
        state: dict[str, torch.Tensor],
        source: str = "checkpoint",
        strict: bool = False,
        init_missing: bool = False,
    ) -> ckpt.LoadingInfo:
        """Load a state dict already in our names (encoder under ``bert.``) into this model; ``init_missing``: first
        initialise the parameters ``state`` lacks (a model built without its initial weights, as
        :meth:`from_pretrained` builds it).

        Returns the :class:`~vlbert.checkpoint.LoadingInfo`; raises ``ValueError`` as :meth:`from_pretrained`.
        """
        prefix = self.base_model_prefix
        if not prefix:  # bare encoder: take what is under "bert.", everything else is unexpected
            state = {k[len("bert.") :] if k.startswith("bert.") else "<head>." + k: v for k, v in state.items()}
        own = self.state_dict()
        # a 0-d parameter that bf16-params holds as one element (training/sharding.py) loads a 0-d checkpoint's
        state = {k: v.reshape(1) if k in own and v.dim() == 0 and own[k].shape == (1,) else v for k, v in state.items()}
        base = prefix + "." if prefix else ""
        if getattr(self.config, "encoder", None) == "two-stream":
            state = _bert_layers_to_text_stream(state, base)
        encoder_keys = [k for k in own if k.startswith((base + "embeddings.", base + "encoder."))]
        if not any(k in state for k in encoder_keys):
            sample = ", ".join(sorted(state)[:5])
            kind = self.architecture_name
            raise ValueError(
                f"{source} is not a {kind} checkpoint: none of its {len(state)} tensors ({sample}, ...) maps onto "
                f"the {kind} encoder. Use a checkpoint of a {kind} model (config model_type {kind.lower()!r})."
            )
        mismatched = [
            f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
            for k, v in own.items()
            if k in state and state[k].shape != v.shape
        ]
        resized_heads = [
            k for k, v in own.items() if k in state and state[k].shape != v.shape and base and not k.startswith(base)
        ]
        if resized_heads and len(resized_heads) == len(mismatched) and not strict:
            # A task head of another size (another answer vocabulary, another label count): start it afresh, as
            # transformers' ignore_mismatched_sizes; the encoder must always fit.
            logger.warning(
                "%s: %s of %s has other shapes than this model's; newly initialised: %s",
                type(self).__name__,
                "head",
                source,
                mismatched,
            )
            state = {k: v for k, v in state.items() if k not in resized_heads}
            mismatched = []
        if mismatched:
            raise ValueError(
                f"{source} does not fit this config; shape mismatches: {mismatched[:5]}. The config must be the "
                "checkpoint's own config.json (vocab_size, hidden_size, max_position_embeddings, ...)"
            )
        missing = sorted(k for k in own if k not in state)
        unexpected = sorted(k.removeprefix("<head>.") for k in state if k not in own)
        if strict and (missing or unexpected):
            raise ValueError(f"loading {source} strictly: missing {missing}, unexpected {unexpected}")
        if init_missing:
            self._init_missing(missing)  # before loading: a module's own initialisation may touch loaded tensors
        _load_tensors(self, {k: v for k, v in state.items() if k in own}, own)
        pathway = _new_region_pathway(own, state, missing, base)
        if pathway:
            kind = "ModernBERT" if getattr(self.config, "text_tower", "bert") == "modernbert" else "BERT"
            logger.info(
                "%s: %s is a text %s: its weights (%d tensors) loaded; newly initialised, as a text encoder has no "
                "region pathway: %s",
                type(self).__name__,
                source,
                kind,
                sum(k in state for k in own if k.startswith(base)),
                _parts(pathway, base),
            )
            missing_heads = [k for k in missing if k not in pathway]
        else:
            missing_heads = missing
        if missing_heads:
            logger.warning("%s: newly initialised (not in %s): %s", type(self).__name__, source, missing_heads)
        if unexpected:
            logger.info("%s: unused tensors of %s: %s", type(self).__name__, source, unexpected)
        return ckpt.LoadingInfo(missing_keys=missing, unexpected_keys=unexpected)

    # ------------------------------------------------------------------ saving
    def hf_state_dict(self, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """This model's weights (or ``state_dict``, in its names) under Hugging Face BERT names (what
        ``save_pretrained`` writes); a ModernBERT text tower's under transformers' ModernBERT names
        (:func:`~vlbert.modernbert_checkpoint.modernbert_vl_to_hf`)."""
        state = self.state_dict() if state_dict is None else state_dict
        if getattr(self.config, "text_tower", "bert") == "modernbert":
            return modernbert_vl_to_hf(state, self.base_model_prefix)
        return ckpt.vlbert_to_hf(state, self.base_model_prefix)

    def save_pretrained(
        self, directory: str | os.PathLike, tokenizer=None, state_dict: dict[str, torch.Tensor] | None = None
    ) -> Path:
        """Write ``config.json`` + ``model.safetensors`` (+ tokenizer files) in the Hugging Face layout.

        ``transformers.<HF class>.from_pretrained(directory)`` loads the result with no missing or unexpected
        keys (for text models); ``type(self).from_pretrained(directory)`` restores this model exactly. Each file
        is written atomically.

        Args:
            directory: created if needed.
            tokenizer: a transformers tokenizer to save beside the weights (recommended: the checkpoint is then
                self-contained).
            state_dict: the weights to write, in this model's names (whole tensors), instead of its own: those of
                a sharded model, gathered (the trainer's bf16-params: vlbert/training/sharding.py).
        Returns:
            the directory as a ``Path``.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        ckpt.write_safetensors(self.hf_state_dict(state_dict), directory / ckpt.WEIGHTS_NAME)
        architecture = type(self).__name__  # the text models' names are transformers' class names
        tmp = directory / (ckpt.CONFIG_NAME + ".tmp")
        self.config.to_json_file(tmp, architectures=[architecture])
        os.replace(tmp, directory / ckpt.CONFIG_NAME)
        if tokenizer is not None:
            save_tokenizer(tokenizer, directory)
        return directory

    def push_to_hub(
        self,
        repo_id: str,
        tokenizer=None,
        private: bool = False,
        token: str | None = None,
        license: str = "other",
    ) -> list[str]:
        """Upload this model to the hub repository ``repo_id`` (``org/name``, created if needed), as transformers'
        ``push_to_hub``: :meth:`save_pretrained` (with ``tokenizer``) into a temporary directory, plus a
        model card (:func:`vlbert.hub.model_card`). ``from_pretrained(repo_id)`` reads it back. The model alone has
        no processor (``processor.json``, what :func:`vlbert.inference.pipeline` reads): to upload a run or
        converted directory with its processor, as it is, use :func:`vlbert.hub.push_model_directory`.

        Returns:
            the uploaded files' names.
        Raises:
            ValueError: ``repo_id`` is not ``org/name``. Errors of huggingface_hub (no token, no network).
        """
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp) / repo_id.split("/")[-1]
            self.save_pretrained(directory, tokenizer=tokenizer)
            return push_model_directory(directory, repo_id, private=private, token=token, license=license)
