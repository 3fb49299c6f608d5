"""A ModernBERT text tower under the region pathway (vlbert.models.text_towers): started from a transformers
ModernBERT directory it computes that model's text function; regions stay an unordered set; the VL model saves and
loads back exactly; the configurations it cannot serve are refused in one line."""

from __future__ import annotations

import pytest
import torch
import transformers

from vlbert.config import VLBertConfig
from vlbert.models.vl import VLBertForPreTraining, VLBertModel
from vlbert.models.vqa import VLBertForVQA

TINY = dict(vocab_size=60, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2)


@pytest.fixture(scope="module")
def modernbert_dir(tmp_path_factory):
    """A random transformers ModernBertForMaskedLM (a +-4 window in its local layer) saved as transformers saves it."""
    config = transformers.ModernBertConfig(
        **TINY,
        max_position_embeddings=64,
        local_attention=8,
        global_attn_every_n_layers=2,
        pad_token_id=0,
        cls_token_id=1,
        sep_token_id=2,
        bos_token_id=1,
        eos_token_id=2,
        decoder_bias=True,
    )
    torch.manual_seed(0)
    model = transformers.ModernBertForMaskedLM(config).eval()
    with torch.no_grad():
        model.decoder.bias.normal_()  # not the zeros it starts with: the test reads it
    directory = tmp_path_factory.mktemp("modernbert")
    model.save_pretrained(directory)
    return directory, model


def batch(seed: int = 0, text: int = 5, regions: int = 3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, TINY["vocab_size"], (2, text), generator=g)
    ids[:, 0], ids[:, -1] = 1, 2
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    features = torch.randn(2, regions, 16, generator=g)
    corners = torch.rand(2, regions, 4, generator=g)
    boxes = torch.cat([corners[..., :2].minimum(corners[..., 2:]), corners[..., :2].maximum(corners[..., 2:])], -1)
    return ids, mask, features, boxes


def test_started_from_a_modernbert_directory_it_is_that_model_on_text(modernbert_dir, caplog):
    """Text alone, the VL model's masked-LM logits are transformers' ModernBertForMaskedLM's (its prediction head
    loaded as the masked-LM head), for text within the local window; the new tensors are said in one line."""
    directory, hf = modernbert_dir
    with caplog.at_level("INFO"):
        model = VLBertForPreTraining.from_pretrained(directory, region_feature_dim=16, num_region_classes=0).eval()
    said = [r.getMessage() for r in caplog.records if "is a text ModernBERT" in r.getMessage()]
    assert len(said) == 1 and "embeddings (1), pooler (2), region_embeddings (11)" in said[0], said
    assert model.config.text_tower == "modernbert" and model.config.modernbert["local_attention"] == 8
    ids, mask, _, _ = batch()
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=mask).prediction_logits
        theirs = hf(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn", ["eager", "sdpa", "varlen"])
def test_regions_are_an_unordered_set_and_every_kernel_agrees(modernbert_dir, attn):
    """Permuting the regions permutes their outputs and changes nothing else (they carry no rotary position), text
    longer than the local window sees every region (all layers global), and the kernels agree with eager."""
    directory, _ = modernbert_dir
    ids, mask, features, boxes = batch(text=12, regions=4)
    ref = VLBertModel.from_pretrained(directory, region_feature_dim=16, attn_implementation="eager").eval()
    model = VLBertModel.from_pretrained(directory, region_feature_dim=16, attn_implementation=attn).eval()
    model.load_state_dict(ref.state_dict())  # the same new region pathway
    perm = torch.tensor([3, 1, 0, 2])
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask, region_features=features, region_boxes=boxes)
        b = model(input_ids=ids, attention_mask=mask, region_features=features[:, perm], region_boxes=boxes[:, perm])
        e = ref(input_ids=ids, attention_mask=mask, region_features=features, region_boxes=boxes)
        probs = ref(
            input_ids=ids, attention_mask=mask, region_features=features, region_boxes=boxes, output_attentions=True
        ).attentions
    t, real = ids.shape[1], mask.bool()
    torch.testing.assert_close(a.last_hidden_state[:, :t][real], b.last_hidden_state[:, :t][real], atol=1e-5, rtol=0)
    torch.testing.assert_close(a.last_hidden_state[:, t:][:, perm], b.last_hidden_state[:, t:], atol=1e-5, rtol=0)
    torch.testing.assert_close(a.last_hidden_state[:, :t][real], e.last_hidden_state[:, :t][real], atol=1e-5, rtol=0)
    # the local layer (index 1): the first word attends to every region although they are > 4 positions away
    assert (probs[1][0, :, 0, t:] > 0).all()


def test_a_modernbert_vl_model_saves_and_loads_back_exactly(modernbert_dir, tmp_path):
    directory, _ = modernbert_dir
    model = VLBertForPreTraining.from_pretrained(directory, region_feature_dim=16, num_region_classes=0)
    saved = model.save_pretrained(tmp_path / "vl")
    again = VLBertForPreTraining.from_pretrained(saved)
    assert again.loading_info.missing_keys == [] and again.loading_info.unexpected_keys == []
    assert again.config == model.config
    mine, theirs = model.state_dict(), again.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    vqa = VLBertForVQA.from_pretrained(saved, num_labels=5)  # a fine-tuning task starts from it
    assert all(k.startswith("vqa_head.") for k in vqa.loading_info.missing_keys)
    assert torch.equal(vqa.bert.encoder.layers[2].ffn_in.weight, model.bert.encoder.layers[2].ffn_in.weight)


def test_a_fresh_modernbert_tower_from_a_config(tmp_path):
    """``model: {text_tower: modernbert, modernbert: {...}}`` builds the tower with ModernBERT's initialisation
    (output projections at initializer_range / sqrt(2 L)) and runs text with regions."""
    config = VLBertConfig(**TINY, region_feature_dim=16, text_tower="modernbert", modernbert={"local_attention": 8})
    torch.manual_seed(0)
    model = VLBertModel(config)
    std = model.encoder.layers[0].attention.out.weight.std().item()
    assert abs(std - 0.02 / 6**0.5) < 0.003, std
    ids, mask, features, boxes = batch()
    out = model(input_ids=ids, attention_mask=mask, region_features=features, region_boxes=boxes)
    assert out.last_hidden_state.shape == (2, 8, 32) and out.pooler_output.shape == (2, 32)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"encoder": "two-stream"}, "config.encoder='two-stream' (LXMERT) takes a BERT text tower only"),
        ({"region_embedding": "vl-bert"}, "config.region_embedding='vl-bert' adds the text's learned position table"),
        ({"modernbert": {"hidden_size": 64}}, "set model.hidden_size instead"),
        ({"modernbert": {"local_attention": 1}}, "config.modernbert: config.local_attention must be"),
    ],
)
def test_what_a_modernbert_tower_cannot_serve_is_refused_in_one_line(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        VLBertConfig(**TINY, text_tower="modernbert", **fields)
    assert "\n" not in str(e.value)


def test_a_bert_checkpoint_cannot_fill_a_modernbert_tower(minilm_dir):
    with pytest.raises(ValueError, match="learned absolute positions"):
        VLBertModel.from_pretrained(minilm_dir, config=VLBertConfig(**TINY, text_tower="modernbert"))
