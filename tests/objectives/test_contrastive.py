"""Image-text contrastive learning (the ``itc`` unit): ALBEF's ITC loss (salesforce/ALBEF@b9727e4
``models/model_pretrain.py``, alpha = 0 and no queue) on random features, the soft targets of captions of equal
content, two gloo processes at batch b against one at 2b (loss and gradients), the unit in the VL model (no joint
pass, two-stream refused) and a short VL pretraining run."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import vlbert
from vlbert.models.inputs import VLInputs
from vlbert.models.retrieval import contrastive_loss
from vlbert.objectives import OBJECTIVES
from vlbert.objectives.contrastive import TEMPERATURE, contrastive_rows


def albef_itc(image_feat: torch.Tensor, text_feat: torch.Tensor, temp: float) -> torch.Tensor:
    """ALBEF's ``loss_ita`` at alpha = 0 without the queue: the gathered features are the batch's own, and
    ``sim_targets`` is the identity (model_pretrain.py, written again from its equations)."""
    sim_i2t = image_feat @ text_feat.t() / temp
    sim_t2i = text_feat @ image_feat.t() / temp
    sim_targets = torch.eye(sim_i2t.shape[0], dtype=sim_i2t.dtype)
    loss_i2t = -torch.sum(F.log_softmax(sim_i2t, dim=1) * sim_targets, dim=1).mean()
    loss_t2i = -torch.sum(F.log_softmax(sim_t2i, dim=1) * sim_targets, dim=1).mean()
    return (loss_i2t + loss_t2i) / 2


def features(b: int, dim: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    text = F.normalize(torch.randn(b, dim, generator=g, dtype=torch.float64), dim=-1)
    image = F.normalize(torch.randn(b, dim, generator=g, dtype=torch.float64), dim=-1)
    return text, image


def test_the_loss_is_albefs_itc_with_distinct_contents():
    text, image = features(8)
    content = torch.arange(8)
    same = content[:, None] == content[None, :]
    loss, accuracy, chance = contrastive_rows(text, image, text, image, same, TEMPERATURE)
    assert abs(float(loss) - float(albef_itc(image, text, TEMPERATURE))) < 1e-6
    assert abs(float(chance) - 1 / 8) < 1e-12
    hits = (text @ image.T).argmax(1) == content  # text -> image, then image -> text
    hits = torch.cat([hits, (image @ text.T).argmax(1) == content])
    assert float(accuracy) == float(hits.double().mean())


def test_captions_of_equal_content_are_equally_weighted_positives():
    text, image = features(4, seed=1)
    content = torch.tensor([7, 3, 7, 5])  # rows 0 and 2 say the same thing
    same = content[:, None] == content[None, :]
    loss, _, chance = contrastive_rows(text, image, text, image, same, 0.1)
    target = torch.tensor([[0.5, 0, 0.5, 0], [0, 1, 0, 0], [0.5, 0, 0.5, 0], [0, 0, 0, 1]], dtype=torch.float64)
    by_hand = (
        -(target * F.log_softmax(text @ image.T / 0.1, 1)).sum(1).mean()
        - (target * F.log_softmax(image @ text.T / 0.1, 1)).sum(1).mean()
    ) / 2
    assert abs(float(loss) - float(by_hand)) < 1e-12
    assert abs(float(loss) - float(contrastive_loss(text @ image.T / 0.1, same))) < 1e-12  # retrieval's groups
    assert abs(float(chance) - (2 + 1 + 2 + 1) / 16) < 1e-12
    # the identity target (ALBEF's) would call row 2 a negative of row 0: a different loss
    assert abs(float(loss) - float(albef_itc(image, text, 0.1))) > 1e-3


def tiny_vl_model(**fields):
    torch.manual_seed(0)
    config = vlbert.VLBertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        region_feature_dim=12,
        num_region_classes=0,
        projection_dim=16,
        contrastive_head=True,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **fields,
    )
    return vlbert.VLBertForPreTraining(config)


def pairs(b: int, seed: int = 0) -> dict:
    """``b`` captions (ragged, [CLS] = 2 first, [SEP] = 3 last) and their images' regions (ragged)."""
    g = torch.Generator().manual_seed(seed)
    t, r = 7, 5
    ids = torch.randint(5, 60, (b, t), generator=g)
    lengths = torch.randint(3, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    ids = ids * mask
    ids[:, 0] = 2
    ids[torch.arange(b), lengths - 1] = 3
    region_mask = (torch.arange(r)[None, :] < torch.randint(1, r + 1, (b,), generator=g)[:, None]).long()
    xy = torch.rand(b, r, 2, generator=g) * 0.5
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": torch.zeros_like(ids),
        "region_features": torch.randn(b, r, 12, generator=g),
        "region_boxes": torch.cat([xy, xy + 0.4], -1),
        "region_mask": region_mask,
    }


def test_the_unit_embeds_each_modality_alone_and_skips_the_joint_pass(monkeypatch):
    model = tiny_vl_model()
    batch = pairs(4)
    content = torch.tensor([1, 2, 3, 1])
    passes = []
    forward = type(model.bert).forward

    def counting(self, inputs=None, /, **kw):
        passes.append(inputs if inputs is not None else kw)
        return forward(self, inputs, **kw)

    monkeypatch.setattr(type(model.bert), "forward", counting)
    out = model(**batch, itc_content=content)
    assert len(passes) == 2 and out.last_hidden_state is None  # text alone, [CLS] [SEP] + regions: no joint pass
    assert passes[0].region_features is None and passes[1].input_ids.tolist() == [[2, 3]] * 4
    assert set(out.losses) == {"itc"} and out.counts["itc"] == 4 and math.isfinite(out.loss.item())
    assert abs(float(out.metrics["itc_accuracy_chance"]) - (2 + 1 + 1 + 2) / 16) < 1e-6

    # the same loss from the retrieval model's embeddings under the same weights (its text_proj / image_proj)
    retrieval = vlbert.VLBertForImageTextRetrieval(model.config)
    retrieval.bert.load_state_dict(model.bert.state_dict())
    retrieval.text_proj.load_state_dict(model.itc.text_proj.state_dict())
    retrieval.image_proj.load_state_dict(model.itc.image_proj.state_dict())
    inputs = VLInputs(**batch)
    t = retrieval.embed_text(inputs.text_only())
    v = retrieval.embed_image(inputs.replace(input_ids=None, token_type_ids=None, attention_mask=None), cls_sep=(2, 3))
    same = content[:, None] == content[None, :]
    torch.testing.assert_close(out.loss, contrastive_loss(t @ v.T / TEMPERATURE, same), rtol=0, atol=1e-6)

    out.loss.backward()  # the heads of the units that did not run are declared idle, no other parameter is
    declared = {id(p) for p in out.unused_parameters}
    assert {n for n, p in model.named_parameters() if p.grad is None} == {
        n for n, p in model.named_parameters() if id(p) in declared
    }
    assert model.itc.temperature.grad is not None


def test_the_temperature_is_clamped_as_albef_and_two_stream_models_are_refused():
    model = tiny_vl_model()
    with torch.no_grad():
        model.itc.temperature.fill_(0.9)
    assert model.itc.clamped_temperature().item() == 0.5 and model.itc.temperature.item() == 0.5
    with torch.no_grad():
        model.itc.temperature.fill_(-1.0)
    assert model.itc.clamped_temperature().item() == pytest.approx(0.001)
    two_stream = vlbert.VLBertConfig(encoder="two-stream", hidden_size=32, num_attention_heads=2, contrastive_head=True)
    assert "single-stream" in OBJECTIVES["itc"].unsupported(two_stream)
    assert OBJECTIVES["itc"].unsupported(model.config) is None and OBJECTIVES["itc"].build_head(two_stream) is None


def perturbed_teacher(model, options, seed: int = 5):
    """A momentum teacher on ``model`` whose weights differ from the model's (as after some steps of the moving
    average), its queue's random start from ``seed``."""
    from vlbert.objectives.momentum import MomentumTeacher, attach

    teacher = MomentumTeacher(model, options, seed=seed)
    g = torch.Generator().manual_seed(seed)
    teacher.start_from([s + 0.05 * torch.randn(s.shape, generator=g, dtype=s.dtype) for s in teacher.shadow])
    attach(model, teacher)
    return teacher


class _Reducer:
    """The accelerate ``Accelerator`` surface :func:`~vlbert.training.distributed.global_batch_loss` reads."""

    def __init__(self, num_processes: int):
        self.num_processes = num_processes

    def reduce(self, t, reduction="sum"):
        import torch.distributed as dist

        t = t.clone()
        dist.all_reduce(t)
        return t


def _step(model, batch: dict, content: torch.Tensor, acc=None) -> tuple[float, dict]:
    """One training step's (global loss, averaged gradients) as the trainer computes them."""
    from vlbert.training.distributed import global_batch_loss

    out = model(**batch, itc_content=content)
    backward, global_loss = global_batch_loss(out, model.objectives, acc) if acc else (out.loss, out.loss)
    backward.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    if acc:
        import torch.distributed as dist

        for g in grads.values():
            dist.all_reduce(g)
            g /= acc.num_processes  # DDP's average
    return global_loss.item(), grads


def _ranks(rank: int, world: int, store: str, out: str, b: int, momentum: bool) -> None:
    import torch.distributed as dist

    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        model, teacher = _model(momentum)
        batch = {k: v[rank * b : (rank + 1) * b] for k, v in pairs(world * b).items()}
        content = CONTENT[rank * b : (rank + 1) * b]
        loss, grads = _step(model, batch, content, _Reducer(world))
        if rank == 0:
            torch.save({"loss": loss, "grads": grads, "queue": _queue(teacher)}, out)
    finally:
        dist.destroy_process_group()


def _model(momentum: bool):
    """The tiny model in train mode, with ALBEF's momentum teacher (queue of 8, alpha 0.4) where asked."""
    from vlbert.objectives.momentum import MomentumOptions

    model = tiny_vl_model().train()
    if not momentum:
        return model, None
    return model, perturbed_teacher(model, MomentumOptions(momentum=0.995, queue_size=8, alpha=0.4))


def _queue(teacher) -> tuple | None:
    return None if teacher is None else (teacher.text_queue, teacher.image_queue, teacher.content_queue)


#: the global batch's content ids: a caption of rank 0 (content 1) has an equal-content positive on rank 1
CONTENT = torch.tensor([1, 2, 3, 4, 1, 5])


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize(
    "world,momentum", [(2, False), (2, True), (3, True)], ids=["2-plain", "2-momentum-queue", "3-momentum-queue"]
)
def test_n_processes_at_b_train_as_one_at_n_times_b(tmp_path, world, momentum):
    """N gloo processes at batch b = 1 process at N x b: the loss, every gradient and (with ALBEF's momentum
    model, queue and soft targets) the queue after the step, which holds the global batch's momentum features."""
    from helpers.builders import like_a_worker
    from helpers.distributed import forked

    b = len(CONTENT) // world
    out = tmp_path / "rank0.pt"
    forked(_ranks, world, str(tmp_path / "store"), str(out), b, momentum, nproc=world)
    many = torch.load(out)
    with like_a_worker(float64=True):
        model, teacher = _model(momentum)
        loss, grads = _step(model, pairs(world * b), CONTENT)
    assert abs(many["loss"] - loss) < 1e-6
    assert set(many["grads"]) == set(grads) and "itc.temperature" in grads and any(".encoder." in n for n in grads)
    for name, g in grads.items():
        torch.testing.assert_close(many["grads"][name], g, rtol=0, atol=1e-6, msg=name)
    if momentum:
        for a, b_ in zip(many["queue"], _queue(teacher), strict=True):
            torch.testing.assert_close(a, b_, rtol=0, atol=1e-6)
        assert teacher.content_queue[: len(CONTENT)].tolist() == CONTENT.tolist()


def test_a_vl_pretraining_run_trains_itc(tmp_path):
    """A few steps of ITC and MLM on imported easy-VQA shards (no detector run in the test): ITC steps log a finite
    loss and itc_accuracy, and the end-of-run table reads its chance from the held-out batches."""
    from helpers.builders import write_easy_vqa_shards

    from vlbert.recipes import RECIPES, run

    out = tmp_path / "run"
    config = {
        "modality": "vl",
        "tokenizer": "minilm",
        "model": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64},
        "data": {
            "shards": str(write_easy_vqa_shards(tmp_path / "shards", 24)),
            "max_images": 24,
            "eval_fraction": 0.25,
            "objectives": {"itc": 2, "mlm": 1},
        },
        "training": {
            "output_dir": str(out),
            "max_steps": 4,
            "batch_size": 4,
            "learning_rate": 1e-3,
            "log_every": 1,
            "progress_bar": False,
        },
    }
    metrics = run(RECIPES["vl-pretraining"], config)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    itc = [r for r in log if r["split"] == "train" and "itc" in r]
    assert itc and all(math.isfinite(r["itc"]) and 0 <= r["itc_accuracy"] <= 1 for r in itc), itc
    assert math.isfinite(metrics["eval_itc_loss"]) and 0 < metrics["eval_itc_accuracy_chance"] < 1
    model = vlbert.VLBertForPreTraining.from_pretrained(out)
    assert model.loading_info.missing_keys == [] and model.config.projection_dim == 256


def test_the_collators_layouts_of_the_unimodal_passes_give_the_same_loss():
    from types import SimpleNamespace

    from vlbert.objectives.base import PrepareContext

    model = tiny_vl_model().eval()
    batch = pairs(4, seed=3)
    items = [{"content_id": c} for c in (1, 2, 3, 1)]
    laid_out = dict(batch)
    OBJECTIVES["itc"].prepare(laid_out, items, PrepareContext(text=SimpleNamespace(lays_out=True)))
    assert {"itc_text_layout", "itc_image_layout"} <= set(laid_out)
    plain = dict(batch)
    OBJECTIVES["itc"].prepare(plain, items, PrepareContext(text=SimpleNamespace(lays_out=False)))
    assert "itc_text_layout" not in plain
    torch.testing.assert_close(model(**laid_out).loss, model(**plain).loss, rtol=0, atol=1e-6)
