"""tools/train_tokenizer.py: trained vocabularies load as BERT tokenizers and cover unseen words."""

from __future__ import annotations

import pytest

from vlbert.data.corpus import load_documents
from vlbert.tokenization import load_tokenizer
from vlbert.tokenizer_training import train_tokenizer


@pytest.mark.parametrize("model", ["wordpiece", "bpe"])
def test_trained_tokenizer_round_trips(small_corpus, tmp_path, model):
    docs = load_documents(small_corpus)
    train_tokenizer(docs, tmp_path, vocab_size=2000, model=model)
    tok = load_tokenizer(tmp_path)
    assert 500 < len(tok) <= 2000
    assert [tok.pad_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id] == [0, 2, 3, 4]
    enc = tok("Zyxwv quantum gadgets", "second segment")
    assert enc["input_ids"][0] == tok.cls_token_id and enc["input_ids"][-1] == tok.sep_token_id
    assert set(enc["token_type_ids"]) == {0, 1}
    pieces = tok.tokenize("zyxwv quantum gadgets")
    assert tok.unk_token not in pieces, "letters seen in training compose any new word"
    if model == "wordpiece":
        assert (tmp_path / "vocab.txt").is_file()
        assert tok.decode(tok("markets rallied")["input_ids"], skip_special_tokens=True) == "markets rallied"
