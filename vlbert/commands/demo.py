"""A web page over a trained run or a converted checkpoint (Gradio, the optional extra ``demo-web``): upload an
image, then ask a question (VQA runs), test captions (image-text matching: VL pretraining, retrieval and converted
pretraining checkpoints), fill a [MASK] given the image (VL pretraining), and click a word to see its attention over
the image's regions, drawn on the image.

    pip install -e ".[demo-web]"
    vlbert demo runs/vqa-easy-vqa                      # http://127.0.0.1:7860
    vlbert demo models/uniter-base --detector-weights faster_rcnn_from_caffe_attr.pkl --port 8080

Answers come from the run's own pipelines (vlbert.inference), so they equal ``vlbert predict`` and the detector
check applies: regions are extracted with the detector the run was trained on, and another one is refused unless
--allow-other-detector.
"""

from __future__ import annotations

import argparse
import hashlib
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from vlbert.analysis.attention_maps import word_region_attention
from vlbert.detectors.images import read_pil_image
from vlbert.inference import PIPELINES, pipeline
from vlbert.processing import load_processor_record
from vlbert.recipes import TASKS

#: The demo's tabs: pipeline name -> the tab's title. A run gets the tabs whose pipeline takes it.
TABS = {
    "visual-question-answering": "Ask a question",
    "image-text-matching": "Match captions",
    "fill-mask": "Fill [MASK]",
}


class DemoSession:
    """What the page does, without the page: the run's pipelines for each tab it supports, and the word-to-region
    attention picture. Inputs are PIL images (RGB) or image paths; outputs are what Gradio shows.

    Args:
        run_dir: a run or converted checkpoint directory (processor.json, model, tokenizer) or hub id.
        device, detector_weights, allow_other_detector: as :func:`vlbert.inference.pipeline`.
    Raises:
        ValueError: the run's task has none of the demo's pipelines (text runs, NLVR2, SNLI-VE, RefCOCO).
    """

    def __init__(self, run_dir, device: str | None = None, detector_weights=None, allow_other_detector=False):
        record = load_processor_record(run_dir)
        self.task = record["task"]
        options = {"device": device, "detector_weights": detector_weights, "allow_other_detector": allow_other_detector}
        self.pipelines = {tab: pipeline(tab, run_dir, **options) for tab in TABS if PIPELINES[tab].takes(record)}
        if not self.pipelines:
            accepted = sorted(
                {name for name, task in TASKS.items() if task.pipeline and task.pipeline.name in TABS}
                | {name for tab in TABS for name in PIPELINES[tab].run_tasks}
            )
            raise ValueError(
                f"{run_dir} is a {self.task!r} run; the demo shows runs of {', '.join(accepted)} "
                "(use vlbert predict for the others)"
            )
        self._regions: dict[str, Any] = {}

    def _regions_of(self, image):
        """The image's regions from the run's detector, extracted once for the image last asked about (the same
        upload across tabs and clicks), known by its pixels' digest (a path: by the path)."""
        if isinstance(image, Image.Image):
            key = hashlib.sha256(image.tobytes()).hexdigest() + f"{image.size}{image.mode}"
        else:
            key = str(image)
        if key not in self._regions:
            self._regions = {key: next(iter(self.pipelines.values())).regions([image])[0]}
        return self._regions[key]

    def answer(self, image, question: str, top_k: int = 5) -> dict[str, float]:
        """VQA: answer -> score (sigmoid) of the ``top_k`` best answers."""
        return {
            r["answer"]: r["score"]
            for r in self.pipelines["visual-question-answering"](self._regions_of(image), question, top_k=top_k)
        }

    def match(self, image, captions: str) -> dict[str, float]:
        """Image-text matching: each line of ``captions`` -> P(match)."""
        texts = [line.strip() for line in captions.splitlines() if line.strip()]
        results = self.pipelines["image-text-matching"](self._regions_of(image), texts, top_k=len(texts))
        return {r["text"]: r["score"] for r in results}

    def fill(self, image, text: str, top_k: int = 5) -> dict[str, float]:
        """Fill-mask given the image: filler -> probability for the first [MASK] of ``text``."""
        results = self.pipelines["fill-mask"](self._regions_of(image), text, top_k=top_k)
        first = results[0] if results and isinstance(results[0], list) else results
        return {r["token_str"]: r["score"] for r in first}

    def words(self, text: str) -> list[str]:
        """The wordpieces the model reads for ``text`` ([CLS] ... [SEP])."""
        processor = next(iter(self.pipelines.values())).processor
        return processor.tokenizer.convert_ids_to_tokens(processor.text_ids([text])[0])

    def attention(self, image, text: str, word: int, layer: int = -1) -> tuple[np.ndarray, Image.Image]:
        """Word ``word`` of :meth:`words`'s attention over the regions in ``layer`` (heads averaged, renormalised
        over the regions: :func:`vlbert.analysis.attention_maps.word_region_attention`): float [R], and the image
        with each region's box drawn, its opacity and width by that attention.

        Raises:
            ValueError: ``word`` is not a position of the text.
        """
        pipe = next(iter(self.pipelines.values()))
        regions = self._regions_of(image)
        batch = pipe.processor.batch([text], [regions], pipe.device)
        num_text = batch["input_ids"].shape[1]
        if not 0 <= word < num_text:
            raise ValueError(f"word {word} is not a position of the text (0..{num_text - 1})")
        with torch.no_grad():
            attentions = pipe.model.bert(
                input_ids=batch["input_ids"],
                token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"],
                region_features=batch["region_features"],
                region_boxes=batch["region_boxes"],
                region_mask=batch["region_mask"],
                output_attentions=True,
            ).attentions
        weights = word_region_attention(tuple(a.cpu() for a in attentions), num_text, layer % len(attentions))[word]
        picture = read_pil_image(image)  # the pixels the regions were found on (EXIF orientation applied)
        return weights, draw_region_weights(picture, regions.boxes[: len(weights)], weights)


def draw_region_weights(image: Image.Image, boxes: np.ndarray, weights: np.ndarray) -> Image.Image:
    """``image`` (RGB) with each box (float [R, 4] pixels, x1 y1 x2 y2) filled and outlined in red, its opacity
    and line width by its weight relative to the largest (the strongest box drawn last, on top)."""
    scale = max(1.0, 320 / max(image.size))  # small images (easy-VQA: 64 px) enlarged so the boxes show
    base = image.convert("RGBA").resize((round(image.width * scale), round(image.height * scale)))
    layer = Image.new("RGBA", base.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    top = max(float(weights.max()), 1e-12)
    for box, w in sorted(zip(boxes, weights, strict=True), key=lambda bw: bw[1]):
        share = float(w) / top
        x1, y1, x2, y2 = (float(v) * scale for v in box)
        draw.rectangle(
            (x1, y1, x2, y2),
            fill=(255, 0, 0, int(90 * share)),
            outline=(255, 0, 0, int(60 + 195 * share)),
            width=max(1, round(1 + 3 * share)),
        )
    return Image.alpha_composite(base, layer).convert("RGB")


def build_app(session: DemoSession):
    """The Gradio Blocks page of ``session``: one tab per pipeline it has, and the attention panel. Its API names
    (for gradio_client): ``/answer``, ``/match``, ``/fill``, ``/words``, ``/attention``.

    Raises:
        ModuleNotFoundError: gradio is not installed (the message names the extra).
    """
    try:
        import gradio as gr
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "vlbert demo needs gradio: pip install 'vlbert[demo-web]' (or pip install gradio)"
        ) from e
    with gr.Blocks(title=f"vlbert demo: {session.task} run") as app:
        gr.Markdown(f"## vlbert: a {session.task} run\nUpload an image; regions come from the run's own detector.")
        image = gr.Image(type="pil", label="image", height=260)
        if "visual-question-answering" in session.pipelines:
            with gr.Tab(TABS["visual-question-answering"]):
                question = gr.Textbox(label="question", value="what color is the shape?")
                answers = gr.Label(label="answers", num_top_classes=5)
                gr.Button("Answer").click(session.answer, [image, question], answers, api_name="answer")
        if "image-text-matching" in session.pipelines:
            with gr.Tab(TABS["image-text-matching"]):
                captions = gr.Textbox(label="captions, one per line", lines=3, value="a red circle\na blue square")
                matches = gr.Label(label="P(match)")
                gr.Button("Match").click(session.match, [image, captions], matches, api_name="match")
        if "fill-mask" in session.pipelines:
            with gr.Tab(TABS["fill-mask"]):
                masked = gr.Textbox(label="text with [MASK]", value="a [MASK] circle")
                fillers = gr.Label(label="fillers")
                gr.Button("Fill").click(session.fill, [image, masked], fillers, api_name="fill")
        gr.Markdown(
            "### Attention over regions\nShow the words, then click one: the regions drawn on the image are "
            "shaded by the attention it gives them (last layer, heads averaged)."
        )
        with gr.Row():
            with gr.Column():
                text = gr.Textbox(label="text", value="what color is the shape?")
                show = gr.Button("Show words")
                words = gr.HighlightedText(
                    label="click a word",
                    combine_adjacent=False,
                    show_legend=False,
                    show_inline_category=False,
                    color_map={"word": "#dbeafe"},
                )
            picture = gr.Image(label="the word's attention over the regions", type="pil", height=320, format="png")
        show.click(lambda t: [(w, "word") for w in session.words(t)], text, words, api_name="words")

        def on_select(img, t, selected):
            return session.attention(img, t, selected.index)[1]

        on_select.__annotations__["selected"] = gr.SelectData  # how Gradio knows to pass the click
        words.select(on_select, [image, text], picture)
        position = gr.Number(value=1, precision=0, visible=False)
        position.change(
            lambda img, t, k: session.attention(img, t, int(k))[1],
            [image, text, position],
            picture,
            api_name="attention",
        )
    return app


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a run's output directory, a converted checkpoint directory, or a hub id")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--device", help="cpu, cuda, ... (default: CUDA when available)")
    p.add_argument("--detector-weights", help="the run's detector weights where you keep them (checked by sha256)")
    p.add_argument(
        "--allow-other-detector",
        action="store_true",
        help="accept regions of another detector than the run's (silently worse answers)",
    )
    p.add_argument("--share", action="store_true", help="also serve through a public Gradio link")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Serve the demo page of the run until interrupted; returns 0."""
    args = parse_args(argv)
    session = DemoSession(args.run, args.device, args.detector_weights, args.allow_other_detector)
    build_app(session).launch(server_name=args.host, server_port=args.port, share=args.share)
    return 0


__all__ = ["DemoSession", "build_app", "draw_region_weights", "main", "TABS"]
