"""Shared fixtures: tiny random configs, the packaged MiniLM checkpoint and a small real corpus."""

from __future__ import annotations

import os

import pytest

# Nothing heavy is imported at the top of this file: under pytest-xdist the controlling process loads it too, before
# it starts the workers, and torch, transformers and vlbert cost it 6-10 s there (serial time, before any worker
# runs); each worker imports them with its test modules anyway.


def pytest_configure(config):
    """Two threads per test process; under pytest-xdist (-n N) each worker gets its share of the cores. (The
    controlling process runs no test and sets nothing.)"""
    if getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        return  # pytest-xdist's controlling process
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // workers) if workers > 1 else 2)


def pytest_collection_modifyitems(session, config, items):
    """The modules with the most ``slow`` tests run first, each module's tests in their order: pytest-xdist hands
    out tests in this order as workers free up, so the long tests start early and the short ones fill the end
    (the suite on 2 cores used to finish with one worker running the two-node tests for 45 s while the other was
    done). Whole modules move, so that a module's fixtures are still set up once per worker."""
    slow: dict = {}
    for item in items:
        slow[item.module] = slow.get(item.module, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.module])


@pytest.fixture(autouse=True)
def cpu_unless_marked_gpu(request, monkeypatch):
    """The suite is written for the CPU: on a machine with a GPU, every test not marked ``gpu`` sees none, so that
    its trainer runs where its tolerances (and its bitwise comparisons after a resume: flash attention's backward
    is not deterministic) were set, and so do the processes it starts. Tests marked ``gpu``
    (``python -m pytest -m gpu``) see the GPU. Nothing changes on a machine without one. (accelerate's
    process-wide state needs no reset between tests: every Trainer makes its own, see
    :func:`vlbert.training.trainer.own_accelerator`.)"""
    import torch

    if torch.cuda.is_available() and "gpu" not in request.keywords:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # and the processes it starts
    yield


@pytest.fixture(scope="session")
def minilm_dir():
    from vlbert.tokenization import packaged_minilm_dir

    return packaged_minilm_dir()


@pytest.fixture(scope="session")
def tokenizer():
    from vlbert.tokenization import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    """40 real BBC News articles as a directory of .txt files (one document each)."""
    from vlbert.data.corpus import load_bbc_news

    root = tmp_path_factory.mktemp("corpus")
    records = load_bbc_news()
    for r in records[::55][:40]:
        (root / (r["id"].replace("/", "_") + ".txt")).write_text(r["text"], encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def small_token_corpus(small_corpus, tokenizer, tmp_path_factory):
    """``small_corpus`` prepared once (:class:`vlbert.data.token_corpus.TokenCorpus`)."""
    from vlbert.data.token_corpus import TokenCorpus, prepare_corpus

    return TokenCorpus(prepare_corpus(small_corpus, tokenizer, tmp_path_factory.mktemp("corpora")))


#: The easy-VQA regions that the inference and extension tests share (the `easy` fixture).


@pytest.fixture(scope="session")
def easy(tmp_path_factory):
    """12 easy-VQA test images (ids "0".."11"), their regions extracted with EASY_DETECTOR in a shard directory with its
    detector.json, as tools/extract_regions.py leaves it; the NLVR2 pairs' image ids alias the same regions."""
    from dataclasses import asdict, replace
    from types import SimpleNamespace

    from helpers.builders import EASY_DETECTOR, N_EASY_IMAGES
    from vlbert.detectors.extract import extract_regions
    from vlbert.detectors.shards import write_detector_info, write_shards
    from vlbert.detectors.store import RegionStore

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
    from helpers.builders import EASY_DETECTOR
    from helpers.doc_runs import write_tiny_runs

    return write_tiny_runs(tmp_path_factory.mktemp("doc-runs"), easy, EASY_DETECTOR, tokenizer)


def pytest_collection_finish(session):
    """Stop at once where ``--dist loadgroup`` would not keep an ``xdist_group`` module in one worker (pytest
    9.2 with pytest-xdist 3.8: pytest-dev/pytest-xdist#1386): its tests would each rebuild the module's fixtures."""
    if not getattr(session.config.option, "loadgroup", False):  # set in xdist workers only
        return
    lost = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup lost the xdist_group of {len(lost)} tests ({lost[0]}, ...): this pytest and "
            "pytest-xdist do not work together; install the versions pyproject.toml's dev extra names"
        )
