"""The two-stream encoder of LXMERT (Tan and Bansal 2019, section 2.2): ``l_layers`` language layers over the text,
``r_layers`` object-relationship layers over the regions, then ``x_layers`` cross-modality layers in which each
stream first attends to the other through *one shared* cross-attention module, then to itself, then runs its own
feed-forward network.

Built from the single-stream encoder's blocks: every self-attention + FFN sub-layer is a
:class:`~vlbert.models.bert.BertLayer` (the same unpadded layout, the same attention table
``config.attn_implementation``, the same gradient checkpointing), each stream unpadded by its own layout
(:class:`~vlbert.layers.unpadded.Unpadding`: the collator's, :class:`~vlbert.layers.unpadded.StreamLayouts`,
else read from the stream's mask). The cross-attention core runs the same kernel on the two layouts (queries of
one stream, keys and values of the other: the table's ``kv_unpadding``; flash varlen attention with
``cu_seqlens_q`` != ``cu_seqlens_k`` on CUDA in bf16).

Source: airsplay/lxmert@827087b ``src/lxrt/modeling.py`` (``LXRTEncoder``, ``LXRTXLayer``, ``BertCrossattLayer``);
transformers ``LxmertEncoder`` / ``LxmertXLayer``, whose outputs these equal with the same weights (tests/
test_lxmert.py).
"""

from __future__ import annotations

import copy

import torch
import torch.utils.checkpoint
from torch import nn

from vlbert.config import VLBertConfig
from vlbert.layers.attention import ATTENTION_FUNCTIONS
from vlbert.layers.kernels import Dropout
from vlbert.layers.unpadded import Layout, StreamLayouts, UnpaddedLayout, Unpadding
from vlbert.models.bert import BertEncoder, BertLayer, LayerNorm
from vlbert.models.outputs import EncoderOutput


class CrossAttention(nn.Module):
    """Post-LN cross-attention sub-layer: x = LN(x + W_o Attn(W_q x, W_kv context)) (airsplay/lxmert
    ``BertCrossattLayer``: ``att`` = ``BertAttention`` with separate query/key/value, ``output`` = dense + dropout +
    LayerNorm). LXMERT uses one instance for both directions (text -> regions and regions -> text).

    Parameters: ``query`` Linear(H, H), ``kv`` Linear(H, 2H) (key then value, fused), ``out`` Linear(H, H),
    ``norm`` LayerNorm(H).
    """

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        h = config.hidden_size
        self.query = nn.Linear(h, h)
        self.kv = nn.Linear(h, 2 * h)
        self.out = nn.Linear(h, h)
        self.norm = LayerNorm(h, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(
        self,
        x: torch.Tensor,
        x_unpadding: Unpadding,
        context: torch.Tensor,
        context_unpadding: Unpadding,
        attention: str = "sdpa",
        attentions: list | None = None,
    ) -> torch.Tensor:
        """Args: x float [N_q, H] unpadded queries of one stream (``x_unpadding``); context float [N_k, H] unpadded
        positions of the other stream (``context_unpadding``, whose mask is the key mask); attention: the kernel
        (a key of :data:`~vlbert.layers.attention.ATTENTION_FUNCTIONS`; one not declared ``cross_attention``
        gives way to ``sdpa``); attentions: a list to append the probabilities [B, heads, S_q, S_k] to (after
        dropout; padded keys get 0). Returns float [N_q, H]. A row whose context has no real position (every
        region masked out, as the "without regions" baselines do) gets a zero attention output."""
        q = self.query(x).view(-1, self.num_heads, self.head_dim)
        k, v = self.kv(context).view(-1, 2, self.num_heads, self.head_dim).unbind(1)
        kernel = attention if ATTENTION_FUNCTIONS[attention].cross_attention else "sdpa"
        y, probs = ATTENTION_FUNCTIONS[kernel](
            q,
            k,
            v,
            unpadding=x_unpadding,
            dropout_p=self.dropout_p,
            training=self.training,
            output_attentions=attentions is not None,
            kv_unpadding=context_unpadding,
        )
        if attentions is not None:
            attentions.append(probs)
        return self.norm(x + self.dropout(self.out(y.reshape(x.shape[0], self.num_heads * self.head_dim))))


class CrossModalityLayer(nn.Module):
    """LXMERT's cross-modality layer (``LXRTXLayer``): both streams attend to each other through the one shared
    :class:`CrossAttention` (each reading the other's *input* states), then each runs a :class:`BertLayer`
    (self-attention + FFN) of its own: ``text_layer`` (``lang_self_att``, ``lang_inter``, ``lang_output``) and
    ``region_layer`` (``visn_*``)."""

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.cross_attention = CrossAttention(config)
        self.text_layer = BertLayer(config)
        self.region_layer = BertLayer(config)

    def forward(
        self,
        text: torch.Tensor,
        regions: torch.Tensor,
        text_unpadding: Unpadding,
        region_unpadding: Unpadding,
        attention: str = "sdpa",
        attentions: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Args: text [N_t, H], regions [N_r, H] unpadded by their unpaddings; attention: the kernel of the self-
        and cross-attention;
        attentions: lists by name (``text``, ``regions``, ``cross``, ``region_cross``) to append probabilities to.
        Returns (text [N_t, H], regions [N_r, H])."""
        a = attentions or {}
        text2 = self.cross_attention(text, text_unpadding, regions, region_unpadding, attention, a.get("cross"))
        regions2 = self.cross_attention(
            regions, region_unpadding, text, text_unpadding, attention, a.get("region_cross")
        )
        return (
            self.text_layer(text2, text_unpadding, attention, a.get("text")),
            self.region_layer(regions2, region_unpadding, attention, a.get("regions")),
        )


def _pad(unpadding: Unpadding, x: torch.Tensor) -> torch.Tensor:
    """[N, H] -> [B, S, H] with zeros at padding, also where the stream ran dense (its padded rows computed)."""
    out = unpadding.pad(x)
    if unpadding.indices is None and unpadding.mask is not None:
        out = out.masked_fill(~unpadding.mask[..., None], 0.0)
    return out


class TwoStreamEncoder(nn.Module):
    """``text``: a :class:`BertEncoder` of ``l_layers`` layers (LXMERT's ``layer``), ``regions``: one of
    ``r_layers`` (``r_layers``), then ``cross_layers``: ``x_layers`` :class:`CrossModalityLayer` (``x_layers``).
    The two :class:`BertEncoder` lend their layers, their kernel choice and their unpadding rule; this class runs
    them, each stream unpadded once before its first layer and padded once after the last."""

    def __init__(self, config: VLBertConfig):
        super().__init__()
        text, regions = copy.copy(config), copy.copy(config)
        text.num_hidden_layers, regions.num_hidden_layers = config.l_layers, config.r_layers
        self.text = BertEncoder(text)
        self.regions = BertEncoder(regions)
        self.cross_layers = nn.ModuleList(CrossModalityLayer(config) for _ in range(config.x_layers))

    def _run(self, layer, *args):
        """One layer, recomputed in the backward under ``gradient_checkpointing`` (as :class:`BertEncoder`)."""
        if self.text.gradient_checkpointing and self.training and torch.is_grad_enabled() and args[-1] is None:
            return torch.utils.checkpoint.checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def _unpadding(
        self,
        stream: BertEncoder,
        mask,
        batch: int,
        seq: int,
        attention: str,
        device,
        dense: bool,
        given: Unpadding | None,
    ) -> tuple[Unpadding, str]:
        """A stream's layout and kernel: :meth:`BertEncoder.unpadding` of the collator's layout ``given`` (no host
        sync), else ``dense`` (every position computed, padding masked: no host sync; a kernel declared
        ``unpadded`` gives way to ``sdpa``, as ``BertEncoder.unpad = False`` does), else read from the mask (one
        ``nonzero``)."""
        if dense and given is None:
            return Unpadding.dense(batch, seq, device, mask), (
                "sdpa" if ATTENTION_FUNCTIONS[attention].layout == "unpadded" else attention
            )
        return stream.unpadding(mask, batch, seq, attention, given, device)

    def _unpaddings(self, text, regions, text_mask, region_mask, layout: Layout, output_attentions: bool):
        """(text :class:`Unpadding`, region :class:`Unpadding`, kernel) of a forward (arguments as :meth:`forward`):
        the kernel the config names where it can run, each stream on its :class:`StreamLayouts` entry, padded for a
        joint :class:`UnpaddedLayout`, else read from its mask (:meth:`_unpadding`)."""
        (b, t), r = text.shape[:2], regions.shape[1]
        dense = isinstance(layout, UnpaddedLayout)
        given = (None, None)
        if isinstance(layout, StreamLayouts):
            given = (layout.text.unpadding(text_mask), layout.regions.unpadding(region_mask))
        attention = self.text.select_attention(text, output_attentions)
        text_unpadding, attention = self._unpadding(self.text, text_mask, b, t, attention, text.device, dense, given[0])
        region_unpadding, attention = self._unpadding(
            self.regions, region_mask, b, r, attention, text.device, dense, given[1]
        )
        return text_unpadding, region_unpadding, attention

    def forward(
        self,
        text: torch.Tensor,
        regions: torch.Tensor,
        text_mask: torch.Tensor | None,
        region_mask: torch.Tensor | None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        layout: Layout = None,
    ) -> EncoderOutput:
        """Args: text float [B, T, H] and regions float [B, R, H] (their embeddings); text_mask [B, T], region_mask
        [B, R] (1 = real; None = all real).
        Returns :class:`EncoderOutput`: last_hidden_state [B, T + R, H] (text rows, then region rows; padding
        zero), ``text_hidden_states`` (1 + l_layers + x_layers states [B, T, H]: embeddings, language layers,
        cross layers) and ``region_hidden_states`` (1 + r_layers + x_layers, [B, R, H]) when asked, and
        ``hidden_states`` = the joint [B, T + R, H] states after the embeddings and each cross layer; with
        ``output_attentions`` ``text_attentions`` [B, heads, T, T] (language then cross layers),
        ``region_attentions`` [B, heads, R, R], ``cross_attentions`` (text queries over regions, [B, heads, T, R],
        transformers' ``cross_encoder_attentions``) and ``region_cross_attentions`` ([B, heads, R, T]).
        ``layout``: the collator's :class:`~vlbert.layers.unpadded.StreamLayouts`
        (:func:`~vlbert.layers.unpadded.stream_layouts`): each stream runs on its own with no host sync, on the
        config's kernel (flash varlen on CUDA in bf16), cross-attention included. Given the single-stream
        :class:`~vlbert.layers.unpadded.UnpaddedLayout` of [text ; regions], which the streams cannot use, both run
        padded (no host sync, an ``unpadded`` kernel gives way to ``sdpa``); given None, each is unpadded by its mask
        (one ``nonzero``).
        Raises ValueError: a stream's layout does not describe its mask."""
        text_unpadding, region_unpadding, attention = self._unpaddings(
            text, regions, text_mask, region_mask, layout, output_attentions
        )
        lists = {k: [] for k in ("text", "regions", "cross", "region_cross")} if output_attentions else None
        states = {"text": [text], "regions": [regions]} if output_hidden_states else None
        x, y = text_unpadding.unpad(text), region_unpadding.unpad(regions)
        if torch.is_autocast_enabled(x.device.type):  # the residual stream in the autocast dtype (BertEncoder)
            x, y = (z.to(torch.get_autocast_dtype(x.device.type)) for z in (x, y))
        for layer in self.text.layers:
            x = self._run(layer, x, text_unpadding, attention, lists and lists["text"])
            if states:
                states["text"].append(_pad(text_unpadding, x))
        for layer in self.regions.layers:
            y = self._run(layer, y, region_unpadding, attention, lists and lists["regions"])
            if states:
                states["regions"].append(_pad(region_unpadding, y))
        for layer in self.cross_layers:
            x, y = self._run(layer, x, y, text_unpadding, region_unpadding, attention, lists)
            if states:
                states["text"].append(_pad(text_unpadding, x))
                states["regions"].append(_pad(region_unpadding, y))
        out = EncoderOutput(last_hidden_state=torch.cat([_pad(text_unpadding, x), _pad(region_unpadding, y)], 1))
        if states:
            k = 1 + len(self.text.layers)
            m = 1 + len(self.regions.layers)
            out.text_hidden_states, out.region_hidden_states = tuple(states["text"]), tuple(states["regions"])
            out.hidden_states = (torch.cat([text, regions], 1),) + tuple(
                torch.cat(pair, 1) for pair in zip(states["text"][k:], states["regions"][m:], strict=True)
            )
        if lists:
            out.text_attentions, out.region_attentions = tuple(lists["text"]), tuple(lists["regions"])
            out.cross_attentions, out.region_cross_attentions = tuple(lists["cross"]), tuple(lists["region_cross"])
        return out


__all__ = ["TwoStreamEncoder", "CrossModalityLayer", "CrossAttention"]
