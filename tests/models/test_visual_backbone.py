"""The trainable region pathway (vlbert/models/visual_backbone.py): gradients reach the backbone's unfrozen stages
only, frozen BatchNorms keep their statistics, masked regions' pixels are hidden before the CNN (VL-BERT's
``MASK_RAW_PIXELS``), activation checkpointing changes no gradient, the backbone trains in its own parameter group,
and bad configs are refused."""

from __future__ import annotations

import pytest
import torch

from vlbert.config import VLBertConfig
from vlbert.models.visual_backbone import RegionFeatureExtractor, mask_pixels
from vlbert.models.vqa import VLBertForVQA
from vlbert.training.training_config import parameter_groups

TORCHVISION = {"kind": "torchvision-resnet", "depth": 18, "roi_size": 4}
TIMM = {"kind": "timm", "model": "mobilenetv3_small_050", "roi_size": 2}


def batch(seed=0):
    """Two 64x64 images (the second's real content 48x64, padded), boxes normalised by each image's size."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(2, 3, 64, 64, generator=g)
    boxes = torch.tensor(
        [
            [[0.0, 0.0, 1.0, 1.0], [0.1, 0.2, 0.5, 0.6], [0.5, 0.5, 0.9, 0.95]],
            [[0.0, 0.0, 1.0, 1.0], [0.3, 0.1, 0.8, 0.7], [0.0, 0.0, 0.0, 0.0]],
        ]
    )
    return images, boxes, torch.tensor([[1, 1, 1], [1, 1, 0]]), torch.tensor([[64, 64], [48, 64]])


@pytest.fixture(scope="module", params=[TORCHVISION, TIMM], ids=["torchvision", "timm"])
def extractor(request):
    torch.manual_seed(0)
    model = RegionFeatureExtractor(request.param)
    with torch.no_grad():  # as trained weights: timm zero-initialises each residual branch's last BatchNorm
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
    return model


def test_gradients_reach_the_unfrozen_stages_only_and_frozen_batchnorm_keeps_its_statistics(extractor):
    images, boxes, mask, sizes = batch()
    stats = {n: b.clone() for n, b in extractor.named_buffers()}
    extractor.train()
    extractor.zero_grad()
    features = extractor(images, boxes, mask, sizes)
    assert features.shape == (2, 3, extractor.feature_dim) and not features[1, 2].any()  # padding: no RoI
    features.square().sum().backward()
    stages = extractor._stage_params
    for stage, params in enumerate(stages, 1):
        with_grad = [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params if p.dim() > 1]
        assert with_grad and all(with_grad) == (stage > 2) and any(with_grad) == (stage > 2), stage
    batchnorms = [m for m in extractor.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert batchnorms and all(not m.training and not m.weight.requires_grad for m in batchnorms)
    for name, buffer in extractor.named_buffers():
        torch.testing.assert_close(buffer, stats[name], rtol=0, atol=0)


def test_a_masked_region_is_hidden_from_its_own_feature(extractor):
    """Pixel masking: changing the pixels inside region 1's box changes its feature only when it is not masked."""
    extractor.eval()
    images, boxes, mask, sizes = batch()
    changed = images.clone()
    changed[0, :, 14:37, 8:30] += 3.0  # inside region 1 of image 0 (x 0.1-0.5, y 0.2-0.6 of 64 pixels)
    masked = torch.zeros(2, 3, dtype=torch.bool)
    masked[0, 1] = True
    with torch.no_grad():
        for hide, expect_same in ((masked, True), (None, False)):
            a = extractor(images, boxes, mask, sizes, masked_regions=hide)[0, 1]
            b = extractor(changed, boxes, mask, sizes, masked_regions=hide)[0, 1]
            assert torch.equal(a, b) == expect_same


def test_pixel_masking_zeroes_the_pixels_vl_bert_zeroes():
    """VL-BERT's dataset (pretrain/data/datasets/conceptual_captions.py at 4373674): image[:, int(y1):int(y2) + 1,
    int(x1):int(x2) + 1] = 0 for each masked box, after normalisation."""
    images = torch.randn(2, 3, 20, 30)
    boxes = torch.tensor([[[2.7, 3.2, 10.9, 8.0], [0.0, 0.0, 29.0, 19.0]], [[15.5, 1.0, 29.0, 19.0], [1, 1, 2, 2]]])
    masked = torch.tensor([[True, False], [True, True]])
    expected = images.clone()
    for i in range(2):
        for box, hide in zip(boxes[i], masked[i], strict=True):
            if hide:
                x1, y1, x2, y2 = (int(v) for v in box)
                expected[i, :, y1 : y2 + 1, x1 : x2 + 1] = 0
    torch.testing.assert_close(mask_pixels(images, boxes, masked), expected, rtol=0, atol=0)


def test_activation_checkpointing_gives_the_same_gradients(extractor):
    images, boxes, mask, sizes = batch()
    grads = []
    extractor.train()
    for checkpointing in (False, True):
        extractor.options["checkpointing"] = checkpointing
        extractor.zero_grad()
        extractor(images, boxes, mask, sizes).sum().backward()
        grads.append([p.grad.clone() for p in extractor.parameters() if p.grad is not None])
    extractor.options["checkpointing"] = False
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_the_backbone_trains_in_its_own_parameter_group_and_the_model_runs_on_images(tmp_path):
    config = VLBertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=24,
        region_feature_dim=512,
        num_labels=3,
        visual_backbone={**TORCHVISION, "learning_rate": 1e-5},
    )
    model = VLBertForVQA(config)
    groups = parameter_groups(model, 0.01)
    backbone = {id(p) for p in model.bert.visual_backbone.parameters() if p.requires_grad}
    own = [g for g in groups if g.get("lr") == 1e-5]
    assert {id(p) for g in own for p in g["params"]} == backbone
    assert all("lr" not in g and not backbone & {id(p) for p in g["params"]} for g in groups if g not in own)
    images, boxes, mask, sizes = batch()
    ids = torch.tensor([[2, 7, 8, 3], [2, 9, 3, 0]])
    out = model(
        ids,
        attention_mask=(ids > 0).long(),
        region_boxes=boxes,
        region_mask=mask,
        images=images,
        image_sizes=sizes,
        answer_targets=torch.tensor([[1.0, 0, 0], [0, 0, 1.0]]),
    )
    out.loss.backward()
    assert model.bert.visual_backbone.body.layer3[0].conv1.weight.grad.abs().sum() > 0
    model.save_pretrained(tmp_path / "m")  # the backbone travels in the model directory, its config in config.json
    loaded = VLBertForVQA.from_pretrained(tmp_path / "m").eval()
    assert not loaded.loading_info.missing_keys and loaded.config.visual_backbone == config.visual_backbone
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(
                ids,
                attention_mask=(ids > 0).long(),
                region_boxes=boxes,
                region_mask=mask,
                images=images,
                image_sizes=sizes,
            ).logits,
            model.eval()(
                ids,
                attention_mask=(ids > 0).long(),
                region_boxes=boxes,
                region_mask=mask,
                images=images,
                image_sizes=sizes,
            ).logits,
        )


def test_bad_visual_backbone_configs_are_refused():
    base = dict(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24)
    for options, message in (
        ({"kind": "resnet"}, "kind must be one of"),
        ({"lr": 1e-5}, r"unknown config.visual_backbone key\(s\) \['lr'\]"),
        ({**TORCHVISION, "frozen_stages": [7]}, "is not a stage"),
    ):
        with pytest.raises(ValueError, match=message):
            RegionFeatureExtractor(options)
    with pytest.raises(ValueError, match="gives 512-d region features but config.region_feature_dim is 2048"):
        VLBertForVQA(VLBertConfig(**base, region_feature_dim=2048, visual_backbone=TORCHVISION))
    model = VLBertForVQA(VLBertConfig(**base, region_feature_dim=8))
    images, boxes, mask, sizes = batch()
    with pytest.raises(ValueError, match="config.visual_backbone is None"):
        model(torch.tensor([[2, 3]] * 2), images=images, region_boxes=boxes)
