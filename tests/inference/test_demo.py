"""``vlbert demo``: the page answers through Gradio's own client exactly as the run's pipelines do (VQA, caption
matching, fill-mask), and a word's attention picture shades the regions by the model's attention. Skipped
without gradio (the optional extra ``demo-web``)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vlbert.commands.demo import DemoSession, build_app, draw_region_weights
from vlbert.inference import pipeline

gradio = pytest.importorskip("gradio", reason="gradio is not installed (pip install -e '.[demo-web]')")
client_module = pytest.importorskip("gradio_client")
QUESTION = "what color is the shape?"


@pytest.fixture(scope="module")
def served(doc_runs):
    """The demo pages of the tiny VQA run and the tiny VL pretraining run, served on localhost."""
    apps = {}
    for name in ("vqa-easy-vqa", "vl-default"):
        session = DemoSession(doc_runs[name])
        app = build_app(session)
        app.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True)
        apps[name] = (session, app, client_module.Client(app.local_url, verbose=False))
    yield apps
    for _, app, _ in apps.values():
        app.close()


def _confidences(label: dict) -> dict[str, float]:
    return {c["label"]: c["confidence"] for c in label["confidences"]}


def test_the_page_answers_as_the_pipelines(served, doc_runs, easy):
    image = easy.files["0"]
    _, _, client = served["vqa-easy-vqa"]
    shown = _confidences(client.predict(client_module.handle_file(image), QUESTION, api_name="/answer"))
    expected = pipeline(doc_runs["vqa-easy-vqa"])(image, QUESTION, top_k=5)
    assert list(shown) == [r["answer"] for r in expected]
    assert np.allclose(list(shown.values()), [r["score"] for r in expected], atol=1e-6)

    _, _, client = served["vl-default"]
    captions = ["a red circle", "a blue square"]
    shown = _confidences(client.predict(client_module.handle_file(image), "\n".join(captions), api_name="/match"))
    expected = pipeline("image-text-matching", doc_runs["vl-default"])(image, captions, top_k=2)
    assert shown == pytest.approx({r["text"]: r["score"] for r in expected}, abs=1e-6)
    shown = _confidences(client.predict(client_module.handle_file(image), "a [MASK] circle", api_name="/fill"))
    expected = pipeline(doc_runs["vl-default"])(image, "a [MASK] circle", top_k=5)
    expected = expected[0] if isinstance(expected[0], list) else expected
    assert list(shown) == [r["token_str"] for r in expected]


def test_a_words_attention_shades_its_regions(served, easy):
    session, _, client = served["vqa-easy-vqa"]
    image = Image.open(easy.files["0"]).convert("RGB")
    weights, picture = session.attention(image, QUESTION, 2)
    assert weights.shape == (len(easy.store["0"].boxes[:16]),) and weights.sum() == pytest.approx(1.0, abs=1e-5)
    assert session.words(QUESTION)[2] == "color"
    path = client.predict(client_module.handle_file(easy.files["0"]), QUESTION, 2, api_name="/attention")
    assert np.array_equal(np.asarray(Image.open(path).convert("RGB")), np.asarray(picture))


def test_region_shading_follows_the_weights():
    image = Image.new("RGB", (100, 100), "white")
    boxes = np.array([[0, 0, 40, 40], [60, 60, 100, 100]], dtype=np.float32)
    picture = np.asarray(draw_region_weights(image, boxes, np.array([0.9, 0.1])), dtype=int)
    strong, weak = picture[60, 60], picture[250, 250]  # box interiors (the picture is scaled to 320 px)
    assert strong[0] == 255 and weak[0] == 255 and strong[1] < weak[1] < 255  # redder where the weight is larger
