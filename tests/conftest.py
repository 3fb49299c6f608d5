"""Shared fixtures: tiny random configs, the packaged MiniLM checkpoint and a small real corpus."""

from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path

import pytest
import torch
from doc_runs import write_tiny_runs

from detectors.config import DetectorConfig
from vlbert.commands.scripts import script_main
from vlbert.data.corpus import load_bbc_news
from vlbert.tokenization import load_tokenizer, packaged_minilm_dir

# Two threads per test process; under pytest-xdist (-n N) the machine's cores are shared between the N workers.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, (os.cpu_count() or 2) // _WORKERS) if _WORKERS > 1 else 2)

ROOT = Path(__file__).resolve().parents[1]


def tool(name: str):
    """The ``main(argv)`` of ``tools/<name>.py``: its ``vlbert`` command with the script's fixed flags
    (:func:`vlbert.commands.scripts.script_main`), for running a command in-process without the error rule
    (exceptions keep their types; wrap it in :func:`vlbert.commands.run_tool` for the exit status)."""
    return script_main(name)


def tiny_text_trainer(
    output_dir, corpus, tokenizer, *, max_length: int, model: dict, packed: bool = True, hooks=(), **training
):
    """A :class:`vlbert.training.trainer.Trainer` of a tiny BertForPreTraining (``model``: the BertConfig sizes) on
    the pairs of every document of ``corpus`` (``max_length`` wordpieces), batched by the training loader with the
    masking collator (``packed``: the packed layout); ``training``: TrainingConfig fields over quiet defaults."""
    from vlbert.config import BertConfig
    from vlbert.data.corpus_pairs import CorpusPairsDataset
    from vlbert.data.loading import train_loader
    from vlbert.data.pretraining import MaskingCollator
    from vlbert.models.bert import BertForPreTraining
    from vlbert.training.trainer import Trainer, TrainingConfig

    data = CorpusPairsDataset(corpus, torch.arange(corpus.num_documents).numpy(), tokenizer, max_length, seed=0)
    collator = MaskingCollator.from_tokenizer(tokenizer, packed=packed)
    config = TrainingConfig(**{"output_dir": str(output_dir), "progress_bar": False, **training})
    torch.manual_seed(0)
    net = BertForPreTraining(BertConfig(vocab_size=len(tokenizer), max_position_embeddings=64, **model))

    def batches(epoch, start, rank, world):
        return train_loader(data, collator, config.batch_size, 0, epoch, start, rank, world, **config.loader_options())

    return Trainer(net, config, batches, hooks=hooks)


def random_hf_config(seed: int, **overrides):
    """A small random transformers.BertConfig with dropout off (eval-mode parity)."""
    import transformers

    rng = random.Random(seed)
    heads = rng.choice([1, 2, 4])
    values = dict(
        vocab_size=rng.randint(50, 300),
        hidden_size=heads * rng.choice([8, 16]),
        num_hidden_layers=rng.randint(1, 3),
        num_attention_heads=heads,
        intermediate_size=rng.randint(16, 80),
        hidden_act=rng.choice(["gelu", "gelu_new", "relu"]),
        max_position_embeddings=rng.choice([32, 64]),
        type_vocab_size=rng.choice([2, 3]),
        layer_norm_eps=rng.choice([1e-12, 1e-5]),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    values.update(overrides)
    return transformers.BertConfig(**values)


def padded_batch(vocab_size: int, batch: int = 4, seq_len: int = 12, seed: int = 0, type_vocab_size: int = 2):
    """input_ids/token_type_ids/attention_mask with rows of different real lengths (padding on the right)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab_size, (batch, seq_len), generator=g)
    lengths = torch.randint(2, seq_len + 1, (batch,), generator=g)
    lengths[0] = seq_len
    attention_mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    split = lengths // 2
    token_type_ids = ((torch.arange(seq_len)[None, :] >= split[:, None]) & (attention_mask == 1)).long()
    token_type_ids = token_type_ids.clamp(max=type_vocab_size - 1)
    return input_ids, token_type_ids, attention_mask


def write_jsonl(path, records: list[dict]):
    """Write ``records`` as a JSON-lines file; returns ``path``."""
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@contextlib.contextmanager
def like_a_worker(float64: bool = False):
    """Run in-process as a test's worker subprocess runs (one thread, as ``OMP_NUM_THREADS=1``; float64 as
    ddp_worker.py), both restored after: the reference runs of the distributed and preemption tests, whose own
    process is not under test, need no interpreter of their own."""
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    torch.set_num_threads(1)
    if float64:
        torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)


def wait_for_log_lines(proc, log, lines: int, timeout: float = 240.0) -> None:
    """Wait until the running ``proc`` has written ``lines`` lines to ``log`` (to interrupt it mid-run); fails
    if it ends first."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= lines:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be interrupted"


@pytest.fixture(autouse=True)
def cpu_unless_marked_gpu(request, monkeypatch):
    """The suite is written for the CPU: on a machine with a GPU, every test not marked ``gpu`` sees none, so that
    its trainer runs where its tolerances (and its bitwise comparisons after a resume: flash attention's backward
    is not deterministic) were set, and so do the processes it starts. Tests marked ``gpu``
    (``python -m pytest -m gpu``) see the GPU. Nothing changes on a machine without one. (accelerate's
    process-wide state needs no reset between tests: every Trainer makes its own, see
    :func:`vlbert.training.trainer.own_accelerator`.)"""
    if torch.cuda.is_available() and "gpu" not in request.keywords:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # and the processes it starts
    yield


@pytest.fixture(scope="session")
def minilm_dir():
    return packaged_minilm_dir()


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    """40 real BBC News articles as a directory of .txt files (one document each)."""
    root = tmp_path_factory.mktemp("corpus")
    records = load_bbc_news()
    for r in records[::55][:40]:
        (root / (r["id"].replace("/", "_") + ".txt")).write_text(r["text"], encoding="utf-8")
    return root


def reference_tokenization(texts, tokenizer) -> list[list[list[int]]]:
    """The reference for corpus preparation, written plainly: each document split into sentences, each sentence
    tokenised alone without special tokens; empty sentences and documents dropped."""
    from vlbert.data.corpus import split_sentences

    documents = []
    for text in texts:
        sentences = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in split_sentences(text)]
        sentences = [s for s in sentences if s]
        if sentences:
            documents.append(sentences)
    return documents


@pytest.fixture(scope="session")
def small_token_corpus(small_corpus, tokenizer, tmp_path_factory):
    """``small_corpus`` prepared once (:class:`vlbert.data.token_corpus.TokenCorpus`)."""
    from vlbert.data.token_corpus import TokenCorpus, prepare_corpus

    return TokenCorpus(prepare_corpus(small_corpus, tokenizer, tmp_path_factory.mktemp("corpora")))


#: The easy-VQA regions that the inference and extension tests share (the `easy` fixture).
N_EASY_IMAGES = 12
EASY_DETECTOR = DetectorConfig(options={"input_size": 96, "max_proposals": 8})


@pytest.fixture(scope="session")
def easy(tmp_path_factory):
    """12 easy-VQA test images (ids "0".."11"), their regions extracted with EASY_DETECTOR in a shard directory with its
    detector.json, as tools/extract_regions.py leaves it; the NLVR2 pairs' image ids alias the same regions."""
    from dataclasses import asdict, replace
    from types import SimpleNamespace

    from detectors.extract import extract_regions
    from detectors.shards import write_detector_info, write_shards
    from detectors.store import RegionStore
    from vlbert.data.easy_vqa import color_and_shape, image_paths

    root = tmp_path_factory.mktemp("inference")
    truth = list(color_and_shape("test").items())[:N_EASY_IMAGES]
    paths = image_paths("test")
    files = {str(k): paths[image_id] for k, (image_id, _) in enumerate(truth)}
    extractor = EASY_DETECTOR.build()
    regions = list(extract_regions(extractor, list(files.items()), batch_size=N_EASY_IMAGES, progress=False))
    pairs = [
        replace(regions[2 * p + j], image_id=f"dev-{p}-0-img{j}") for p in range(N_EASY_IMAGES // 2) for j in (0, 1)
    ]
    write_shards(regions + pairs, root / "shards")
    write_detector_info(
        root / "shards",
        {"detector": extractor.name, "fingerprint": EASY_DETECTOR.fingerprint(), "config": asdict(EASY_DETECTOR)},
    )
    return SimpleNamespace(
        root=root,
        shards=root / "shards",
        store=RegionStore(root / "shards"),
        files=files,
        truth={str(k): attrs for k, (_, attrs) in enumerate(truth)},
        easy_ids={str(k): image_id for k, (image_id, _) in enumerate(truth)},
    )


@pytest.fixture(scope="session")
def doc_runs(easy, tokenizer, tmp_path_factory):
    """name -> directory of a tiny untrained run of every pipeline's task over the `easy` regions
    (:func:`doc_runs.write_tiny_runs`): what the documentation's examples and the demo run on."""
    return write_tiny_runs(tmp_path_factory.mktemp("doc-runs"), easy, EASY_DETECTOR, tokenizer)
