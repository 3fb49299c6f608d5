"""Look inside a model: fill-mask, attention pictures, generation from the masked LM, layer probes.

    vlbert explain fill-mask --model runs/vl-default --text "a [MASK] circle" --easy-vqa-image test/0
    vlbert explain attention --model minilm --text "The markets fell. Shares closed lower." --out docs/
    vlbert explain regions --model runs/vl-default --easy-vqa-image test/3 --text "a blue circle" \\
        --word blue --out docs/
    vlbert explain alignment --model runs/vl-wra --easy-vqa-image test/3 --text "a blue circle" \\
        --word blue --out docs/      # the word-region transport plan (UNITER's WRA) instead of attention
    vlbert explain alignment-share --model runs/vl-wra --images 800   # its mass on the shape's regions
    vlbert explain generate --model runs/vl-default --easy-vqa-split test --images 500 --length 3
    vlbert explain probe --task bbc-news --model minilm --out docs/
    vlbert explain probe --task easy-vqa-color --model runs/vl-default --out docs/

--model takes a checkpoint directory or "minilm". Images with --easy-vqa-image are read with the run's own detector
(its saved processor; the VL default run's settings for a checkpoint without one), extracted and cached on first
use, and as many regions as the run was trained with.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import vlbert
from vlbert.analysis.alignment_share import alignment_share, object_box
from vlbert.analysis.attention_maps import (
    head_statistics,
    plot_head_statistics,
    plot_text_attention,
    plot_word_regions,
    word_region_attention,
    word_region_transport,
)
from vlbert.analysis.fill_mask import fill_mask
from vlbert.analysis.generation import gibbs_sample, mask_predict
from vlbert.analysis.probe_data import probe_features
from vlbert.analysis.probing import plot_probe, probe_layers
from vlbert.common.user_files import read_json
from vlbert.data.easy_vqa import color_and_shape, easy_vqa_shards, image_paths
from vlbert.detectors.config import DetectorConfig
from vlbert.detectors.images import load_image, read_pil_image
from vlbert.detectors.shards import load_regions
from vlbert.processing import Detection, VLProcessor
from vlbert.processing.images import ImagePreprocessing, with_image
from vlbert.processing.regions import pad_regions
from vlbert.tokenization import load_tokenizer, resolve_model_path
from vlbert.training.run_config import load_run_config

EASY_VQA_DETECTOR_CONFIG = "detectors/easy-vqa"  # the easy-VQA runs' detector
EASY_VQA_MAX_REGIONS = 16


def load(model_path: str, vl: bool):
    """The pretraining model (VL or text, from the checkpoint's config) and its tokenizer."""
    path = resolve_model_path(model_path)
    config = read_json(Path(path) / "config.json", "model config")
    if vl and config.get("model_type") != "vlbert":
        raise ValueError(
            f"{model_path} is a text model (model_type {config.get('model_type')!r}); this command reads "
            "an image's regions: give a vision-language run (vlbert pretrain --modality vl, a VL "
            "fine-tuning run) or a converted UNITER / VisualBERT / Oscar model"
        )
    cls = vlbert.VLBertForPreTraining if vl or config.get("model_type") == "vlbert" else vlbert.BertForPreTraining
    return cls.from_pretrained(path).eval(), load_tokenizer(path)


def easy_vqa_detector():
    """The :class:`vlbert.detectors.config.DetectorConfig` of configs/detectors/easy-vqa.yaml (the VL default run's)."""
    return DetectorConfig.from_section(load_run_config(EASY_VQA_DETECTOR_CONFIG)["detector"])


def run_processor(model_path: str) -> VLProcessor:
    """The processor the run at ``model_path`` was trained with (:class:`~vlbert.processing.VLProcessor`: its
    detector, the regions it keeps per image, its tokenizer), or for a checkpoint without one the VL default run's
    settings (the easy-VQA detector, its regions per image).

    Raises:
        ValueError: a text-only run, or one whose regions were imported (no detector to rebuild): explain cannot
            extract images for it.
    """
    path = resolve_model_path(model_path)
    processor = VLProcessor.saved(path)
    if processor is None:
        return VLProcessor(
            name_or_path=path, max_regions=EASY_VQA_MAX_REGIONS, detection=Detection(easy_vqa_detector())
        )
    if not processor.uses_regions:
        raise ValueError(
            f"{model_path} is a {processor.task} run without regions; this command reads an image's "
            "regions: give a vision-language run (vlbert pretrain --modality vl, a VL fine-tuning run)"
        )
    if processor.detector is None:
        raise ValueError(
            f"{model_path} was trained on imported regions ({processor.region_source.extractor})"
            ": no detector can be rebuilt to read easy-VQA images for it"
        )
    return processor


def run_preprocessing(model_path: str) -> ImagePreprocessing | None:
    """How the run at ``model_path`` turns an image into its visual backbone's pixels (its saved processor's
    image preprocessing), or None for a run that reads detector features only."""
    processor = VLProcessor.saved(resolve_model_path(model_path))
    return processor.image_preprocessing if processor is not None else None


def refuse_visual_backbone(args) -> None:
    """Raise ValueError, naming the commands that do run, for a run whose model computes its region features from
    the pixels (``model.visual_backbone``): this command feeds many images' detector features."""
    if run_preprocessing(args.model) is not None:
        raise ValueError(
            f"{args.what} feeds the detector's region features of many images, but {args.model}'s model "
            "computes them from the pixels (model.visual_backbone); fill-mask, regions and alignment "
            "read one image's pixels and do run on it"
        )


def easy_vqa_regions(split: str, cache_dir: str, detector=None, image_ids: list[str] | None = None):
    """image id -> regions of an easy-VQA split (or of ``image_ids`` only), extracted with ``detector`` (default:
    the VL default run's; cached)."""

    regions = load_regions(easy_vqa_shards(detector or easy_vqa_detector(), cache_dir, image_ids))
    return {k: v for k, v in regions.items() if k.startswith(split + "/")}


def image_regions(args):
    """(regions, the run's processor) of ``--easy-vqa-image`` read with the ``--model`` run's detector; for a run whose
    model has a visual backbone, :class:`~vlbert.processing.images.ImageRegions` with the image's pixels as the run
    preprocesses them.

    Raises:
        ValueError: no --easy-vqa-image, or no such image id in the split.
    """
    if not args.easy_vqa_image or "/" not in args.easy_vqa_image:
        raise ValueError(f"{args.what} needs --easy-vqa-image SPLIT/N, e.g. test/3")

    processor = run_processor(args.model)
    split = args.easy_vqa_image.split("/")[0]
    known = image_paths(split) if split in ("train", "test") else {}
    if args.easy_vqa_image not in known:
        raise ValueError(
            f"--easy-vqa-image {args.easy_vqa_image}: no such easy-VQA image (ids are train/N or test/N, "
            f"N < {len(known) or 'the split size'})"
        )
    found = easy_vqa_regions(split, args.cache_dir, processor.detector, [args.easy_vqa_image])[args.easy_vqa_image]
    preprocessing = run_preprocessing(args.model)  # a visual backbone: the boxes, and the pixels under them
    if preprocessing is not None:
        found = with_image(found, preprocessing.read(known[args.easy_vqa_image]))
    return found, processor


def require_text(args) -> str:
    if not args.text:
        raise ValueError(f"{args.what} needs --text")
    return args.text


def fill_mask_command(args, out: Path) -> None:
    """fill-mask: the top fillers of each [MASK] in --text (with an image's regions when given)."""
    text = require_text(args)
    model, tok = load(args.model, vl=bool(args.easy_vqa_image))
    if args.easy_vqa_image:
        found, processor = image_regions(args)
        regions = processor.region_item(found)
    else:
        regions = None
    for k, fillers in enumerate(fill_mask(model, tok, text, args.top_k, regions)):
        print(f"[MASK] {k}: " + ", ".join(f"{f['token_str']} {f['score']:.3f}" for f in fillers))


def attention_command(args, out: Path) -> None:
    """attention: per-head attention pictures and statistics of --text."""
    import torch

    enc_text = require_text(args)
    model, tok = load(args.model, vl=False)
    enc = tok(enc_text, return_tensors="pt")
    with torch.no_grad():
        attentions = model.bert(
            enc["input_ids"], enc["token_type_ids"], enc["attention_mask"], output_attentions=True
        ).attentions
    tokens = tok.convert_ids_to_tokens(enc["input_ids"][0])
    plot_text_attention(attentions, tokens, out / "attention-heads.png")
    stats = head_statistics(attentions, enc["input_ids"], enc["attention_mask"], tok.cls_token_id, tok.sep_token_id)
    plot_head_statistics(stats, out / "attention-head-statistics.png")
    print(json.dumps({k: v.round(3).tolist() for k, v in stats.items()}))
    print(f"wrote {out / 'attention-heads.png'} and {out / 'attention-head-statistics.png'}")


def regions_command(args, out: Path) -> None:
    """regions / alignment: a word's attention (or transport plan) over an easy-VQA image's regions."""
    import torch

    text = require_text(args)
    r, processor = image_regions(args)
    split = args.easy_vqa_image.split("/")[0]
    model, tok = load(args.model, vl=True)
    enc = tok(text, return_tensors="pt")
    tokens = tok.convert_ids_to_tokens(enc["input_ids"][0])
    if args.word not in tokens:
        raise ValueError(
            f"--word {args.word!r} is not a wordpiece of --text; choose one of "
            f"{[t for t in tokens if t not in (tok.cls_token, tok.sep_token)]}"
        )
    word = tokens.index(args.word)
    padded = pad_regions([processor.region_item(r)])
    if args.what == "alignment":  # the optimal transport plan of word-region alignment, row-normalised
        matrix, distance = word_region_transport(model, enc["input_ids"], padded)
        title = f"{args.text!r}, word-region transport plan (distance {distance:.3f})"
    else:
        with torch.no_grad():
            output = model.bert(**enc, **padded, output_attentions=True)
        cross = output.cross_attentions is not None  # a two-stream model: its cross-modality layers' maps
        attentions = output.cross_attentions if cross else output.attentions
        layer = args.layer if args.layer >= 0 else len(attentions) - 1
        matrix = word_region_attention(attentions, len(tokens), layer, cross=cross)
        title = f"{args.text!r}, {'cross-modality ' if cross else ''}layer {layer + 1}, heads averaged"
    n = matrix.shape[1]
    labels = [f"{k}:{int(b[2] - b[0])}x{int(b[3] - b[1])}" for k, b in enumerate(r.boxes[:n])]
    image = read_pil_image(image_paths(split)[args.easy_vqa_image])
    path = out / f"{args.what}-{args.easy_vqa_image.replace('/', '-')}-{tokens[word]}.png"
    plot_word_regions(
        image,
        r.boxes[:n],
        tokens,
        matrix,
        word,
        labels,
        path,
        title=title,
        quantity="attention" if args.what == "regions" else "transport",
    )
    key = "attention_to_regions" if args.what == "regions" else "transport_to_regions"
    print(
        json.dumps({"word": tokens[word], key: matrix[word].round(3).tolist(), "boxes": r.boxes[:n].round(1).tolist()})
    )
    print(f"wrote {path}")


def alignment_share_command(args, out: Path) -> None:
    """alignment-share: over --images easy-VQA images, the share of the colour and shape words' transported mass
    (WRA's plan) on the shape's regions, against a plan blind to content (vlbert.analysis.alignment_share)."""
    refuse_visual_backbone(args)
    processor = run_processor(args.model)
    model, _ = load(args.model, vl=True)
    truth = color_and_shape(args.easy_vqa_split)
    ids = list(truth)[: args.images]
    regions = easy_vqa_regions(args.easy_vqa_split, args.cache_dir, processor.detector, ids)
    paths = image_paths(args.easy_vqa_split)

    def examples():
        for i in ids:
            box = object_box(load_image(paths[i]))
            if box is not None and i in regions:
                color, shape = truth[i]
                yield f"a {color} {shape}", regions[i], box, (color, shape)

    result = alignment_share(model, processor, examples())
    colour, shape = result.pop("by_word", None) or (None, None)
    print(json.dumps({**result, "colour": colour, "shape": shape}))


def generate_command(args, out: Path) -> None:
    """generate: captions from regions (mask-predict and Gibbs), with and without the regions."""
    refuse_visual_backbone(args)
    processor = run_processor(args.model)
    model, tok = load(args.model, vl=True)
    regions = easy_vqa_regions(args.easy_vqa_split, args.cache_dir, processor.detector)
    truth = color_and_shape(args.easy_vqa_split)
    ids = [i for i in truth if i in regions][: args.images]
    report = {}
    for method in ("mask_predict", "gibbs"):
        for masked in (False, True):
            texts = []
            for start in range(0, len(ids), 64):
                chunk = [processor.region_item(regions[i]) for i in ids[start : start + 64]]
                if method == "mask_predict":
                    texts += mask_predict(model, tok, args.length, args.iterations, chunk, mask_regions=masked)
                else:
                    texts += gibbs_sample(model, tok, args.length, 2, 1.0, chunk, mask_regions=masked, seed=start)
            words = [set(t.split()) for t in texts]
            key = f"{method}_{'without' if masked else 'with'}_regions"
            report[key] = {
                "color": sum(truth[i][0] in w for i, w in zip(ids, words, strict=True)) / len(ids),
                "shape": sum(truth[i][1] in w for i, w in zip(ids, words, strict=True)) / len(ids),
                "both": sum(truth[i][0] in w and truth[i][1] in w for i, w in zip(ids, words, strict=True)) / len(ids),
                "examples": [f"{truth[i][0]} {truth[i][1]}: {t}" for i, t in zip(ids[:5], texts[:5], strict=True)],
            }
    print(json.dumps(report, indent=2))


def probe_command(args, out: Path) -> None:
    """probe: per-layer linear probes of a task's labels."""
    if args.task.startswith("easy-vqa"):
        refuse_visual_backbone(args)
    processor = run_processor(args.model) if args.task.startswith("easy-vqa") else None
    train_x, train_y, eval_x, eval_y, title = probe_features(args.task, args.model, args.cache_dir, processor)
    result = probe_layers(train_x, train_y, eval_x, eval_y)
    path = out / f"probe-{args.task}.png"
    plot_probe(result, title, path)
    print(json.dumps(result.__dict__, indent=2))
    print(f"wrote {path}")


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Errors propagate for :func:`vlbert.commands.run_tool` to report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "what", choices=("fill-mask", "attention", "regions", "alignment", "alignment-share", "generate", "probe")
    )
    p.add_argument("--model", default="minilm")
    p.add_argument("--text")
    p.add_argument("--word", help="regions / alignment: the word whose attention / transport is drawn")
    p.add_argument("--layer", type=int, default=-1, help="regions: layer (default the last)")
    p.add_argument("--easy-vqa-image", help="an easy-VQA image id, e.g. test/3")
    p.add_argument("--easy-vqa-split", default="test")
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--length", type=int, default=3)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--task", choices=("bbc-news", "easy-vqa-color", "easy-vqa-answer"))
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--cache-dir", default="~/.cache/vlbert/regions")
    p.add_argument("--out", default="explain", help="directory for PNG files")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    COMMANDS[args.what](args, out)
    return 0


COMMANDS = {
    "fill-mask": fill_mask_command,
    "attention": attention_command,
    "regions": regions_command,
    "alignment": regions_command,
    "alignment-share": alignment_share_command,
    "generate": generate_command,
    "probe": probe_command,
}
