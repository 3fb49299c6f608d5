"""The processor saved with every model (vlbert.processing.VLProcessor): its save / load round trip, its batch equal
to the one a recipe's training loader gave for the same samples, the fine-tuning compatibility check between two region sources, and
run directories written before it (inference.json only) still loading."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, is_dataclass, replace

import pytest
import torch
from helpers.builders import EASY_DETECTOR, N_EASY_IMAGES

from vlbert.inference import VQAPipeline, pipeline
from vlbert.processing import RegionSource, VLProcessor
from vlbert.processing.collator import GroundedCollator
from vlbert.recipes import RECIPES, run
from vlbert.recipes.vqa import VQAData

QUESTIONS = ["what color is the shape?", "is there a circle in the image of this long question about shapes?"]


def tensors(batch: dict) -> dict[str, torch.Tensor]:
    """The batch's tensors by name, the layout's (a dataclass of tensors, or of layouts) included."""
    out = {}
    for key, value in batch.items():
        if is_dataclass(value):
            out.update({f"{key}.{k}": v for k, v in tensors(vars(value)).items()})
        else:
            out[key] = value
    return out


def assert_same_batch(a: dict, b: dict) -> None:
    a, b = tensors(a), tensors(b)
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_save_and_load_give_the_same_processor_and_batches(doc_runs, easy, tmp_path):
    processor = VLProcessor.from_pretrained(doc_runs["vqa-easy-vqa"])
    assert processor.task == "vqa" and processor.max_regions == 16 and processor.max_text_length == 32
    assert processor.region_source.fingerprint == EASY_DETECTOR.fingerprint()
    assert processor.region_source.feature_dim == easy.store["0"].feature_dim
    processor.save_pretrained(tmp_path / "copy")
    assert (tmp_path / "copy" / "processor.json").is_file() and (tmp_path / "copy" / "tokenizer.json").is_file()
    loaded = VLProcessor.from_pretrained(tmp_path / "copy")
    assert loaded.to_dict() == processor.to_dict()
    regions = [easy.store["0"], easy.store["1"]]
    assert_same_batch(loaded(text=QUESTIONS, regions=regions), processor(text=QUESTIONS, regions=regions))
    # a text-only processor round-trips as one: no region source, and no regions taken
    text = VLProcessor.from_pretrained(doc_runs["bbc-news"])
    text.save_pretrained(tmp_path / "text")
    again = VLProcessor.from_pretrained(tmp_path / "text")
    assert again.region_source is None and again.to_dict() == text.to_dict() and again.labels[0] == "business"
    assert_same_batch(again(text=QUESTIONS), text(text=QUESTIONS))
    with pytest.raises(ValueError, match="text-only"):
        again(text=QUESTIONS, regions=regions)


def vqa_v2_files(root, questions: list[tuple[int, str, str, str]]) -> dict[str, str]:
    """VQA v2 question and annotation files (the fields :func:`vlbert.data.vqa.load_vqa_v2` reads) of ``questions``:
    (question id, image id in `easy`, question, answer), one split used for training and evaluation."""
    qs = [{"question_id": q, "image_id": int(image), "question": text} for q, image, text, _ in questions]
    anns = [{"question_id": q, "answers": [{"answer": a}] * 10} for q, _, _, a in questions]
    (root / "questions.json").write_text(json.dumps({"questions": qs}))
    (root / "annotations.json").write_text(json.dumps({"annotations": anns}))
    files = {"questions": str(root / "questions.json"), "annotations": str(root / "annotations.json")}
    return {f"{split}_{kind}": path for split in ("train", "eval") for kind, path in files.items()}


def test_the_recipes_training_batches_are_the_saved_processors(doc_runs, easy, tmp_path):
    """A VQA run (one step from the tiny VL run, on the `easy` regions): every batch its training loader gave equals
    what the processor saved with the run makes of the same questions and images (input tensors and unpadded layout,
    bit for bit, questions of different lengths and images of different region counts padded together); the run
    trained with the processor it saved (the same record, the collator its own)."""
    questions = [
        (k + 1, str(k), QUESTIONS[k % 2] if k % 3 else "what shape?", ("red", "blue", "circle")[k % 3])
        for k in range(N_EASY_IMAGES)
    ]
    out, built = tmp_path / "run", {}

    def build_data(ctx):
        built["data"] = VQAData(ctx)
        return built["data"]

    config = {
        "init_from": str(doc_runs["vl-default"]),
        "detector": asdict(EASY_DETECTOR),
        "data": {
            "dataset": "vqa-v2",
            "shards": str(easy.shards),
            "max_text_length": 9,  # the long question is cut
            "max_regions": 6,  # and the images with more regions
            **vqa_v2_files(tmp_path, questions),
        },
        "training": {"output_dir": str(out), "max_steps": 1, "batch_size": 5, "warmup_steps": 1, "progress_bar": False},
    }
    run(replace(RECIPES["vqa"], build_data=build_data), config)
    data = built["data"]
    saved = VLProcessor.from_pretrained(out)
    assert saved.to_dict() == data.processor.to_dict() and saved.task == "vqa" and saved.labels == data.answer_vocab
    assert saved.max_text_length == 9 and saved.max_regions == 6
    assert isinstance(data.collator, GroundedCollator) and data.tokenizer is data.processor.tokenizer
    batches, kept = list(data.train_batches(epoch=0, start=0, rank=0, world_size=1)), []
    assert sum(len(b["index"]) for b in batches) == 10  # batch_size 5, the last partial batch dropped
    for training in batches:
        examples = [data.train.examples[i] for i in training["index"].tolist()]
        served = saved(text=[ex.question for ex in examples], regions=[easy.store[ex.image_id] for ex in examples])
        assert_same_batch(served, {k: v for k, v in training.items() if k not in ("answer_targets", "index")})
        counts = [easy.store[ex.image_id].num_regions for ex in examples]
        assert served["region_mask"].sum(1).tolist() == [min(n, 6) for n in counts]
        kept += counts
    lengths = torch.cat([b["attention_mask"].sum(1) for b in batches])
    assert set(lengths.tolist()) == {5, 8, 9}  # "what shape?", "what color is the shape?", the long one cut to 9
    assert min(kept) < 6 < max(kept)  # images with fewer regions padded beside images cut to 6


def test_check_compatible_refuses_another_detector_and_accepts_text_only(easy):
    def processor(source):
        return VLProcessor(object(), task="vqa", region_source=source, name_or_path="runs/vqa")

    ours = RegionSource(EASY_DETECTOR.fingerprint(), asdict(EASY_DETECTOR), "timm", 24)
    other_detector = replace(EASY_DETECTOR, options=replace(EASY_DETECTOR.options, input_size=128))
    theirs = RegionSource(other_detector.fingerprint(), asdict(other_detector), "timm", 24)
    with pytest.raises(ValueError, match="input_size") as refused:
        processor(ours).check_compatible(processor(theirs))
    message = str(refused.value)
    assert "\n" not in message and "init_from runs/vqa" in message and EASY_DETECTOR.fingerprint() in message
    assert other_detector.fingerprint() in message and "allow_other_detector" in message
    with pytest.raises(ValueError, match="imported without saying what extracted them"):
        processor(ours).check_compatible(processor(RegionSource(extractor="butd")))
    processor(ours).check_compatible(processor(replace(ours)))  # the same features
    processor(ours).check_compatible(processor(None))  # a text run from a VL checkpoint
    processor(None).check_compatible(processor(theirs))  # a text checkpoint starts on any detector's regions


def test_a_run_written_before_processor_json_still_loads(doc_runs, easy, tmp_path):
    """A run directory with only inference.json (format_version 1, as runs and conversions wrote it before the
    processor) loads as the same processor, and its pipeline answers as the new run's."""
    new = doc_runs["vqa-easy-vqa"]
    old = tmp_path / "old"
    shutil.copytree(new, old, ignore=shutil.ignore_patterns("processor.json"))
    record = json.loads((new / "processor.json").read_text())
    legacy = {
        "format_version": 1,
        **{k: v for k, v in record.items() if k not in ("processor_class", "format_version")},
    }
    (old / "inference.json").write_text(json.dumps(legacy))
    assert not (old / "processor.json").exists()
    loaded, fresh = VLProcessor.from_pretrained(old), VLProcessor.from_pretrained(new)
    assert loaded.to_dict() == fresh.to_dict()
    regions = [easy.store["2"]]
    assert_same_batch(loaded(text=QUESTIONS[:1], regions=regions), fresh(text=QUESTIONS[:1], regions=regions))
    from_old = pipeline(old, device="cpu")
    assert isinstance(from_old, VQAPipeline)
    assert from_old(easy.store["2"], QUESTIONS[0]) == pipeline(new, device="cpu")(easy.store["2"], QUESTIONS[0])
    # saving it again writes the new file, read in preference to the old one
    loaded.save_pretrained(old, save_tokenizer_files=False)
    assert json.loads((old / "processor.json").read_text())["processor_class"] == "VLProcessor"
    with pytest.raises(FileNotFoundError, match="processor.json does not exist"):
        VLProcessor.from_pretrained(tmp_path / "nothing-here")
