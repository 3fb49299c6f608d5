"""The text path: preparation equals a plain reference tokenisation, is cached by corpus and tokenizer, and serves
BERT pairs with their properties (balanced NSP, true B after A in its document, random B from another document,
deterministic per epoch, redrawn every epoch)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.builders import reference_tokenization

from vlbert.data.corpus import load_documents
from vlbert.data.corpus_pairs import CorpusPairsDataset, split_documents
from vlbert.data.pretraining import IS_NEXT, IS_RANDOM
from vlbert.data.token_corpus import TokenCorpus, prepare_corpus


def test_preparation_equals_the_reference_tokenisation_for_every_format(small_corpus, tokenizer, tmp_path):
    reference = reference_tokenization(load_documents(small_corpus), tokenizer)
    directory = prepare_corpus(small_corpus, tokenizer, tmp_path / "cache", num_proc=2)
    corpus = TokenCorpus(directory)
    assert corpus.meta["documents"] == len(reference) and corpus.meta["dtype"] == "uint16"
    assert [corpus.document(d) for d in range(corpus.num_documents)] == reference
    assert prepare_corpus(small_corpus, tokenizer, tmp_path / "cache") == directory  # cached
    # The packaged MiniLM's tokenizer.json pads and truncates to 128; preparation must not (nor change it).
    import transformers

    from vlbert.tokenization import resolve_model_path

    minilm = transformers.AutoTokenizer.from_pretrained(resolve_model_path("minilm"))  # fresh: padding still on
    assert minilm.backend_tokenizer.padding is not None
    prepared = TokenCorpus(prepare_corpus(small_corpus, minilm, tmp_path / "cache2"))
    assert minilm.backend_tokenizer.padding is not None  # the caller's tokenizer is left as it was
    expected = reference_tokenization(load_documents(small_corpus), minilm)
    assert [prepared.document(d) for d in range(prepared.num_documents)] == expected
    texts = [p.read_text() for p in sorted(small_corpus.glob("*.txt"))][:5]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in texts))
    jsonl = TokenCorpus(prepare_corpus(tmp_path / "docs.jsonl", tokenizer, tmp_path / "cache", text_field="body"))
    assert [jsonl.document(d) for d in range(5)] == reference[:5]
    (tmp_path / "docs.txt").write_text("\n\n".join(texts[:2]))
    plain = TokenCorpus(prepare_corpus(tmp_path / "docs.txt", tokenizer, tmp_path / "cache"))
    assert plain.num_documents >= 2 and plain.document(0)[0] == reference[0][0]
    counts = corpus.token_counts(len(tokenizer))
    assert (
        counts.sum() == corpus.meta["tokens"]
        and counts.argmax() == np.bincount([t for doc in reference for s in doc for t in s]).argmax()
    )
    # A changed file is another corpus: prepared anew, not served stale.
    first = sorted(small_corpus.glob("*.txt"))[0]
    changed = tmp_path / "changed"
    changed.mkdir()
    (changed / first.name).write_text(first.read_text())
    a = prepare_corpus(changed, tokenizer, tmp_path / "cache")
    (changed / first.name).write_text(first.read_text() + "\nOne more sentence here.")
    assert prepare_corpus(changed, tokenizer, tmp_path / "cache") != a
    with pytest.raises(ValueError, match="has no field 'text'"):
        prepare_corpus(tmp_path / "docs.jsonl", tokenizer, tmp_path / "cache")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="is empty"):
        prepare_corpus(tmp_path / "empty.txt", tokenizer, tmp_path / "cache")


def test_pairs_from_the_memory_map(small_corpus, tokenizer, tmp_path):
    corpus = TokenCorpus(prepare_corpus(small_corpus, tokenizer, tmp_path / "cache"))
    train, held = split_documents(corpus.num_documents, 0.1, 0)
    assert len(set(train) & set(held)) == 0 and len(train) + len(held) == corpus.num_documents and len(held) >= 1
    data = CorpusPairsDataset(corpus, train, tokenizer, 64, 0.1, seed=0)
    items = [data[i] for i in range(len(data))]
    labels = [x["next_sentence_label"] for x in items]
    share = sum(labels) / len(labels)
    assert abs(share - 0.5) < 4 * 0.5 / np.sqrt(len(labels)), share
    streams = {int(d): [t for s in corpus.document(int(d)) for t in s] for d in train}
    sep = tokenizer.sep_token_id

    def find(stream, piece, start=0):
        n = len(piece)
        return next((i for i in range(start, len(stream) - n + 1) if stream[i : i + n] == piece), -1)

    checked = {IS_NEXT: 0, IS_RANDOM: 0}
    for k, x in enumerate(items[:300]):
        ids = x["input_ids"]
        assert len(ids) <= 64 and ids[0] == tokenizer.cls_token_id and ids[-1] == sep
        cut = ids.index(sep)
        assert x["token_type_ids"] == [0] * (cut + 1) + [1] * (len(ids) - cut - 1)
        a, b = ids[1:cut], ids[cut + 1 : -1]
        own = data.row(k)[0]
        if x["next_sentence_label"] == IS_NEXT:
            assert (i := find(streams[own], a)) >= 0 and find(streams[own], b, i + len(a)) >= 0
        elif len(b) >= 8:  # a random B is a span of another training document
            assert find(streams[own], b) < 0 and any(find(s, b) >= 0 for d, s in streams.items() if d != own)
        checked[x["next_sentence_label"]] += 1
    assert min(checked.values()) > 50
    again = CorpusPairsDataset(corpus, train, tokenizer, 64, 0.1, seed=0)  # the cached sample index
    assert [again[i] for i in range(50)] == items[:50]
    again.set_epoch(1)
    assert [again[i] for i in range(50)] != items[:50]
    assert (data.lengths() <= 64).all() and len(data.lengths()) == len(data)


def test_text_pretraining_on_the_prepared_corpus(small_corpus, tmp_path):
    from vlbert.recipes import RECIPES, run

    config = {
        "modality": "text",
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
        },
        "data": {
            "corpus": str(small_corpus),
            "max_seq_length": 64,
            "eval_fraction": 0.1,
            "corpus_cache_dir": str(tmp_path / "cache"),
        },
        "training": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 6,
            "batch_size": 8,
            "learning_rate": 1e-3,
            "warmup_steps": 1,
            "log_every": 1,
            "progress_bar": False,
        },
    }
    metrics = run(RECIPES["text-pretraining"], config)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert np.isfinite(metrics["eval_mlm_loss"])
    # The majority baseline's token is the corpus's most frequent ordinary wordpiece, as the reference
    # tokenisation counts it (the prepared path counts it at preparation).
    from collections import Counter

    from vlbert.recipes.runner import RunContext
    from vlbert.recipes.text_pretraining import TextDataConfig, TextPretrainingData
    from vlbert.tokenization import load_tokenizer, resolve_model_path
    from vlbert.training.trainer import TrainingConfig

    tokenizer = load_tokenizer(resolve_model_path("minilm"))
    documents = reference_tokenization(load_documents(small_corpus), tokenizer)
    counts = Counter(t for doc in documents for sentence in doc for t in sentence)
    expected = next(t for t, _ in counts.most_common() if t not in set(tokenizer.all_special_ids))
    data = TextPretrainingData(
        RunContext(
            config,
            TrainingConfig.from_dict(config["training"]),
            TextDataConfig(**config["data"]),
            None,
            tokenizer,
            None,
        )
    )
    assert data.majority_token == expected
