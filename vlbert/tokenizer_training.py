"""Train a WordPiece (BERT) or BPE vocabulary on a corpus with Hugging Face ``tokenizers``.

Source: BERT section 3 (WordPiece, 30,000 pieces, uncased by default); Sennrich et al. 2016 (BPE). Both
segment any word into known pieces, so there is no unknown-word problem beyond unseen characters.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from vlbert.tokenization import save_tokenizer

BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_tokenizer(
    texts: Iterable[str],
    output_dir: str | os.PathLike,
    vocab_size: int = 30000,
    model: str = "wordpiece",
    lowercase: bool = True,
    min_frequency: int = 2,
):
    """Train a tokenizer on ``texts`` and save it as a transformers tokenizer directory.

    Args:
        texts: documents or lines of raw text.
        output_dir: receives tokenizer.json, tokenizer_config.json, special_tokens_map.json (and vocab.txt for
            WordPiece), loadable with :func:`vlbert.tokenization.load_tokenizer`.
        vocab_size: target number of pieces including the 5 special tokens.
        model: ``"wordpiece"`` (BERT's ``##`` continuation pieces) or ``"bpe"``.
        lowercase: lowercase and strip accents (BERT uncased).
        min_frequency: pieces rarer than this are not merged.
    Returns:
        the trained ``transformers.PreTrainedTokenizerFast``; [PAD] = 0, [UNK] = 1, [CLS] = 2, [SEP] = 3, [MASK] = 4.
    Raises:
        ValueError: unknown ``model`` or ``vocab_size`` smaller than the special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size <= len(BERT_SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(BERT_SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    if model == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=BERT_SPECIAL_TOKENS,
            continuing_subword_prefix="##",
        )
        tok.decoder = decoders.WordPiece(prefix="##")
    elif model == "bpe":
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=BERT_SPECIAL_TOKENS
        )
        tok.decoder = decoders.BPEDecoder()
    else:
        raise ValueError(f"model must be 'wordpiece' or 'bpe', got {model!r}")
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase or None)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainer=trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        do_lower_case=lowercase,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    save_tokenizer(fast, output_dir)
    return fast


__all__ = ["train_tokenizer", "BERT_SPECIAL_TOKENS"]
