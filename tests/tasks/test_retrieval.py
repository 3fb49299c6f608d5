"""Retrieval: Karpathy-split reader, the ITC+ITM training losses, and the shortlist evaluation (which must
score only (#images + #captions) x shortlist pairs with the cross-encoder, and agree with scoring all pairs when
the shortlist covers everything)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from vlbert.detectors.regions import Regions

import vlbert
from vlbert.data.captions import CaptionedImage, load_karpathy_split
from vlbert.data.retrieval import RetrievalPairs
from vlbert.evaluation.retrieval import evaluate_retrieval
from vlbert.models.retrieval import VLBertForImageTextRetrieval
from vlbert.processing import VLProcessor
from vlbert.processing.collator import RetrievalCollator


def test_karpathy_reader(tmp_path):
    data = {
        "images": [
            {"filename": "a.jpg", "cocoid": 1, "split": "train", "sentences": [{"raw": "A dog."}, {"raw": "A puppy."}]},
            {"filename": "b.jpg", "cocoid": 2, "split": "restval", "sentences": [{"raw": "A cat."}]},
            {"filename": "c.jpg", "cocoid": 3, "split": "test", "sentences": [{"raw": "A bus."}]},
        ]
    }
    (tmp_path / "d.json").write_text(json.dumps(data))
    train = load_karpathy_split(tmp_path / "d.json", "train", "{cocoid}")
    assert [(x.image_id, x.captions) for x in train] == [("1", ("A dog.", "A puppy.")), ("2", ("A cat.",))]
    assert load_karpathy_split(tmp_path / "d.json", "test")[0].image_id == "c.jpg"
    with pytest.raises(ValueError, match="no images in split"):
        load_karpathy_split(tmp_path / "d.json", "val")


COLOURS = ["red", "blue", "yellow", "green", "teal", "black"]
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "region_feature_dim": 12,
    "num_region_classes": 0,
}


@pytest.fixture()
def setup(tokenizer):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    regions = {
        f"img{i}": Regions(
            f"img{i}", 32, 32, [[0, 0, 32, 32], [4, 4, 20, 20]], rng.standard_normal((2, 12)), [1.0, 0.5]
        )
        for i in range(6)
    }
    images = [
        CaptionedImage(f"img{i}", (f"a {c} thing", f"the {c} object"), group=c)
        for i, c in enumerate(["red", "blue", "red", "green", "teal", "black"])
    ]
    config = vlbert.VLBertConfig(vocab_size=len(tokenizer), **TINY)
    return VLBertForImageTextRetrieval(config).eval(), images, regions


def test_training_losses(setup, tokenizer):
    model, images, regions = setup
    pairs = RetrievalPairs(images, regions, VLProcessor(tokenizer))
    batch = RetrievalCollator(tokenizer)([pairs[i] for i in range(len(pairs))])
    assert batch["group_ids"].tolist()[:4] == [batch["group_ids"][0]] * 2 + [batch["group_ids"][2]] * 2
    out = model.train()(**batch)
    assert set(out.losses) == {"itc", "itm"} and out.counts["itm"] == 3 * len(pairs)
    out.loss.backward()
    assert model.text_proj.weight.grad.abs().sum() > 0 and model.itm.weight.grad.abs().sum() > 0


def test_shortlist_matches_full_scoring(setup, tokenizer):
    model, images, regions = setup
    full, i2t, t2i = evaluate_retrieval(
        model, images, regions, VLProcessor(tokenizer, max_text_length=32), shortlist=100, ks=(1, 5), return_scores=True
    )
    assert full["cross_encoder_pairs"] == full["all_pairs"]  # shortlist covers everything: each pair scored once
    # Brute force: cross-encoder on every pair.
    from vlbert.data.pretraining import MaskingCollator
    from vlbert.processing.regions import pad_regions

    caps = [(k, c) for k, im in enumerate(images) for c in im.captions]
    text = MaskingCollator.from_tokenizer(tokenizer)
    ids = tokenizer([c for _, c in caps])["input_ids"]
    scores = torch.zeros(len(images), len(caps))
    with torch.no_grad():
        for i, im in enumerate(images):
            r = regions[im.image_id]
            batch = text.pad([{"input_ids": x} for x in ids])
            batch.update(
                pad_regions([{"region_features": r.features, "region_boxes": r.normalised_boxes()}] * len(ids))
            )
            scores[i] = model.match_scores(**batch)
    torch.testing.assert_close(i2t, scores, atol=1e-5, rtol=0)
    torch.testing.assert_close(t2i, scores.T, atol=1e-5, rtol=0)
    processor = VLProcessor(tokenizer, max_text_length=32)
    assert evaluate_retrieval(model, images, regions, processor, shortlist=0, ks=(1, 5)) == full  # 0: every pair
    small, i2t, t2i = evaluate_retrieval(model, images, regions, processor, shortlist=3, return_scores=True)
    # the distinct pairs of both directions' shortlists, each scored once: those the final scores took from `scores`
    listed = torch.isclose(i2t, scores, atol=1e-5, rtol=0) | torch.isclose(t2i.T, scores, atol=1e-5, rtol=0)
    assert small["cross_encoder_pairs"] == int(listed.sum()) < (len(images) + len(caps)) * 3


def test_retrieval_model_round_trip(setup, tmp_path):
    model, _, _ = setup
    model.save_pretrained(tmp_path)
    again = VLBertForImageTextRetrieval.from_pretrained(tmp_path)
    assert again.loading_info.missing_keys == [] and again.loading_info.unexpected_keys == []
    assert torch.equal(again.log_temperature, model.log_temperature)


def test_hard_negative_texts_follow_each_images_softmax_over_texts():
    """ALBEF's weights_i2t: image 0's negative text is drawn from image 0's softmax over the texts (text 1 here),
    not from each text's softmax over the images (which would favour text 2)."""
    from vlbert.models.retrieval import hard_negatives

    logits = torch.tensor(
        [
            [0.0, 0.0, 0.0],  # text 0 (image 0's own)
            [10.0, 20.0, 0.0],  # text 1: very similar to image 0, more to image 1
            [0.0, -5.0, -5.0],
        ]
    )  # text 2: weakly similar to image 0, to nothing else
    same = torch.eye(3, dtype=torch.bool)
    g = torch.Generator().manual_seed(0)
    picks = [int(hard_negatives(logits, same, g)[0][0]) for _ in range(200)]
    assert picks.count(1) >= 195
    images = [int(hard_negatives(logits, same, g)[1][2]) for _ in range(200)]  # text 2's row favours image 0
    assert images.count(0) >= 195


def test_positive_pairs_with_and_without_groups():
    """Images 0 and 2 share group "red circle", image 1 has none: hand-worked positives (vectorised; they were
    Python loops over images x captions, 125 million iterations on COCO's 5k test split)."""
    from vlbert.evaluation.retrieval import positive_pairs

    own, group = positive_pairs(["red circle", "", "red circle"], [0, 0, 1, 2, 2, 2])
    assert own.tolist() == [[1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]]
    assert group.tolist() == [[1, 1, 0, 1, 1, 1], [0, 0, 1, 0, 0, 0], [1, 1, 0, 1, 1, 1]]


def test_recalls_and_r_mean_against_uniters_itm_eval(easy, doc_runs, tmp_path, monkeypatch):
    """The retrieval recipe's logged recalls and r_mean against UNITER's own itm_eval (ChenRocks/UNITER@1dbfa62
    ``utils/itm_eval.py``, vendored in tests/official/) on the final score matrices of the recipe's own evaluation
    (kept as it computes them), 12 test images x 2 captions, shortlist 4 (ranks 5-10 in contrastive order).

    UNITER's txt_r{K} (image -> text) equals i2t_r{K} exactly. Its img_r{K} counts ``(rank < K).sum()`` over
    ``nonzero()``'s (row, column) pairs, so a text row index below K whose image is in its top 10 counts as a
    hit too: img_r{K} is t2i_r{K} plus that count / #texts (at most K / #texts: 0.2 points of img_r10 on Flickr30K's
    5,000 test captions). vlbert reports the recall without it; the test checks that this is the only difference."""
    from dataclasses import asdict

    from helpers.builders import EASY_DETECTOR
    from official.uniter_itm_eval import itm_eval

    import vlbert.recipes.retrieval as recipe
    from vlbert.recipes import RECIPES, run

    kept = {}

    def keeping_scores(*args, **kwargs):
        out, kept["i2t"], kept["t2i"] = evaluate_retrieval(*args, **kwargs, return_scores=True)
        return out

    monkeypatch.setattr(recipe, "evaluate_retrieval", keeping_scores)
    images = [
        {
            "filename": k,
            "split": "test",
            "sentences": [{"raw": f"image {k}: a {c} {s}"}, {"raw": f"picture {k} shows a {s} colored {c}"}],
        }
        for k, (c, s) in easy.truth.items()
    ]
    images += [{**images[k], "split": "train"} for k in (0, 1)]
    (tmp_path / "captions.json").write_text(json.dumps({"images": images}))
    metrics = run(
        RECIPES["retrieval"],
        {
            "init_from": str(doc_runs["vl-default"]),
            "detector": asdict(EASY_DETECTOR),
            "data": {
                "dataset": "karpathy",
                "captions_file": str(tmp_path / "captions.json"),
                "shards": str(easy.shards),
                "shortlist": 4,
            },
            "training": {
                "output_dir": str(tmp_path / "run"),
                "max_steps": 1,
                "batch_size": 4,
                "warmup_steps": 1,
                "progress_bar": False,
            },
        },
    )

    test = load_karpathy_split(tmp_path / "captions.json", "test")
    captions = [(k, c) for k, im in enumerate(test) for c in im.captions]
    txt_ids, img_ids = list(range(len(captions))), list(range(len(test)))
    txt2img = {t: k for t, (k, _) in enumerate(captions)}
    img2txts = {k: [t for t in txt_ids if txt2img[t] == k] for k in img_ids}
    texts = itm_eval(kept["i2t"].T.contiguous(), txt_ids, img_ids, txt2img, img2txts)  # UNITER's [txt, img] layout
    images_ = itm_eval(kept["t2i"], txt_ids, img_ids, txt2img, img2txts)
    gold = torch.tensor([txt2img[t] for t in txt_ids])
    in_top10 = (kept["t2i"].topk(10, dim=1).indices == gold[:, None]).any(1)  # the rows of UNITER's image `rank`
    for k in (1, 5, 10):
        assert metrics[f"i2t_r{k}"] == texts[f"txt_r{k}"]
        assert metrics[f"t2i_r{k}"] == pytest.approx(
            images_[f"img_r{k}"] - int(in_top10[:k].sum()) / len(txt_ids), abs=1e-12
        )
    extra = sum(int(in_top10[:k].sum()) for k in (1, 5, 10)) / len(txt_ids) / 6
    assert metrics["r_mean"] == pytest.approx((texts["txt_r_mean"] + images_["img_r_mean"]) / 2 - extra, abs=1e-12)


def test_rerank_keeps_the_contrastive_order_outside_the_shortlist():
    """Candidates outside the shortlist rank below it in contrastive order, even when their contrastive scores
    differ by less than float32 can tell apart at 1e4 (0886c57 subtracted 1e4 from them: 0.0301, 0.0302 and
    0.0303 became ties, and Recall@K beyond the shortlist depended on how a sort breaks ties)."""
    from vlbert.evaluation.retrieval import rerank_shortlist

    scores = torch.tensor([[0.5, 0.0301, 0.0302, 0.0303, 0.9]])
    final, pairs = rerank_shortlist(
        scores, 2, lambda q, n: (q, n), lambda images, captions: torch.full((len(images),), -50.0)
    )
    assert pairs == 2 and final[0, [0, 4]].tolist() == [-50.0, -50.0]
    assert final[0].argsort(descending=True).tolist()[2:] == [3, 2, 1] and final[0, 3] < -50


def _evaluate_as_rank(rank: int, store: str, out: str, model, images, regions, processor) -> None:
    """One of two gloo processes: the evaluation with its share of the embeddings and cross-encoder pairs, counting
    the pairs this rank's cross-encoder scored."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        scored = []
        match_scores = model.match_scores
        model.match_scores = lambda **batch: scored.append(len(batch["input_ids"])) or match_scores(**batch)
        metrics, i2t, t2i = evaluate_retrieval(
            model, images, regions, processor, shortlist=3, batch_size=5, return_scores=True
        )
        torch.save({"metrics": metrics, "i2t": i2t, "t2i": t2i, "scored": sum(scored)}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
def test_two_processes_evaluate_as_one(setup, tokenizer, tmp_path):
    """Two gloo processes, each embedding its half of the images and captions and scoring its half of the
    shortlisted pairs: both return the figures and final scores of one process, and the pairs were split."""
    from helpers.distributed import forked

    _, _, regions = setup
    # distinct captions and weights drawn wide: no two candidates tie, so float rounding cannot reorder them
    images = [CaptionedImage(f"img{i}", (f"a {c} thing {i}", f"the {c} object")) for i, c in enumerate(COLOURS)]
    torch.manual_seed(0)
    model = VLBertForImageTextRetrieval(vlbert.VLBertConfig(**TINY, vocab_size=len(tokenizer), initializer_range=0.3))
    processor = VLProcessor(tokenizer, max_text_length=32)
    one, i2t, t2i = evaluate_retrieval(model, images, regions, processor, shortlist=3, return_scores=True)
    forked(_evaluate_as_rank, str(tmp_path / "store"), str(tmp_path / "out"), model, images, regions, processor)
    ranks = [torch.load(tmp_path / f"out.{r}") for r in (0, 1)]
    for rank in ranks:
        assert rank["metrics"] == one
        torch.testing.assert_close(rank["i2t"], i2t, atol=1e-5, rtol=0)
        torch.testing.assert_close(rank["t2i"], t2i, atol=1e-5, rtol=0)
    pairs = one["cross_encoder_pairs"]
    assert sorted(r["scored"] for r in ranks) == [pairs // 2, pairs - pairs // 2]


def test_a_model_pretrained_with_itc_shortlists_by_its_itc_similarity(setup, tokenizer, tmp_path):
    """A VL-pretrained checkpoint's ``itc`` head (text_proj, image_proj, temperature) loads into the retrieval
    model's shortlist: nothing missing, the projections equal, the temperature its log, and the evaluation's
    image x caption similarity (and so its shortlist) is the ITC unit's own on the same captions and images."""
    from vlbert.evaluation.retrieval import RetrievalCandidates, embed_candidates, shortlist_indices
    from vlbert.models.inputs import VLInputs
    from vlbert.objectives import OBJECTIVES
    from vlbert.processing.padding import pad_text
    from vlbert.processing.regions import pad_regions

    _, _, regions = setup
    images = [CaptionedImage(f"img{i}", (f"a {c} thing {i}", f"the {c} object")) for i, c in enumerate(COLOURS)]
    torch.manual_seed(0)
    config = vlbert.VLBertConfig(
        **TINY, vocab_size=len(tokenizer), initializer_range=0.3, projection_dim=16, contrastive_head=True
    )
    pretrained = vlbert.VLBertForPreTraining(config).eval()
    with torch.no_grad():
        pretrained.itc.temperature.fill_(0.05)
    pretrained.save_pretrained(tmp_path)
    model = VLBertForImageTextRetrieval.from_pretrained(tmp_path).eval()
    assert model.loading_info.missing_keys == []
    assert torch.equal(model.text_proj.weight, pretrained.itc.text_proj.weight)
    assert torch.equal(model.image_proj.bias, pretrained.itc.image_proj.bias)
    assert abs(float(model.log_temperature.detach().exp()) - 0.05) < 1e-6

    processor = VLProcessor(tokenizer, max_text_length=32)
    ids = processor.text_ids([c for im in images for c in im.captions])
    items = [processor.region_item(regions[im.image_id]) for im in images]
    with torch.no_grad():
        image_emb, text_emb = embed_candidates(model, RetrievalCandidates.build(ids, items, tokenizer), batch_size=4)
        # the ITC unit on the pairs (caption c, its image): text rows for every caption, image rows once per image
        batch = pad_text([{"input_ids": x} for x in ids], tokenizer.pad_token_id)
        batch.update(pad_regions([items[c // 2] for c in range(len(ids))]))
        text, image = OBJECTIVES["itc"].embed(pretrained, VLInputs(**batch), {})
    similarity, itc = image_emb @ text_emb.T, image[::2] @ text.T
    torch.testing.assert_close(similarity, itc, atol=1e-5, rtol=0)
    assert torch.equal(shortlist_indices(similarity, 3), shortlist_indices(itc, 3))
    assert torch.equal(shortlist_indices(similarity.T, 3), shortlist_indices(itc.T, 3))
