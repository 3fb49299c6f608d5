"""The contract every model class keeps (issue 30), checked over all of them in one place: a training forward on a
ragged batch gives a finite loss and logits of the documented shape (an encoder, which has no loss: its hidden
states and pooled output), its backward reaches every parameter not listed in ``unused_parameters`` (an encoder:
not in its ``idle_modules``), and save_pretrained / from_pretrained is exact with nothing missing or unexpected.
"Every model class" is every concrete subclass of vlbert's ``PreTrainedModel`` (:func:`model_classes`), exported or
not. The transformers round trips of the text classes are in test_parity_transformers.py and test_heads.py."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch
from helpers.batches import B, D, R, T, mlm_labels, regions, text

import vlbert
import vlbert.models
from vlbert.models.modernbert import ModernBertPreTrainedModel
from vlbert.models.modernbert_heads import _ModernBertTaskModel
from vlbert.models.objective_units import UnitPreTrainingModel
from vlbert.models.pretrained import PreTrainedModel
from vlbert.models.region_embeddings import REGION_EMBEDDINGS
from vlbert.models.vl_task import VLBertForTask

H = 16  # the contract configs' hidden size


def is_base(cls: type) -> bool:
    """Whether ``cls`` is an abstract base, one that leaves part of the model to its subclasses, which vlbert's
    bases say in one of two ways: :class:`VLBertForTask` has no head (its ``build_head`` raises
    NotImplementedError: a task head implements it) and :class:`UnitPreTrainingModel` no modality (it builds no
    objective unit and has no forward: the text and VL pretraining models set both). A class with a forward of its
    own is not enough a rule: the task heads inherit VLBertForTask's forward and are concrete."""
    if issubclass(cls, VLBertForTask):
        return cls.build_head is VLBertForTask.build_head
    if cls in (ModernBertPreTrainedModel, _ModernBertTaskModel):  # ModernBERT's shared parts: no forward, no head
        return True
    return issubclass(cls, UnitPreTrainingModel) and not cls.modality


def model_subclasses() -> list[type]:
    """Every subclass of vlbert's ``PreTrainedModel`` defined in vlbert (every module of vlbert.models imported,
    ``__subclasses__`` walked recursively; classes other test modules define in this process are left out)."""
    for module in pkgutil.walk_packages(vlbert.models.__path__, "vlbert.models."):
        importlib.import_module(module.name)
    found, todo = [], [PreTrainedModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found and sub.__module__.startswith("vlbert."):
                found.append(sub)
                todo.append(sub)
    return found


def model_classes() -> dict[str, type]:
    """name -> class of every concrete model class (:func:`model_subclasses` less the bases, :func:`is_base`)."""
    return {cls.__name__: cls for cls in model_subclasses() if not is_base(cls)}


def _classification(num_labels: int, pairs: bool = False):
    return lambda: {**text(), **regions(pairs=pairs), "labels": torch.tensor([0, 1, 1]) % num_labels}


# class name -> (config extras, batch builder, the logits field and its shape)
CASES = {
    "BertModel": ({}, text, "last_hidden_state", (B, T, H)),
    # ModernBERT (vlbert/models/modernbert.py): MLM only, no token types (given, and not read)
    "ModernBertModel": ({}, text, "last_hidden_state", (B, T, H)),
    "ModernBertForMaskedLM": (  # with labels: the logits of the masked positions only, one per row here
        {},
        lambda: {**(t := text()), "labels": mlm_labels(t)},
        "prediction_logits",
        (B, 50),
    ),
    "ModernBertForSequenceClassification": (
        {"num_labels": 3},
        lambda: {**text(), "labels": torch.tensor([0, 2, 1])},
        "logits",
        (B, 3),
    ),
    "ModernBertForTokenClassification": (
        {"num_labels": 4},
        lambda: {**text(), "labels": torch.randint(4, (B, T), generator=torch.Generator().manual_seed(2))},
        "logits",
        (B, T, 4),
    ),
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
    "VLBertModel": ({}, lambda: {**text(), **regions()}, "last_hidden_state", (B, T + R, H)),
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
    # UNITER's heads (vlbert/models/uniter_heads.py): SNLI-VE's 3 labels; NLVR2's image pairs, the right image's
    # regions of a third token type
    "VLBertForVisualEntailment": ({"num_labels": 3}, _classification(3), "logits", (B, 3)),
    "VLBertForNLVR2Paired": ({"type_vocab_size": 3}, _classification(2, pairs=True), "logits", (B, 2)),
    "VLBertForNLVR2PairedAttention": ({"type_vocab_size": 3}, _classification(2, pairs=True), "logits", (B, 2)),
}


def test_every_model_class_is_covered_and_exported():
    """Every concrete ``PreTrainedModel`` subclass of vlbert has a case here, and is public API (``vlbert.__all__``)."""
    classes = model_classes()
    assert "VLBertForVQA" in classes and "VLBertForNLVR2PairedAttention" in classes  # the tree was walked
    assert set(classes) == set(CASES)
    assert set(classes) <= set(vlbert.__all__)


def test_the_bases_left_out_cannot_run_by_themselves():
    """What :func:`is_base` leaves out is abstract: built with a config, each base fails to build or to run a forward
    (VLBertForTask: no head; UnitPreTrainingModel: no forward), so no model class escapes the contract as a base."""
    bases = [cls for cls in model_subclasses() if is_base(cls)]
    assert {cls.__name__ for cls in bases} == {
        "VLBertForTask",
        "UnitPreTrainingModel",
        "ModernBertPreTrainedModel",
        "_ModernBertTaskModel",
    }
    for cls in bases:
        with pytest.raises((NotImplementedError, TypeError)):  # no forward; _ModernBertTaskModel: no head size
            config = contract_config(cls.__name__, {})
            cls(config)(*text().values())  # torch's stub takes no keys


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


def contract_config(name: str, extras: dict):
    """A one-layer config of hidden size :data:`H` for the model class ``name`` (a VLBertConfig with regions of
    :data:`D` features; a ModernBertConfig with a local window of 4, shorter than the batch) plus ``extras``."""
    base = {
        "vocab_size": 50,
        "hidden_size": H,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 16,
    }
    if name.startswith("ModernBert") or name == "_ModernBertTaskModel":
        tokens = {"pad_token_id": 0, "cls_token_id": 2, "sep_token_id": 3, "bos_token_id": 2, "eos_token_id": 3}
        return vlbert.ModernBertConfig(**base, **tokens, local_attention=4, **extras)
    if name.startswith("VL"):
        return vlbert.VLBertConfig(**base, region_feature_dim=D, num_region_classes=4, **extras)
    return vlbert.BertConfig(**base, **extras)


def check_contract(name, tmp_path, encoder: dict, more: dict | None = None):
    extras, build, field, shape = CASES[name]
    cls = model_classes()[name]
    config = contract_config(name, {**extras, **encoder})
    torch.manual_seed(0)
    model = cls(config).train()
    out = model(**build(), **(more or {}))
    if field is not None and shape is not None:
        assert tuple(getattr(out, field).shape) == shape, name
    if model.objectives:
        assert out.loss is not None and out.loss.dim() == 0 and torch.isfinite(out.loss), name
        assert out.losses and set(out.losses) <= set(model.objectives), (name, out.losses, model.objectives)
        out.loss.backward()
        unused = {id(p) for p in getattr(out, "unused_parameters", None) or ()}
    else:  # an encoder, no loss: every hidden state and the pooled output (ModernBERT has none) feed the backward
        pooled = out.pooler_output if out.pooler_output is not None else torch.zeros(B, H)
        assert pooled.shape == (B, H) and torch.isfinite(out.last_hidden_state).all(), name
        (out.last_hidden_state.sum() + pooled.sum()).backward()
        unused = {id(p) for module in model.idle_modules() for p in module.parameters()}
    unreached = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None and id(p) not in unused]
    assert unreached == [], f"{name}: backward never reaches {unreached}"

    model.save_pretrained(tmp_path / name)
    loaded = cls.from_pretrained(tmp_path / name)
    assert not loaded.loading_info.missing_keys and not loaded.loading_info.unexpected_keys, name
    state = loaded.state_dict()
    assert state.keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0, msg=f"{name} {key}")
