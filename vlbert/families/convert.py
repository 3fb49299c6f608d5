"""Write a published checkpoint as a vlbert model directory: ``config.json`` + ``model.safetensors`` (our layout,
what ``from_pretrained`` and every tool's ``--init-from`` read), the family's tokenizer, and its processor
(``processor.json``: the task, labels, lengths and the features the weights were trained on, which the pipelines and fine-tuning
check regions against)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

from vlbert import models
from vlbert.common.user_files import expect, read_json, read_yaml
from vlbert.config import VLBertConfig
from vlbert.families.base import CheckpointFamily, WrongForm, load_torch_file, read_directory
from vlbert.families.registry import FAMILIES
from vlbert.processing import VLProcessor
from vlbert.tokenization import load_tokenizer

logger = logging.getLogger(__name__)


def lower_cases(tokenizer) -> bool:
    """Whether a (fast) tokenizer lower-cases its input (its normaliser turns "A" into "a")."""
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    if normalizer is not None:
        return normalizer.normalize_str("Hello A") == "hello a"
    return bool(getattr(tokenizer, "do_lower_case", False))


def check_tokenizer_casing(tokenizer, family: CheckpointFamily, vocab_size: int) -> None:
    """Raise ``ValueError`` unless ``tokenizer`` is the kind ``family`` was trained with: the same casing (a cased
    checkpoint read through a lower-casing tokenizer never sees a capital) and ``vocab_size`` pieces."""
    lowercases = lower_cases(tokenizer)
    if family.cased and lowercases:
        raise ValueError(
            f"the tokenizer lower-cases text, but {family.name} checkpoints are cased "
            f"({family.tokenizer}); pass --tokenizer with {family.tokenizer}'s files"
        )
    if not family.cased and not lowercases:
        raise ValueError(
            f"the tokenizer keeps case, but {family.name} checkpoints are uncased "
            f"({family.tokenizer}); pass --tokenizer with {family.tokenizer}'s files"
        )
    if len(tokenizer) != vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} pieces but the checkpoint's vocabulary has {vocab_size}; "
            f"pass --tokenizer with {family.tokenizer}'s files"
        )


def read_labels(path: str | os.PathLike) -> list[str]:
    """Label names in the model's output order from a JSON file: a list, ``{name: index}`` (UNITER's
    ``ans2label.json``) or ``{index: name}``; or a text file, one name per line.

    Raises:
        FileNotFoundError: no such file. ValueError: indices that are not 0..N-1.
    """
    path = Path(path)
    if path.suffix != ".json":
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    fix = (
        'write {"name": index, ...} with the indices as numbers (UNITER\'s ans2label.json), {"index": "name"} '
        "(label2ans) or a list of names"
    )
    values = expect(read_json(path, "label map", fix), (list, dict), str(path), "a label map", fix)
    if isinstance(values, list):
        return [str(v) for v in values]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values.values()):
        pairs = {v: str(name) for name, v in values.items()}
    elif all(k.isdigit() for k in values):
        pairs = {int(k): str(name) for k, name in values.items()}
    else:
        name, value = next((k, v) for k, v in values.items() if not isinstance(v, int) or isinstance(v, bool))
        raise ValueError(f"{path}: label {name!r} has index {value!r}, not a number; {fix}")
    if sorted(pairs) != list(range(len(pairs))):
        raise ValueError(f"{path}: label indices must be 0..{len(pairs) - 1}, got {sorted(pairs)[:5]}...; {fix}")
    return [pairs[i] for i in range(len(pairs))]


def check_finite(state: dict[str, Any], source) -> None:
    """Raise ``ValueError`` naming the floating tensors of ``state`` that hold NaN or inf (a diverged or damaged
    checkpoint: converted, it would look finished and fail in fine-tuning as if the learning rate were wrong)."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(v.isfinite().all())]
    if bad:
        raise ValueError(
            f"{source}: {len(bad)} tensor(s) hold NaN or inf ({', '.join(bad[:4])}"
            f"{', ...' if len(bad) > 4 else ''}): the checkpoint diverged or is damaged; convert another "
            "one, or pass --allow-nonfinite if you know why"
        )


def read_source_config(path: str | os.PathLike, family: str) -> dict[str, Any]:
    """A family's own config: JSON (UNITER's ``config/uniter-base.json``) or YAML (VL-BERT's ``cfgs/*.yaml``).

    Raises:
        FileNotFoundError: no such file. UserFileError (a ValueError): cut off, not JSON / YAML, or not a mapping
            (the file, line and column named).
    """
    path = Path(path)
    fix = f"give {family}'s own config (e.g. UNITER's config/uniter-base.json, VL-BERT's cfgs/*.yaml) as published"
    values = (
        read_yaml(path, f"{family} config", fix)
        if path.suffix in (".yaml", ".yml")
        else read_json(path, f"{family} config", fix)
    )
    return expect(values, dict, str(path), f"a {family} config", fix)


def detect_family(state) -> str | None:
    """The name of the family whose key layout ``state`` has in any of its published forms (each family's
    :meth:`~vlbert.families.base.CheckpointFamily.normalise` first: airsplay's ``module.bert.*`` is LXMERT's),
    or None."""
    return next((name for name, family in FAMILIES.items() if family.matches(family.normalise(state))), None)


def sniff_family(source: Path) -> str | None:
    """The family of the checkpoint at ``source`` whatever its form (a file through
    :func:`~vlbert.families.base.load_torch_file`; a directory's weights, or its one ``.pt`` file), or None where
    it cannot be read or is no family's. Read only to name the family in a refusal."""
    try:
        if source.is_dir():
            files = sorted(source.glob("*.pt"))
            state = read_directory(source, "a checkpoint")[0] if not files else load_torch_file(files[0])
        else:
            state = load_torch_file(source)
    except (ValueError, OSError):
        return None
    return detect_family(state)


#: What a converted model directory holds (weights, configs, processor, tokenizer): ``--overwrite`` replaces a
#: directory of these, and refuses one holding anything else.
MODEL_FILES = (
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "processor.json",
    "inference.json",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)


def convert_checkpoint(
    family: str,
    source: str | os.PathLike,
    output_dir: str | os.PathLike,
    tokenizer: str | os.PathLike | None = None,
    labels: str | Sequence[str] | None = None,
    config: str | os.PathLike | None = None,
    overwrite: bool = False,
    allow_nonfinite: bool = False,
) -> dict[str, Any]:
    """Convert a published checkpoint of ``family`` into a vlbert model directory ``output_dir``.

    Args:
        family: a key of :data:`vlbert.families.FAMILIES` ("uniter", "visualbert", "oscar", "vl-bert", "lxmert").
        source: the checkpoint: UNITER's ``.pt`` file, a VisualBERT, Oscar/VinVL or LXMERT directory, VL-BERT's
            ``.model``, airsplay/lxmert's ``.pth``.
        output_dir: written whole or not at all (built beside it and renamed at the end).
        tokenizer: a tokenizer directory or hub name (default: the family's, from the hub when online).
        labels: the answer/label names in the head's output order (a list, or a file for :func:`read_labels`);
            required by VQA heads to name answers (``answer_i`` otherwise, with a warning).
        config: the family's own config, JSON (UNITER's ``config/uniter-base.json``) or YAML (VL-BERT's
            ``cfgs/pretrain/base_prec_4x16G_fp32.yaml``), for what the tensors' shapes do not say (the head count;
            default 64 per head; VL-BERT: whether the file is prec or e2e).
        overwrite: replace an existing ``output_dir``.
        allow_nonfinite: convert tensors holding NaN or inf (refused otherwise: a model that cannot train).
    Returns:
        a report: family, model class, task, ``missing`` (newly initialised heads), ``dropped`` (source tensors
        not carried over, with why).
    Raises:
        ValueError: an unknown family; a checkpoint of another family (named, whatever its form: a directory for a
            one-file family too) or of none; a damaged file or one that holds code (whatever the unpickler raises:
            :func:`~vlbert.families.base.load_torch_object`); a tensor of the family's layout missing, or one outside
            it (named, with the family); a tokenizer of the wrong casing or size; labels of the wrong count; tensors the model has no place for
            or encoder tensors missing; tensors holding NaN or inf (named) without ``allow_nonfinite``; a
            transformers-format directory (VisualBERT, Oscar, LXMERT) without the config.json values its tensors do
            not show (the head count, and the head where the keys fit two).
        FileExistsError: ``output_dir`` is not empty and ``overwrite`` is not set, or (with ``overwrite``) holds a
            file other than a model directory's (:data:`MODEL_FILES`).
        FileNotFoundError: no source, or no tokenizer there (offline without --tokenizer).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown checkpoint family {family!r}; choose one of {sorted(FAMILIES)}")
    fam = FAMILIES[family]
    source, output_dir = Path(source).expanduser(), Path(output_dir).expanduser()
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    if output_dir.exists() and any(output_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{output_dir} is not empty; choose another --output-dir or pass --overwrite")
    if overwrite and output_dir.is_dir():  # --overwrite replaces a model directory, never a user's files
        foreign = sorted(
            p.name for p in output_dir.iterdir() if not p.name.startswith(".") and p.name not in MODEL_FILES
        )
        if foreign:
            raise FileExistsError(
                f"{output_dir} holds files that are not a converted model's ({', '.join(foreign[:4])}); --overwrite "
                "replaces a model directory, never other files: choose another --output-dir"
            )
    try:
        state, source_config = fam.read(source)
    except WrongForm as e:  # a directory for a one-file family, or the reverse: which family it is, if any
        other = sniff_family(source)
        if other is None or other == family:
            raise
        raise WrongForm(f"{e}; it is a {other} checkpoint: pass --from {other}") from e
    if config is not None:
        source_config = {**source_config, **read_source_config(config, family)}
    _check_source(fam, source, state, source_config, allow_nonfinite)
    converted = _convert(fam, source, state, source_config)
    model_config = VLBertConfig(**converted.config)
    tok = load_tokenizer(tokenizer or fam.tokenizer)
    check_tokenizer_casing(tok, fam, model_config.vocab_size)
    names = _label_names(converted.task, labels if labels is not None else converted.labels, model_config.num_labels)
    model = getattr(models, converted.model_class)(model_config)
    report = _load(model, converted.state, source, family)
    report.update(family=family, model_class=converted.model_class, task=converted.task, dropped=converted.dropped)
    info = {
        "task": converted.task,
        "max_text_length": fam.max_text_length,
        "max_regions": fam.features["max_regions"],
        "region_feature_dim": model_config.region_feature_dim,
        "detector": {k: fam.features[k] for k in ("fingerprint", "config", "extractor")},
        "converted_from": {
            "family": family,
            "source": str(source),
            "features": fam.features["description"],
            "reference": fam.reference,
            "tokenizer": str(tokenizer or fam.tokenizer),
            "parity": fam.parity,
        },
        **converted.info,
    }
    if names is not None:
        info["labels"] = names
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    try:
        model.save_pretrained(tmp, tokenizer=tok)
        VLProcessor.from_record(info, tok).save_pretrained(tmp, save_tokenizer_files=False)  # beside the tokenizer
        if output_dir.exists():
            shutil.rmtree(output_dir)
        os.replace(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def _convert(fam: CheckpointFamily, source: Path, state, source_config: dict):
    """``fam.convert``, its refusals in one line naming the file and the family: a tensor of the family's layout
    that the file lacks (a ``KeyError`` of the key map), a tensor outside it, a layer missing one of its weights.

    Raises:
        ValueError: as said.
    """
    try:
        return fam.convert(state, source_config)
    except KeyError as e:
        key = str(e.args[0]) if e.args else "?"
        theirs = fam.source_key(key)
        named = repr(theirs) + (f" (vlbert's {key!r})" if theirs != key else "")
        raise ValueError(
            f"{source}: this {fam.name} checkpoint lacks the tensor {named}, which its layout has: the "
            f"file is incomplete or was altered; convert the checkpoint as {fam.name} published it"
        ) from e
    except ValueError as e:
        if str(source) in str(e):
            raise
        raise ValueError(f"{source} ({fam.name}): {e}") from e


def _check_source(fam: CheckpointFamily, source: Path, state, source_config: dict, allow_nonfinite: bool) -> None:
    """Refuse what a conversion cannot know or should not carry: a directory without the config values its tensors
    do not show (``fam.config_fields``), non-finite tensors, another family's keys (see :func:`convert_checkpoint`'s
    Raises)."""
    if not fam.matches(state):
        other = detect_family(state)
        hint = (
            f"it is a {other} checkpoint: pass --from {other}"
            if other
            else f"its keys ({', '.join(sorted(state)[:3])}, ...) are no published family's"
        )
        raise ValueError(f"{source} is not a {fam.name} checkpoint; {hint}")
    if fam.config_fields and source.is_dir() and not all(k in source_config for k in fam.config_fields):
        raise ValueError(
            f"{source} has no config.json with {', '.join(fam.config_fields)}: its tensors do not say "
            "the head count (nor always the head); put the checkpoint's own config.json beside its "
            "weights (as save_pretrained writes it) or pass --config FILE"
        )
    if not allow_nonfinite:
        check_finite(state, source)


def _label_names(task: str, labels, num_labels: int) -> list[str] | None:
    if task == "nlvr2":
        return ["False", "True"]
    if task not in ("vqa", "snli-ve"):
        return None
    if labels is None:
        logger.warning(
            "no --labels: answers are named answer_0..answer_%d; pass the checkpoint's answer list "
            "(UNITER: utils/ans2label.json)",
            num_labels - 1,
        )
        return [f"answer_{i}" for i in range(num_labels)]
    names = read_labels(labels) if isinstance(labels, (str, os.PathLike)) else [str(x) for x in labels]
    if len(names) != num_labels:
        raise ValueError(f"{len(names)} labels given but the checkpoint's {task} head has {num_labels} outputs")
    return names


def _load(model, state, source, family: str) -> dict[str, Any]:
    """Load ``state`` into ``model``: every tensor must have a place and the encoder must be complete (else one line
    naming the tensors, in vlbert's names, and the ``family``); heads the checkpoint lacks are reported as newly
    initialised."""
    own = model.state_dict()
    unexpected = sorted(k for k in state if k not in own)
    if unexpected:
        raise ValueError(
            f"{source}: {family} tensors with no place in {type(model).__name__}: {unexpected[:8]}"
            f"{' ...' if len(unexpected) > 8 else ''} (vlbert's names); the file is not as {family} "
            "publishes it"
        )
    missing = sorted(k for k in own if k not in state)
    encoder_missing = [k for k in missing if k.startswith("bert.") and not k.startswith("bert.pooler.")]
    if encoder_missing:
        raise ValueError(
            f"{source}: encoder tensors missing: {encoder_missing[:8]}"
            f"{' ...' if len(encoder_missing) > 8 else ''} (vlbert's names); this {family} checkpoint is "
            "incomplete or was altered"
        )
    model.load_converted_state_dict(state, source=str(source))
    if missing:
        logger.warning("newly initialised (not in %s): %s", source, ", ".join(missing))
    return {"missing": missing}


__all__ = ["MODEL_FILES", "convert_checkpoint", "check_tokenizer_casing", "read_labels", "detect_family"]
