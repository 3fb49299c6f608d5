"""The contract every model class keeps (issue 30), checked over all of them in one place: a training forward on a
ragged batch gives a finite loss and logits of the documented shape, its backward reaches every parameter not
listed in ``unused_parameters``, and save_pretrained / from_pretrained is exact with nothing missing or unexpected.
The transformers round trips of the text classes are in test_parity_transformers.py and test_heads.py."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import B, D, R, T, mlm_labels, regions, text

import vlbert
from vlbert.models.region_embeddings import REGION_EMBEDDINGS

# class name -> (config extras, batch builder, the logits field and its shape)
CASES = {
    "BertForPreTraining": (
        {},
        lambda: {**(t := text()), "labels": mlm_labels(t), "next_sentence_label": torch.tensor([0, 1, 0])},
        "seq_relationship_logits",
        (B, 2),
    ),
    "BertForSequenceClassification": (
        {"num_labels": 3},
        lambda: {**text(), "labels": torch.tensor([0, 2, 1])},
        "logits",
        (B, 3),
    ),
    "BertForTokenClassification": (
        {"num_labels": 4},
        lambda: {
            **(t := text()),
            "labels": torch.randint(4, (B, T), generator=torch.Generator().manual_seed(2)).masked_fill(
                t["attention_mask"] == 0, -100
            ),
        },
        "logits",
        (B, T, 4),
    ),
    "BertForQuestionAnswering": (
        {},
        lambda: {**text(), "start_positions": torch.tensor([1, 2, 1]), "end_positions": torch.tensor([3, 4, 2])},
        "start_logits",
        (B, T),
    ),
    "BertForMultipleChoice": (
        {},
        lambda: {
            **{k: v[:, None].expand(B, 2, T).contiguous() for k, v in text().items()},
            "labels": torch.tensor([0, 1, 1]),
        },
        "logits",
        (B, 2),
    ),
    "VLBertForPreTraining": (
        {},
        lambda: {**(t := text()), **regions(), "labels": mlm_labels(t)},
        "prediction_logits",
        None,
    ),
    "VLBertForVQA": (
        {"num_labels": 6},
        lambda: {
            **text(),
            **regions(),
            "answer_targets": torch.rand(B, 6, generator=torch.Generator().manual_seed(3)).round(),
        },
        "logits",
        (B, 6),
    ),
    "VLBertForMaskedTokenVQA": (
        {"num_labels": 6},
        lambda: {
            **text(),
            **regions(),
            "answer_targets": torch.rand(B, 6, generator=torch.Generator().manual_seed(3)).round(),
        },
        "logits",
        (B, 6),
    ),
    "VLBertForImageTextRetrieval": (
        {"projection_dim": 8},
        lambda: {**text(), **regions(), "group_ids": torch.tensor([0, 1, 2]), "cls_sep_ids": torch.tensor([2, 3])},
        None,
        None,
    ),
    "VLBertForSequenceClassification": (
        {"num_labels": 3},
        lambda: {**text(), **regions(), "labels": torch.tensor([0, 2, 1])},
        "logits",
        (B, 3),
    ),
    "VLBertForImagePairClassification": (
        {},
        lambda: {**text(), **regions(pairs=True), "labels": torch.tensor([0, 1, 1])},
        "logits",
        (B, 2),
    ),
    "VLBertForVisualReasoning": (
        {},
        lambda: {**text(), **regions(pairs=True), "labels": torch.tensor([0, 1, 1])},
        "logits",
        (B, 2),
    ),
    "VLBertForReferringExpressions": (
        {},
        lambda: {**text(), **regions(), "target_region": torch.tensor([0, 2, 4])},
        "logits",
        (B, R),
    ),
}


def test_every_exported_model_class_is_covered():
    exported = {name for name in vlbert.__all__ if name.startswith(("BertFor", "VLBertFor"))}
    assert exported == set(CASES)


#: LXMERT's two-stream encoder (issue 42) under every VL head (retrieval's text embedding: its language layers).
TWO_STREAM = {
    "encoder": "two-stream",
    "l_layers": 1,
    "r_layers": 1,
    "x_layers": 1,
    "region_embedding": "lxmert",
    "region_location_dim": 4,
    "num_attribute_classes": 3,
    "num_qa_labels": 4,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_model_contract(name, tmp_path):
    check_contract(name, tmp_path, {})


@pytest.mark.parametrize("name", sorted(n for n in CASES if n.startswith("VL")))
def test_two_stream_model_contract(name, tmp_path):
    check_contract(name, tmp_path, TWO_STREAM)


#: Config a region pathway needs beyond its own declarations (VL-BERT types regions 2: a third token type).
PATHWAY_CONFIG = {"vl-bert": {"type_vocab_size": 3, "region_token_type": 2}}


@pytest.mark.parametrize("pathway", sorted(REGION_EMBEDDINGS))
def test_every_region_pathway_keeps_the_pretraining_contract(pathway, tmp_path):
    """Every REGION_EMBEDDINGS entry under the VL pretraining model, on MLM and on masked region batches: the
    backward reaches every parameter not declared unused (the pathway's masked-region-only modules are declared on
    the MLM batch and trained on the masked one), the box size is the pathway's own, save / load is exact."""
    masked = torch.zeros(B, R, dtype=torch.bool)
    masked[:, 0] = True
    extra = {"masked_regions": masked, "region_labels": torch.full((B, R, 4), 0.25)}
    for batch in ({}, extra):
        check_contract(
            "VLBertForPreTraining",
            tmp_path / str(len(batch)),
            {"region_embedding": pathway, **PATHWAY_CONFIG.get(pathway, {})},
            batch,
        )
    model = vlbert.VLBertForPreTraining.from_pretrained(tmp_path / "2" / "VLBertForPreTraining")
    assert model.config.region_location_dim == REGION_EMBEDDINGS[pathway].location_dim  # the declared box size
    if pathway == "uniter":  # its mask embedding is idle without masked regions, used with them
        assert [m for m in model.bert.idle_modules(None)] == [model.bert.region_embeddings.mask_embedding]
    assert model.bert.idle_modules(masked) == []


def check_contract(name, tmp_path, encoder: dict, more: dict | None = None):
    extras, build, field, shape = CASES[name]
    cls = getattr(vlbert, name)
    base = {
        "vocab_size": 50,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 16,
    }
    config = (
        vlbert.VLBertConfig(**base, region_feature_dim=D, num_region_classes=4, **extras, **encoder)
        if name.startswith("VL")
        else vlbert.BertConfig(**base, **extras)
    )
    torch.manual_seed(0)
    model = cls(config).train()
    out = model(**build(), **(more or {}))
    assert out.loss is not None and out.loss.dim() == 0 and torch.isfinite(out.loss), name
    assert out.losses and set(out.losses) <= set(model.objectives), (name, out.losses, model.objectives)
    if field is not None and shape is not None:
        assert tuple(getattr(out, field).shape) == shape, name
    out.loss.backward()
    unused = {id(p) for p in getattr(out, "unused_parameters", None) or ()}
    unreached = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None and id(p) not in unused]
    assert unreached == [], f"{name}: backward never reaches {unreached}"

    model.save_pretrained(tmp_path / name)
    loaded = cls.from_pretrained(tmp_path / name)
    assert not loaded.loading_info.missing_keys and not loaded.loading_info.unexpected_keys, name
    state = loaded.state_dict()
    assert state.keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0, msg=f"{name} {key}")
