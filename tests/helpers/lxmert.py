"""LXMERT's test sizes (small and base-width), shared by the LXMERT and reliability tests."""

from __future__ import annotations

LXMERT_SIZES = {
    "small": dict(
        vocab_size=90,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=40,
        l_layers=2,
        r_layers=1,
        x_layers=2,
        visual_feat_dim=24,
        num_qa_labels=7,
        num_object_labels=6,
        num_attr_labels=5,
        max_position_embeddings=64,
    ),
    "base": dict(
        vocab_size=300,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        l_layers=1,
        r_layers=1,
        x_layers=1,
        visual_feat_dim=2048,
        num_qa_labels=11,
        num_object_labels=1600,
        num_attr_labels=400,
    ),
}
