"""Checkpoints: Hugging Face layout both ways, old key names, .bin files, and refusals of foreign files."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers.builders import padded_batch, random_hf_config

import vlbert
from vlbert import checkpoint as ckpt


def tiny_model(seed=0, cls=vlbert.BertForPreTraining):
    torch.manual_seed(seed)
    return cls(vlbert.BertConfig.from_dict(random_hf_config(seed).to_dict())).eval()


def test_saved_checkpoint_loads_in_transformers_with_same_logits(tmp_path, tokenizer):
    ours = tiny_model(1)
    ours.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    hf, info = transformers.BertForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == set() or not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert not info.get("mismatched_keys")
    hf.eval()
    ids, types, mask = padded_batch(ours.config.vocab_size, seed=3)
    with torch.no_grad():
        a = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
        b = ours(ids, types, mask)
    real = mask.bool()  # padded positions: zeros here, unread values in transformers
    torch.testing.assert_close(b.prediction_logits[real], a.prediction_logits[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(b.seq_relationship_logits, a.seq_relationship_logits, atol=1e-5, rtol=0)


def test_save_load_round_trip_is_exact(tmp_path):
    ours = tiny_model(2)
    ours.save_pretrained(tmp_path)
    again = vlbert.BertForPreTraining.from_pretrained(tmp_path)
    assert again.loading_info.missing_keys == [] and again.loading_info.unexpected_keys == []
    for (n, p), (m, q) in zip(ours.state_dict().items(), again.state_dict().items(), strict=True):
        assert n == m and torch.equal(p, q)


def test_key_mapping_round_trip():
    hf = transformers.BertForPreTraining(random_hf_config(4))
    hf_state = {k: v for k, v in hf.state_dict().items() if k not in ckpt.TIED_HF_KEYS}
    back = ckpt.vlbert_to_hf(ckpt.hf_to_vlbert(hf_state))
    assert set(back) == set(hf_state)
    assert all(torch.equal(back[k], hf_state[k]) for k in hf_state)


def test_bare_encoder_checkpoint_into_pretraining_model(minilm_dir):
    """The MiniLM package ships a BertModel (no heads): the encoder loads, heads are reported missing."""
    model = vlbert.BertForPreTraining.from_pretrained(minilm_dir)
    missing = model.loading_info.missing_keys
    assert missing and all(k.startswith(("masked_lm.", "next_sentence.")) for k in missing)
    assert model.loading_info.unexpected_keys == []
    encoder = vlbert.BertModel.from_pretrained(minilm_dir)
    torch.testing.assert_close(
        model.bert.encoder.layers[0].attention.qkv.weight, encoder.encoder.layers[0].attention.qkv.weight
    )


def test_pretraining_checkpoint_into_bare_encoder_reports_heads_unused(tmp_path):
    tiny_model(5).save_pretrained(tmp_path)
    encoder = vlbert.BertModel.from_pretrained(tmp_path)
    assert encoder.loading_info.missing_keys == []
    assert any(k.startswith("cls.") or k.startswith("masked_lm") for k in encoder.loading_info.unexpected_keys)


def test_old_gamma_beta_names_and_pytorch_bin(tmp_path):
    hf = transformers.BertModel(random_hf_config(6)).eval()
    state = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in hf.state_dict().items()
    }
    torch.save(state, tmp_path / "pytorch_model.bin")
    hf.config.to_json_file(tmp_path / "config.json")
    ours = vlbert.BertModel.from_pretrained(tmp_path, strict=True).eval()
    ids, types, mask = padded_batch(hf.config.vocab_size, seed=2)
    with torch.no_grad():
        real = mask.bool()
        torch.testing.assert_close(
            ours(ids, types, mask).last_hidden_state[real],
            hf(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state[real],
            atol=1e-5,
            rtol=0,
        )


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_pickled_objects_are_refused(tmp_path):
    torch.save({"weight": _Payload()}, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=True)
    random_hf_config(0).to_json_file(tmp_path / "config.json")
    with pytest.raises(ValueError, match="never unpickles"):
        vlbert.BertModel.from_pretrained(tmp_path)


def test_other_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 32}))
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        vlbert.BertModel.from_pretrained(tmp_path)
    # A config that claims BERT over weights that are not BERT's.
    random_hf_config(0).to_json_file(tmp_path / "config.json")
    ckpt.write_safetensors({"transformer.h.0.attn.c_attn.weight": torch.zeros(4, 4)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="not a BERT checkpoint"):
        vlbert.BertModel.from_pretrained(tmp_path)


def test_shape_mismatch_names_the_tensor(tmp_path):
    tiny_model(0).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(ValueError, match="word_embeddings"):
        vlbert.BertForPreTraining.from_pretrained(tmp_path, vocab_size=config["vocab_size"] + 1)


def test_missing_directory_and_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        vlbert.BertModel.from_pretrained(tmp_path / "nope" / "missing")
    random_hf_config(0).to_json_file(tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="has no weights"):
        vlbert.BertModel.from_pretrained(tmp_path)


def test_corrupt_safetensors(tmp_path):
    random_hf_config(0).to_json_file(tmp_path / "config.json")
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError, match="corrupt"):
        vlbert.BertModel.from_pretrained(tmp_path)


def test_sequence_longer_than_positions():
    model = tiny_model(0, vlbert.BertModel)
    ids = torch.ones(1, model.config.max_position_embeddings + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(ids)


def test_tokenizer_vocabulary_mismatch(tokenizer):
    from vlbert.tokenization import check_tokenizer_matches

    check_tokenizer_matches(tokenizer, vlbert.BertConfig(vocab_size=len(tokenizer)))
    with pytest.raises(ValueError, match="vocab_size"):
        check_tokenizer_matches(tokenizer, vlbert.BertConfig(vocab_size=28996))
    # A table padded beyond the tokenizer (to a multiple of 64, for speed) is harmless: every id has a row.
    check_tokenizer_matches(tokenizer, vlbert.BertConfig(vocab_size=-(-len(tokenizer) // 64) * 64))


def test_config_json_compatible_with_transformers(tmp_path):
    config = vlbert.BertConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128)
    config.to_json_file(tmp_path / "config.json")
    hf = transformers.BertConfig.from_json_file(tmp_path / "config.json")
    assert (hf.hidden_size, hf.num_attention_heads, hf.num_hidden_layers) == (64, 4, 2)
    assert vlbert.BertConfig.from_json_file(tmp_path / "config.json") == config
    with pytest.raises(ValueError, match="divisible"):
        vlbert.BertConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="unknown model config"):
        vlbert.BertConfig.from_dict({"hidden_sise": 3}, strict=True)


def test_missing_optional_package_names_the_install():
    from vlbert.common.dependencies import require

    with pytest.raises(ModuleNotFoundError, match=r"pip install -e '\.\[demo\]'"):
        require("no_such_package_xyz", "the demo data", "pip install -e '.[demo]'")


def test_library_calls_check_their_inputs():
    """What the CLIs refuse, the models refuse too: ids outside the embedding tables and rows with no token."""
    import vlbert

    model = vlbert.BertModel(
        vlbert.BertConfig(
            vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
        )
    )
    with pytest.raises(ValueError, match="input_ids holds 60, outside the model's table of 50"):
        model(torch.tensor([[1, 60]]))
    with pytest.raises(ValueError, match="input_ids holds -1"):
        model(torch.tensor([[1, -1]]))
    with pytest.raises(ValueError, match="token_type_ids holds 2, outside the model's table of 2"):
        model(torch.tensor([[1, 2]]), torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match="attention_mask row 1 has no real token"):
        model(torch.tensor([[1, 2], [3, 4]]), None, torch.tensor([[1, 1], [0, 0]]))


def test_every_vl_head_round_trips_and_is_exported(tmp_path):
    """Save/load of each VL head class is exact, the retrieval projection size included (it lived outside the
    config and came back as 256), and each class is importable from vlbert."""
    torch.manual_seed(0)
    base = dict(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=40,
        region_feature_dim=12,
        num_region_classes=0,
    )
    for name, extra in (
        ("VLBertForImageTextRetrieval", {"projection_dim": 16}),
        ("VLBertForVQA", {"num_labels": 7}),
        ("VLBertForImagePairClassification", {}),
        ("VLBertForReferringExpressions", {}),
        ("VLBertForVisualReasoning", {}),
        ("VLBertForMaskedTokenVQA", {"num_labels": 5}),
    ):
        cls = getattr(vlbert, name)
        model = cls(vlbert.VLBertConfig(**base, **extra))
        model.save_pretrained(tmp_path / name)
        loaded = cls.from_pretrained(tmp_path / name)
        assert not loaded.loading_info.missing_keys and not loaded.loading_info.unexpected_keys, name
        for key, value in model.state_dict().items():
            torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0)
    assert (
        vlbert.VLBertForImageTextRetrieval.from_pretrained(
            tmp_path / "VLBertForImageTextRetrieval"
        ).text_proj.out_features
        == 16
    )


def test_returned_attentions_are_the_weights_that_multiply_the_values():
    """In training mode with attention dropout, the returned probabilities are after dropout, as transformers'
    eager attention returns them (some entries dropped to 0, the kept ones scaled by 1 / (1 - p))."""
    torch.manual_seed(0)
    config = vlbert.BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=40,
        attention_probs_dropout_prob=0.5,
        hidden_dropout_prob=0.0,
    )
    model = vlbert.BertModel(config).train()
    ids = torch.randint(1, 50, (2, 9))
    attention = model(ids, output_attentions=True).attentions[0]
    assert (attention == 0).any() and (attention.sum(-1) - 1).abs().max() > 0.1
    model.eval()
    attention = model(ids, output_attentions=True).attentions[0]
    torch.testing.assert_close(attention.sum(-1), torch.ones(2, 2, 9))
