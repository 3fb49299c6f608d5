"""Builders the tests share: tiny configs and trainers, padded batches, JSONL files, a worker-like process state, tools run in-process."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import torch
from PIL import Image
from vlbert.detectors.config import DetectorConfig
from vlbert.detectors.shards import write_shards

from vlbert.commands.scripts import script_main

ROOT = Path(__file__).resolve().parents[2]


def tool(name: str):
    """The ``main(argv)`` of ``tools/<name>.py``: its ``vlbert`` command with the script's fixed flags
    (:func:`vlbert.commands.scripts.script_main`), for running a command in-process without the error rule
    (exceptions keep their types; wrap it in :func:`vlbert.commands.run_tool` for the exit status)."""
    return script_main(name)


def tiny_text_trainer(
    output_dir, corpus, tokenizer, *, max_length: int, model: dict, unpadded: bool = True, hooks=(), **training
):
    """A :class:`vlbert.training.trainer.Trainer` of a tiny BertForPreTraining (``model``: the BertConfig sizes) on
    the pairs of every document of ``corpus`` (``max_length`` wordpieces), batched by the training loader with the
    masking collator (``unpadded``: the unpadded layout); ``training``: TrainingConfig fields over quiet defaults."""
    from vlbert.config import BertConfig
    from vlbert.data.corpus_pairs import CorpusPairsDataset
    from vlbert.data.loading import train_loader
    from vlbert.data.pretraining import MaskingCollator
    from vlbert.models.bert import BertForPreTraining
    from vlbert.training.trainer import Trainer, TrainingConfig

    data = CorpusPairsDataset(corpus, torch.arange(corpus.num_documents).numpy(), tokenizer, max_length, seed=0)
    collator = MaskingCollator.from_tokenizer(tokenizer, unpadded=unpadded)
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
    helpers.distributed.launch's workers), both restored after: the reference runs of the distributed and preemption
    tests, whose own process is not under test, need no interpreter of their own."""
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


N_EASY_IMAGES = 12


EASY_DETECTOR = DetectorConfig(options={"input_size": 96, "max_proposals": 8})


def write_easy_vqa_shards(directory: Path, train: int, test: int = 0) -> Path:
    """Region shards in ``directory`` of the first ``train`` captioned easy-VQA training images and the first
    ``test`` captioned test images, extracted on the CPU by a tiny detector (64-pixel input, 6 proposals) and written
    without a detector.json, as a user's imported features are. Returns ``directory``."""
    from vlbert.data.easy_vqa import color_and_shape, image_paths

    ids = list(color_and_shape("train"))[:train] + (list(color_and_shape("test"))[:test] if test else [])
    paths = {**image_paths("train"), **(image_paths("test") if test else {})}
    extractor = DetectorConfig(options={"input_size": 64, "max_proposals": 6}).build()
    write_shards(extractor.extract_batch([Image.open(paths[i]).convert("RGB") for i in ids], ids), directory)
    return directory
