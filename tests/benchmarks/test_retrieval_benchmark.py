"""``python -m benchmarks retrieval``: one run prints the shortlist and the full re-rank of each gallery size, and,
for a cross-encoder that agrees with the contrastive order on the negatives (the case constructed so that the
shortlist can only lose a positive it does not hold), the recalls of the queries whose shortlist holds the positive
are the full re-rank's."""

from __future__ import annotations

import json

import torch
from torch import nn

from benchmarks import retrieval
from vlbert.processing import VLProcessor


def test_one_run_prints_both_methods_for_each_size(capsys):
    assert retrieval.main(["--images", "12", "30", "--shortlist", "3", "--hidden", "16", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["images"], r["method"]) for r in rows] == [
        (12, "shortlist"),
        (12, "full"),
        (30, "shortlist"),
        (30, "full"),
    ]
    for short, full in (rows[:2], rows[2:]):
        n = short["images"]
        assert full["cross_encoder_pairs"] == n * n and 3 * n <= short["cross_encoder_pairs"] <= 2 * 3 * n
        assert full["embed_seconds"] == 0 and short["embed_seconds"] > 0
        assert short["i2t_held"] == full["i2t_held"] and {"i2t_r10", "t2i_r5", "r_mean"} <= set(short)


class OwnCaptionBonus(nn.Module):
    """A cross-encoder that scores a pair by the model's own contrastive similarity, plus ``bonus`` where the
    caption is the image's own: it never ranks a negative above one the contrastive stage ranked higher."""

    def __init__(self, model, caption_image: dict, feature_image: dict, cls_sep, bonus: float):
        super().__init__()
        self.model, self.caption_image, self.feature_image = model, caption_image, feature_image
        self.cls_sep, self.bonus, self.config = cls_sep, bonus, model.config

    def embed_text(self, **text):
        return self.model.embed_text(**text)

    def embed_image(self, **regions):
        return self.model.embed_image(**regions)

    def match_scores(self, input_ids, token_type_ids, attention_mask, region_features, region_boxes, region_mask):
        text = self.embed_text(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        image = self.embed_image(
            region_features=region_features, region_boxes=region_boxes, region_mask=region_mask, cls_sep=self.cls_sep
        )
        captions = [
            self.caption_image[tuple(row[m.bool()].tolist())] for row, m in zip(input_ids, attention_mask, strict=True)
        ]
        images = [self.feature_image[float(f[0, 0])] for f in region_features]
        own = torch.tensor([c == i for c, i in zip(captions, images, strict=True)], dtype=torch.float32)
        return (text * image).sum(-1) + self.bonus * own


def test_where_the_shortlist_holds_the_positive_its_recalls_are_the_full_re_ranks(tokenizer):
    n, k = 40, 8
    images, regions = retrieval.synthetic_gallery(n, 1, 4, 4, 16, tokenizer, seed=1)
    processor = VLProcessor(tokenizer, max_regions=4, max_text_length=18)
    ids = processor.text_ids([im.captions[0] for im in images])
    caption_image = {tuple(x): i for i, x in enumerate(ids)}
    feature_image = {float(torch.tensor(regions[im.image_id].features[0, 0]).half()): i for i, im in enumerate(images)}
    model = retrieval.build_model(tokenizer, 16, 1, 16)
    oracle = OwnCaptionBonus(
        model, caption_image, feature_image, (tokenizer.cls_token_id, tokenizer.sep_token_id), 0.05
    )
    short, full = retrieval.compare(oracle, images, regions, processor, k, batch_size=64)
    for d in ("i2t", "t2i"):
        assert 0 < short[f"{d}_held"] < 1  # some queries lose their positive to the shortlist, some keep it
        assert 0 < short[f"{d}_r1_held"] < 1  # and the positive it holds is not always first
        for kk in (1, 5, 10):
            assert short[f"{d}_r{kk}_held"] == full[f"{d}_r{kk}_held"]
        assert short[f"{d}_r5"] <= short[f"{d}_held"] and full[f"{d}_r1"] >= short[f"{d}_r1"]
    assert full["t2i_r1"] > short["t2i_r1"]  # a positive outside the shortlist that the full re-rank finds first
