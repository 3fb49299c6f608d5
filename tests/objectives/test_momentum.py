"""ALBEF's momentum distillation (salesforce/ALBEF@b9727e4 ``models/model_pretrain.py``, ``models/xbert.py``,
``Pretrain.py``): the ITC loss with the queue and soft targets and the MLM loss with soft labels equal reference
forwards written here from ALBEF's equations, the queue is written as ALBEF's ``_dequeue_and_enqueue``, the momentum
update is ALBEF's ``_momentum_update``, alpha ramps as ``Pretrain.py``; 2 and 3 gloo processes at batch b give the
loss, gradients and queue of 1 process at the combined batch; a VL run stopped and resumed equals the uninterrupted
run."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from objectives.test_contrastive import pairs, perturbed_teacher, tiny_vl_model

from vlbert.models.inputs import VLInputs
from vlbert.objectives import OBJECTIVES
from vlbert.objectives.momentum import MomentumOptions, MomentumTeacher, attach


def albef_ita(image_feat, text_feat, image_feat_m, text_feat_m, image_queue, text_queue, temp, alpha):
    """ALBEF's ``loss_ita`` (model_pretrain.py, ``forward``), its queues [embed_dim, queue_size] as there."""
    image_feat_all = torch.cat([image_feat_m.t(), image_queue.clone().detach()], dim=1)
    text_feat_all = torch.cat([text_feat_m.t(), text_queue.clone().detach()], dim=1)
    sim_i2t_m = image_feat_m @ text_feat_all / temp
    sim_t2i_m = text_feat_m @ image_feat_all / temp
    sim_targets = torch.zeros(sim_i2t_m.size())
    sim_targets.fill_diagonal_(1)
    sim_i2t_targets = alpha * F.softmax(sim_i2t_m, dim=1) + (1 - alpha) * sim_targets
    sim_t2i_targets = alpha * F.softmax(sim_t2i_m, dim=1) + (1 - alpha) * sim_targets
    sim_i2t = image_feat @ text_feat_all / temp
    sim_t2i = text_feat @ image_feat_all / temp
    loss_i2t = -torch.sum(F.log_softmax(sim_i2t, dim=1) * sim_i2t_targets, dim=1).mean()
    loss_t2i = -torch.sum(F.log_softmax(sim_t2i, dim=1) * sim_t2i_targets, dim=1).mean()
    return (loss_i2t + loss_t2i) / 2


def albef_mlm(prediction_scores, logits_m, labels, alpha):
    """ALBEF's ``BertForMaskedLM`` loss with ``soft_labels = F.softmax(logits_m)`` (xbert.py, ``forward``)."""
    soft_labels = F.softmax(logits_m, dim=-1)
    masked_lm_loss = F.cross_entropy(prediction_scores.view(-1, prediction_scores.shape[-1]), labels.view(-1))
    loss_distill = -torch.sum(F.log_softmax(prediction_scores, dim=-1) * soft_labels, dim=-1)
    loss_distill = loss_distill[labels != -100].mean()
    return (1 - alpha) * masked_lm_loss + alpha * loss_distill


def test_itc_with_queue_and_soft_targets_is_albefs_loss_ita_and_enqueues_as_albef():
    model = tiny_vl_model()
    teacher = perturbed_teacher(model, MomentumOptions(momentum=0.995, queue_size=12, alpha=0.4))
    model.train()
    batch, content = pairs(4), torch.tensor([11, 12, 13, 14])
    queue_text, queue_image = teacher.text_queue.clone(), teacher.image_queue.clone()
    itc = OBJECTIVES["itc"]
    with torch.no_grad():
        text, image = itc.embed(model, VLInputs(**batch), {})
        text_m, image_m = itc.embed(teacher.module, VLInputs(**batch), {})
    out = model(**batch, itc_content=content)
    expected = albef_ita(image, text, image_m, text_m, queue_image.t(), queue_text.t(), 0.07, 0.4)
    assert abs(float(out.loss) - float(expected)) < 1e-6
    # the momentum features took the queue's first 4 rows (ALBEF: queue[:, ptr:ptr + bs] = feats.T), the rest kept
    torch.testing.assert_close(teacher.text_queue[:4], text_m, rtol=0, atol=0)
    torch.testing.assert_close(teacher.image_queue[4:], queue_image[4:], rtol=0, atol=0)
    assert teacher.content_queue[:4].tolist() == content.tolist() and teacher.pointer == 4
    # 4 more batches: the pointer wraps (12 rows), the next write starting at row 0 again
    for _ in range(2):
        model(**batch, itc_content=content)
    assert teacher.pointer == 0 and (teacher.content_queue >= 0).all()
    # alpha 0 and no queue: the momentum model's batch columns only, identity targets (ALBEF at alpha = 0)
    teacher = perturbed_teacher(model, MomentumOptions(momentum=0.5))
    loss = model(**batch, itc_content=content).loss
    with torch.no_grad():
        text_m, image_m = itc.embed(teacher.module, VLInputs(**batch), {})
    empty = torch.zeros(16, 0)
    assert abs(float(loss) - float(albef_ita(image, text, image_m, text_m, empty, empty, 0.07, 0.0))) < 1e-6


def test_a_queued_caption_of_equal_content_is_a_positive_not_a_negative():
    model = tiny_vl_model()
    perturbed_teacher(model, MomentumOptions(momentum=0.9, queue_size=8))
    model.train()
    batch, content = pairs(4), torch.tensor([1, 2, 3, 4])
    model(**batch, itc_content=content)  # the queue now holds these contents at rows 0-3
    again = model(**batch, itc_content=content)
    assert abs(float(again.metrics["itc_accuracy_chance"]) - 2 / 12) < 1e-6  # each row: itself and its queued twin


def test_mlm_with_soft_labels_is_albefs_distilled_masked_lm_loss():
    model = tiny_vl_model()
    perturbed_teacher(model, MomentumOptions(momentum=0.995, mlm_alpha=0.4))
    teacher = model.momentum_teacher
    model.train()
    batch = pairs(4, seed=2)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 1] = batch["input_ids"][:, 1]
    labels[0, 2] = batch["input_ids"][0, 2]
    out = model(**batch, labels=labels)

    def scores(m):
        inputs = VLInputs(**batch)
        hidden = m.bert(inputs).last_hidden_state[:, : batch["input_ids"].shape[1]]
        return m.masked_lm(hidden, m.bert.embeddings.word_embeddings.weight)

    with torch.no_grad():
        expected = albef_mlm(scores(model), scores(teacher.module), labels, 0.4)
    assert abs(float(out.loss) - float(expected)) < 1e-6
    attach(model, None)
    plain = model(**batch, labels=labels).loss
    assert abs(float(plain) - float(albef_mlm(scores(model), scores(model), labels, 0.0))) < 1e-6
    assert abs(float(plain) - float(out.loss)) > 1e-4


def test_the_momentum_update_is_albefs_and_alpha_ramps_as_its_first_epoch():
    model = tiny_vl_model()
    teacher = MomentumTeacher(model, MomentumOptions(momentum=0.9, alpha=0.4, mlm_alpha=0.2, alpha_ramp_steps=10))
    by_name = dict(model.named_parameters())
    weights = [by_name[n].detach() for n in teacher.names]
    teacher.start_from(weights)
    before = [p.detach().clone() for p in teacher.module.parameters()]
    moved = [w + 1.0 for w in weights]
    teacher.update(moved)
    for p_m, m0, w in zip(teacher.module.parameters(), before, moved, strict=True):  # param_m * m + param * (1 - m)
        torch.testing.assert_close(p_m, m0 * 0.9 + w * (1.0 - 0.9), rtol=0, atol=1e-6)
    assert all(not p.requires_grad for p in teacher.module.parameters())
    assert set(n.split(".")[0] for n in teacher.names) == {"bert", "itc", "masked_lm"}
    ramp = []
    for step in (0, 5, 10, 20):
        teacher.step = step
        ramp.append((teacher.alpha("itc"), teacher.alpha("mlm")))
    assert ramp == [(0.0, 0.0), (0.2, 0.1), (0.4, 0.2), (0.4, 0.2)]
    with pytest.raises(ValueError, match="set data.itc.momentum"):
        MomentumOptions(queue_size=16)
    with pytest.raises(ValueError, match="at least the global batch"):
        MomentumTeacher(model, MomentumOptions(momentum=0.9, queue_size=2)).enqueue(
            torch.zeros(4, 16), torch.zeros(4, 16), torch.zeros(4, dtype=torch.long)
        )


def test_held_out_passes_use_no_teacher_and_leave_the_queue_alone():
    model = tiny_vl_model()
    teacher = perturbed_teacher(model, MomentumOptions(momentum=0.9, queue_size=8, alpha=0.4))
    batch, content = pairs(4), torch.tensor([1, 2, 3, 4])
    queue = teacher.text_queue.clone()
    model.eval()
    with torch.no_grad():
        held_out = model(**batch, itc_content=content).loss
        attach(model, None)
        plain = model(**batch, itc_content=content).loss
    assert float(held_out) == float(plain) and torch.equal(teacher.text_queue, queue) and teacher.pointer == 0


def momentum_run_config(shards, out) -> dict:
    return {
        "modality": "vl",
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "projection_dim": 16,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
        },
        "data": {
            "shards": str(shards),
            "max_images": 24,
            "eval_fraction": 0.0,
            "objectives": {"itc": 2, "mlm": 1, "itm": 1},
            "itm_negatives": "itc",
            "itc": {"momentum": 0.9, "queue_size": 8, "alpha": 0.4, "mlm_alpha": 0.4, "alpha_ramp_steps": 2},
        },
        "training": {
            "output_dir": str(out),
            "max_steps": 6,
            "batch_size": 4,
            "learning_rate": 1e-3,
            "warmup_steps": 1,
            "log_every": 1,
            "save_every": 2,
            "save_total_limit": 0,
            "progress_bar": False,
        },
    }


@pytest.mark.slow
def test_a_run_with_momentum_and_queue_stopped_and_resumed_equals_the_uninterrupted_run(tmp_path):
    """A VL run of ITC (queue of 8, ramped alpha), distilled MLM and ITM on ITC-mined negatives, stopped after step
    4 (its checkpoint and log) and resumed, gives the uninterrupted run's losses for steps 5 and 6 (ITC, ITM): the
    momentum weights and the queue travel in training_state.pt (not in the model's weights)."""
    from helpers.builders import write_easy_vqa_shards
    from helpers.distributed import losses, reference_run, stopped_copy

    shards = write_easy_vqa_shards(tmp_path / "shards", 24)
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    reference_run(momentum_run_config(shards, whole), "vl-pretraining")
    state = torch.load(whole / "checkpoints" / "step-4" / "training_state.pt", weights_only=False)
    hook = next(v for k, v in state["hooks"].items() if k.endswith("MomentumDistillation"))
    assert hook["updates"] == 4 and hook["queues"]["text_queue"].shape == (8, 16) and hook["pointer"] > 0
    stopped_copy(whole, stopped, 4, 4)
    reference_run(momentum_run_config(shards, stopped), "vl-pretraining", resume=True)
    a, b = losses(whole), losses(stopped)
    assert sorted(b) == list(range(1, 7)) and max(abs(a[s] - b[s]) for s in a) <= 1e-6, (a, b)
    from safetensors import safe_open

    with safe_open(whole / "model.safetensors", "pt") as saved:  # the model's weights: no momentum copy, no queue
        assert not [k for k in saved.keys() if "momentum" in k or "queue" in k]  # noqa: SIM118 (safe_open)
    lines = (whole / "log.jsonl").read_text().splitlines()
    later = [json.loads(line) for line in lines if json.loads(line)["step"] > 4]
    assert {"itc", "itm"} <= {k for r in later for k in r}  # the queue of step 4 read at step 5


def test_itm_negatives_mined_by_itc_are_albefs_draw():
    """``itm_negatives: itc``: the b pairs become ALBEF's 3b rows (pairs; caption i with a drawn image; a drawn
    caption with image i; labels 1, 0, 0), and over a grid of uniform numbers each row's draws fall on the other
    items in proportion to ALBEF's weights: softmax(sim / temp) with the items of the same content set to 0."""
    from vlbert.objectives.base import PrepareContext

    model = tiny_vl_model()
    batch, content = pairs(4, seed=4), torch.tensor([1, 2, 1, 3])
    inputs = VLInputs(**batch)
    itm = OBJECTIVES["itm"]
    text, image = OBJECTIVES["itc"].embed(model, inputs, {})
    with torch.no_grad():
        weights_t2i = F.softmax(text @ image.t() / 0.07, dim=1).masked_fill(content[:, None] == content[None, :], 0)
        weights_i2t = F.softmax(image @ text.t() / 0.07, dim=1).masked_fill(content[:, None] == content[None, :], 0)
    grid = 40
    counts_image, counts_text = torch.zeros(4, 4), torch.zeros(4, 4)
    for k in range(grid):
        u = torch.full((4, 2), (k + 0.5) / grid)
        rows = itm.before_encoder(model, inputs, {"itm_label": torch.ones(4), "itm_content": content, "itm_draw": u})
        assert rows.input_ids.shape[0] == 12 and torch.equal(rows.input_ids[:4], batch["input_ids"])
        assert torch.equal(rows.input_ids[4:8], batch["input_ids"])  # each caption with a drawn image
        assert torch.equal(rows.region_features[8:], batch["region_features"])  # each image with a drawn caption
        for i in range(4):
            drawn_image = [j for j in range(4) if torch.equal(rows.region_features[4 + i], batch["region_features"][j])]
            drawn_text = [j for j in range(4) if torch.equal(rows.input_ids[8 + i], batch["input_ids"][j])]
            counts_image[i, drawn_image[0]] += 1
            counts_text[i, drawn_text[0]] += 1
    for counts, weights in ((counts_image, weights_t2i), (counts_text, weights_i2t)):
        expected = weights / weights.sum(1, keepdim=True)
        assert (counts / grid - expected).abs().max() <= 1.5 / grid, (counts / grid, expected)
    # the collator's side: every item keeps its caption (label 1), two uniform numbers each
    from types import SimpleNamespace

    prepared = {}
    text_side = SimpleNamespace(
        pad=lambda rows: {"input_ids": torch.stack([torch.tensor(r["input_ids"]) for r in rows])}
    )
    items = [
        {"input_ids": [2, 5, 3], "negative_input_ids": [2, 6, 3], "content_id": c, "sample_seed": c} for c in (1, 2)
    ]
    itm.prepare(prepared, items, PrepareContext(text=text_side, itm_negatives="itc"))
    assert prepared["itm_label"].tolist() == [1, 1] and prepared["itm_draw"].shape == (2, 2)
    out = model(**batch, itm_label=torch.ones(4, dtype=torch.long), itm_content=content, itm_draw=u)
    assert out.counts["itm"] == 12 and out.seq_relationship_logits.shape == (12, 2)
    # the end-of-run table's baseline: the majority answer ("no match") on 1 pair in 3, not the class's 0.5
    assert abs(float(out.metrics["itm_accuracy_chance"]) - 2 / 3) < 1e-6
    from vlbert.recipes.report import baseline_of

    assert baseline_of("eval_itm_accuracy", {"eval_itm_accuracy": 0.7, "eval_itm_accuracy_chance": 2 / 3}) == (
        2 / 3,
        "chance",
    )


@pytest.mark.slow
def test_sigterm_mid_run_with_momentum_and_queue_resumes_to_the_same_losses(tmp_path):
    """SIGTERM (cluster preemption) in a VL run of ITC with queue and momentum, distilled MLM and ITC-mined ITM,
    through ``tools/pretrain.py``'s entry: the step in progress finishes, a checkpoint is written (the momentum
    weights and the queue with it), the tool exits with 143, and ``--resume`` gives the uninterrupted run's loss at
    every step."""
    import signal

    import yaml
    from helpers.builders import like_a_worker, tool, wait_for_log_lines, write_easy_vqa_shards
    from helpers.distributed import tool_process

    steps = 24
    shards = write_easy_vqa_shards(tmp_path / "shards", 24)

    def argv(out):
        config = momentum_run_config(shards, out)
        config["training"].update(max_steps=steps, save_every=0)
        path = tmp_path / f"{out.name}.yaml"
        path.write_text(yaml.safe_dump(config))
        return ["--modality", "vl", "--config", str(path)]

    reference, stopped = tmp_path / "reference", tmp_path / "stopped"
    with like_a_worker():
        assert tool("pretrain")(argv(reference)) in (0, None)
    proc = tool_process("pretrain", argv(stopped), stderr=tmp_path / "stopped.err")
    wait_for_log_lines(proc, stopped / "log.jsonl", 6)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(120)
    stderr = (tmp_path / "stopped.err").read_text()
    assert code == 143, stderr[-2000:]
    stopped_at = max(json.loads(line)["step"] for line in (stopped / "log.jsonl").read_text().splitlines())
    assert stopped_at < steps and (stopped / "checkpoints" / f"step-{stopped_at}" / "training_state.pt").is_file()
    with like_a_worker():
        assert tool("pretrain")([*argv(stopped), "--resume"]) in (0, None)

    def losses(out):
        rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}

    a, b = losses(reference), losses(stopped)
    assert sorted(b) == list(range(1, steps + 1)), sorted(b)
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-6, (a, b)
