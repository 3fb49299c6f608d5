"""The Hugging Face Hub both ways, offline: a converted model's card says what it is, the upload sends the model
directory (through a patched ``HfApi``: no network), and a populated hub cache with HF_HUB_OFFLINE=1 is read by
from_pretrained, pipeline and the tools' init_from resolution as a local directory would be."""

from __future__ import annotations

import json
import shutil

import huggingface_hub
import numpy as np
import pytest
import torch
import yaml
from helpers.builders import tool
from helpers.published import UNITER_CONFIG, write_tokenizer
from helpers.published_references import uniter_state
from vlbert.detectors.regions import Regions

from vlbert.commands import run_tool
from vlbert.inference import pipeline
from vlbert.models.uniter_heads import VLBertForVisualEntailment
from vlbert.tokenization import resolve_model_path


class RecordingApi:
    """Stands in for ``huggingface_hub.HfApi``: records what would be created and uploaded."""

    calls: list = []

    def __init__(self, token=None):
        self.token = token

    def create_repo(self, repo_id, private=False, exist_ok=False, **kwargs):
        RecordingApi.calls.append(("create_repo", repo_id, private))

    def upload_folder(self, folder_path, repo_id, commit_message="", **kwargs):
        files = sorted(p.name for p in __import__("pathlib").Path(folder_path).iterdir() if p.is_file())
        RecordingApi.calls.append(("upload_folder", repo_id, files))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tiny UNITER SNLI-VE checkpoint (its key names, float16) converted and pushed to ``org/uniter-ve`` through
    tools/convert_checkpoint.py --push-to-hub, HfApi patched."""
    tmp = tmp_path_factory.mktemp("hub")
    torch.save(uniter_state(answers=3), tmp / "ve.pt")
    (tmp / "cfg.json").write_text(json.dumps(UNITER_CONFIG))
    tok = write_tokenizer(tmp / "tok", 60, cased=True)
    RecordingApi.calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub, "HfApi", RecordingApi)
        argv = [
            "--from",
            "uniter",
            str(tmp / "ve.pt"),
            "--config",
            str(tmp / "cfg.json"),
            "--tokenizer",
            str(tok),
            "--output-dir",
            str(tmp / "out"),
            "--push-to-hub",
            "org/uniter-ve",
        ]
        assert run_tool(tool("convert_checkpoint"), argv) == 0
    return tmp / "out", list(RecordingApi.calls)


def test_the_model_card_says_what_the_model_is(converted):
    out, _ = converted
    text = (out / "README.md").read_text()
    meta = yaml.safe_load(text.split("---")[1])
    assert meta["library_name"] == "vlbert" and meta["license"] == "other"
    assert {"vlbert", "snli-ve", "uniter"} <= set(meta["tags"])
    assert meta["base_model_family"] == "uniter" and meta["source_code"] == "ChenRocks/UNITER@1dbfa62"
    info = json.loads((out / "processor.json").read_text())
    for expected in (
        "VLBertForVisualEntailment",
        str(out.parent / "tok"),  # the tokenizer it was converted with
        "bottom-up-attention Faster R-CNN",
        info["detector"]["fingerprint"],
        "24-d features",
        "up to 100 regions",
        "within 1e-5",
    ):
        assert expected in text, expected


def test_the_upload_sends_the_model_directory(converted, tmp_path):
    out, calls = converted
    assert calls[0] == ("create_repo", "org/uniter-ve", False)
    assert calls[1][:2] == ("upload_folder", "org/uniter-ve")
    assert {"config.json", "model.safetensors", "processor.json", "README.md", "vocab.txt"} <= set(calls[1][2])
    assert sorted(p.name for p in out.iterdir()) == calls[1][2]  # the whole directory, nothing else

    model = VLBertForVisualEntailment.from_pretrained(out)
    RecordingApi.calls = []
    # model.push_to_hub: save_pretrained + card (no processor.json: the model alone)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub, "HfApi", RecordingApi)
        files = model.push_to_hub("org/ve-copy")
    assert files == RecordingApi.calls[1][2] and {"config.json", "model.safetensors", "README.md"} == set(files)
    assert (
        run_tool(
            tool("convert_checkpoint"),
            [
                "--from",
                "uniter",
                str(out.parent / "ve.pt"),
                "--output-dir",
                str(tmp_path / "x"),
                "--push-to-hub",
                "no-org-name",
            ],
        )
        == 2
    )
    assert not (tmp_path / "x").exists()


def test_a_hub_name_loads_from_the_cache_offline(converted, tmp_path, monkeypatch):
    out, _ = converted
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--uniter-ve"
    shutil.copytree(out, repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    for name, value in (("HF_HUB_OFFLINE", True), ("HF_HUB_CACHE", str(tmp_path / "hub"))):
        monkeypatch.setenv(name, "1" if value is True else value)
        monkeypatch.setattr(huggingface_hub.constants, name, value)

    from_hub = VLBertForVisualEntailment.from_pretrained("org/uniter-ve")
    local = VLBertForVisualEntailment.from_pretrained(out)
    assert all(
        torch.equal(a, b) for a, b in zip(from_hub.state_dict().values(), local.state_dict().values(), strict=True)
    )
    assert resolve_model_path("org/uniter-ve") == str(repo / "snapshots" / sha)  # what --init-from reads
    g = np.random.default_rng(0)
    regions = Regions(
        "x",
        60,
        80,
        np.array([[0, 0, 40, 30], [10, 10, 80, 60]], np.float32),
        g.standard_normal((2, 24)).astype(np.float16),
        np.ones(2, np.float32),
    )
    answer = pipeline("org/uniter-ve", device="cpu")(regions, "a dog runs")
    assert answer == pipeline(out, device="cpu")(regions, "a dog runs")
    assert answer["label"] in ("contradiction", "entailment", "neutral")
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE"):
        pipeline("org/not-cached", device="cpu")
