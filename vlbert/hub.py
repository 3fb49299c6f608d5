"""The Hugging Face Hub both ways, through ``huggingface_hub``: a vlbert model directory (``config.json``,
``model.safetensors``, the tokenizer, ``processor.json``) uploaded with a model card, and a hub name (``org/name``)
read back as the local snapshot directory every loader takes (``snapshot_download``, which honours
``HF_HUB_OFFLINE`` and reads the local cache, ``HF_HUB_CACHE``, first).

    model.push_to_hub("org/uniter-base-vqa")            # or: vlbert convert ... --push-to-hub org/name
    VLBertForVQA.from_pretrained("org/uniter-base-vqa")  # pipeline("org/uniter-base-vqa"), --init-from org/name
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from vlbert.common.user_files import expect, read_json
from vlbert.run_files import LEGACY_PROCESSOR_FILE, PROCESSOR_FILE, read_processor_record

#: what a snapshot of a vlbert model repository holds (weights, config, tokenizer, the saved processor, the card).
MODEL_FILES = [
    "config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model.bin",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    PROCESSOR_FILE,
    LEGACY_PROCESSOR_FILE,
    "README.md",
]
CARD_NAME = "README.md"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_name(name_or_path: str | os.PathLike) -> bool:
    """Whether ``name_or_path`` is a hub repository id (``org/name``) and no local path."""
    text = str(name_or_path)
    return not Path(text).expanduser().exists() and is_repo_id(text)


def is_repo_id(text: str) -> bool:
    """Whether ``text`` has the form of a hub repository id, ``org/name``."""
    return bool(_REPO_ID.match(text))


def hub_snapshot(repo_id: str) -> Path:
    """The local directory of ``repo_id``'s model files: downloaded into the hub cache, or found there
    (``HF_HUB_OFFLINE=1``: the cache only).

    Raises:
        FileNotFoundError: not in the cache and the hub cannot be reached (offline), or no such repository
            (the cause named, with the fix).
    """
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=MODEL_FILES))
    except Exception as e:  # offline and not cached, no such repository, no access
        raise FileNotFoundError(
            f"no local directory {repo_id!r}, and the hub repository could not be read ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); go online (unset HF_HUB_OFFLINE) once to cache it, or "
            "pass a local model directory"
        ) from e


def model_card(directory: str | os.PathLike, license: str = "other") -> str:
    """A model card (``README.md``: YAML metadata, then text) for a vlbert model directory, from its config.json
    and saved processor (:func:`vlbert.run_files.read_processor_record`): ``library_name: vlbert``, ``license``, tags (the task, the family), the family and the
    reference code's commit it was converted from, the tokenizer, the region features' provenance and format
    (detector, fingerprint, feature size, regions per image) and the parity figure of the conversion.

    Raises:
        FileNotFoundError: no config.json in ``directory``.
    """
    directory = Path(directory)
    config = expect(
        read_json(directory / "config.json", "model config"), dict, str(directory / "config.json"), "a config.json"
    )
    info: dict[str, Any] = read_processor_record(directory) or {}
    source = info.get("converted_from") or {}
    detector = info.get("detector") or {}
    task = info.get("task", "")
    tags = [t for t in ("vlbert", "vision-language", task, source.get("family")) if t]
    architecture = (config.get("architectures") or ["?"])[0]
    lines = ["---", "library_name: vlbert", f"license: {license}", "tags:", *[f"- {t}" for t in tags]]
    if source.get("family"):
        lines += [f"base_model_family: {source['family']}", f"source_code: {source.get('reference', '')}"]
    lines += [
        "---",
        "",
        f"# {directory.name}",
        "",
        f"A vlbert `{architecture}` ({config.get('num_hidden_layers')} layers, hidden size "
        f"{config.get('hidden_size')}, region pathway `{config.get('region_embedding', 'none')}`)"
        f"{f' for the {task} task' if task else ''}.",
        "",
        "| | |",
        "| --- | --- |",
    ]
    rows = {
        "family": source.get("family"),
        "converted from": source.get("source") and Path(source["source"]).name,
        "reference code": source.get("reference"),
        "parity": source.get("parity"),
        "tokenizer": source.get("tokenizer") or "saved with the model (vocab.txt / tokenizer.json)",
        "region features": source.get("features") or detector.get("extractor"),
        "feature format": f"{info.get('region_feature_dim', config.get('region_feature_dim'))}-d features + "
        f"boxes (x1, y1, x2, y2) normalised to [0, 1], up to {info.get('max_regions', '?')} "
        "regions per image"
        if "region_feature_dim" in config
        else None,
        "detector fingerprint": detector.get("fingerprint"),
        "labels": len(info.get("labels") or []) or None,
    }
    lines += [f"| {k} | {v} |" for k, v in rows.items() if v]
    lines += [
        "",
        'Load it with `vlbert`: `vlbert.inference.pipeline("<this repo>")`, '
        '`<model class>.from_pretrained("<this repo>")`, or `--init-from <this repo>` in any training tool.',
        "",
    ]
    return "\n".join(lines)


def push_model_directory(
    directory: str | os.PathLike,
    repo_id: str,
    private: bool = False,
    commit_message: str = "Upload vlbert model",
    token: str | None = None,
    license: str = "other",
) -> list[str]:
    """Upload a vlbert model directory to the hub repository ``repo_id`` (created if needed), its model card
    (:func:`model_card`) written into it as ``README.md`` first unless one is there.

    Returns:
        the uploaded files' names (relative to ``directory``), sorted.
    Raises:
        FileNotFoundError: ``directory`` has no config.json or no weights (not a model directory).
        ValueError: ``repo_id`` is not ``org/name``.
        Errors of huggingface_hub (no token, no network) as it raises them.
    """
    from huggingface_hub import HfApi

    directory = Path(directory)
    if not is_repo_id(repo_id):
        raise ValueError(f"--push-to-hub {repo_id!r} is not a hub repository id; write it as org/name")
    if not (directory / "config.json").is_file() or not any(directory.glob("*.safetensors")):
        raise FileNotFoundError(f"{directory} is not a model directory (config.json + model.safetensors)")
    card = directory / CARD_NAME
    if not card.exists():
        tmp = card.with_suffix(".md.tmp")
        tmp.write_text(model_card(directory, license), encoding="utf-8")
        os.replace(tmp, card)
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    files = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    api.upload_folder(folder_path=str(directory), repo_id=repo_id, commit_message=commit_message)
    return files


__all__ = [
    "hub_snapshot",
    "is_hub_name",
    "is_repo_id",
    "model_card",
    "push_model_directory",
    "MODEL_FILES",
    "CARD_NAME",
]
