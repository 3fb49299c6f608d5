"""The BERT encoder and its pretraining heads.

Architecture: Devlin et al. 2019 ("BERT"), section 3 and appendix A: token + learned position + segment embeddings,
a post-LayerNorm Transformer encoder (Vaswani et al. 2017), a tanh pooler on [CLS], a masked-LM head whose output
projection is tied to the word embeddings, and a 2-way next-sentence head on the pooled output. Numerically it is
transformers' ``BertModel`` / ``BertForPreTraining`` (same weights give the same outputs; see
tests/published/test_parity_transformers.py); the parameter names are our own and map onto Hugging Face's in
:mod:`vlbert.checkpoint`.

Differences from transformers, all for speed and none visible in the numbers:
  * query/key/value are one fused ``qkv`` projection, read by the attention kernel as strided views (no copies);
  * the layers run on the unpadded real tokens [N, H] (:class:`~vlbert.layers.unpadded.Unpadding`: unpadded once
    before the first layer, padded once after the last), and attention is an entry of
    :data:`~vlbert.layers.attention.ATTENTION_FUNCTIONS` (``config.attn_implementation``: eager, sdpa, varlen);
  * under bf16/fp16 autocast the residual stream and LayerNorm stay in that precision (:class:`LayerNorm`);
  * with ``labels``, MLM logits are computed on masked positions only (never [B, T, vocab_size]).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from vlbert.config import BertConfig
from vlbert.layers.activations import activation
from vlbert.layers.attention import ATTENTION_FUNCTIONS, AttentionRequest, check_attention_name, select_attention
from vlbert.layers.kernels import Dropout
from vlbert.layers.unpadded import Layout, Unpadding, pop_legacy_layout, unpadding
from vlbert.models.inputs import check_text_inputs
from vlbert.models.objective_units import UnitPreTrainingModel
from vlbert.models.outputs import EncoderOutput, PreTrainingOutput
from vlbert.models.pretrained import PreTrainedModel
from vlbert.objectives import Encoded


class BertEmbeddings(nn.Module):
    """Input embeddings: word + learned absolute position + segment (token type), then LayerNorm and dropout.

    Source: BERT paper section 3.2, figure 2; transformers ``BertEmbeddings``.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Args: input_ids int64 [B, T]; token_type_ids int64 [B, T] (0 = segment A, default all 0).
        Returns: float [B, T, H]."""
        seq_len = input_ids.shape[1]
        positions = torch.arange(seq_len, device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.norm(x))


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters and state dict) that keeps a bf16/fp16 input in its precision under
    autocast, where autocast would compute and return float32: the residual stream then stays in the autocast
    dtype from the embeddings to the last layer (MosaicBERT's low-precision LayerNorm; statistics are still
    accumulated in float32 inside the kernel). Outside autocast, and for float32 inputs, it is ``nn.LayerNorm``.

    Args of forward: x float [..., H]. Returns the same shape and dtype.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in (torch.bfloat16, torch.float16) and torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                bias = None if self.bias is None else self.bias.to(x.dtype)  # (ModernBERT's norms have none)
                return F.layer_norm(x, self.normalized_shape, self.weight.to(x.dtype), bias, self.eps)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention (Vaswani et al. 2017, section 3.2) with a fused QKV projection.

    The [N, 3H] projection is viewed as [N, 3, heads, head_dim] and q, k, v are its three strided slices: the
    kernel (an entry of :data:`~vlbert.layers.attention.ATTENTION_FUNCTIONS`) reads them in place, and their
    gradients are stacked back contiguously (no permuted copies, forward or backward).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(
        self, x: torch.Tensor, unpadding: Unpadding, attention: str = "sdpa", attentions: list | None = None
    ) -> torch.Tensor:
        """Args: x float [N, H], the unpadded tokens that ``unpadding`` describes; attention: a key of
        ``ATTENTION_FUNCTIONS``; attentions: a list to append this layer's attention probabilities to (float
        [B, heads, S, S], after dropout, rows of padded queries included; computed by the ``eager`` kernel).
        Returns float [N, H] (after the output projection, before dropout and residual)."""
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)
        y, probs = ATTENTION_FUNCTIONS[attention](
            q,
            k,
            v,
            unpadding=unpadding,
            dropout_p=self.dropout_p,
            training=self.training,
            output_attentions=attentions is not None,
        )
        if attentions is not None:
            attentions.append(probs)
        return self.out(y.reshape(n, self.num_heads * self.head_dim))  # (n may be 0: a stream with no token)


class BertLayer(nn.Module):
    """One post-LN Transformer encoder layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)) (BERT section 3)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.ffn_norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.act = activation(config.hidden_act)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(
        self, x: torch.Tensor, unpadding: Unpadding, attention: str = "sdpa", attentions: list | None = None
    ) -> torch.Tensor:
        """Args: x float [N, H] unpadded; unpadding, attention, attentions as :class:`SelfAttention`.
        Returns float [N, H]."""
        x = self.attention_norm(x + self.dropout(self.attention(x, unpadding, attention, attentions)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(self.act(self.ffn_in(x)))))


class BertEncoder(nn.Module):
    """A stack of ``num_hidden_layers`` :class:`BertLayer`; shared by the text and vision-language models.

    The layers run on unpadded tokens (:class:`~vlbert.layers.unpadded.Unpadding`): the batch is unpadded once before
    the first layer and padded once after the last, so projections, feed-forward and LayerNorm never compute a
    padded row; real positions get exactly the values of the padded computation and padded positions come out as
    zeros. The layout comes from the collator (:class:`~vlbert.layers.unpadded.UnpaddedLayout`: no host sync) or is
    read from the mask here (one ``nonzero``). With the padded kernels (``sdpa``, ``eager``) and less than
    ``min_padding_to_unpad`` (5%) padding the batch runs as is (the per-layer gathers would cost more than the
    padded rows they save: docs/performance.md), padded positions then carry
    values nothing reads, as in transformers. ``unpad = False`` keeps every position computed (a head whose loss
    reads padded positions); it implies a padded kernel.
    """

    min_padding_to_unpad = 0.05

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.attn_implementation = getattr(config, "attn_implementation", None)
        check_attention_name(self.attn_implementation)
        self.gradient_checkpointing = getattr(config, "gradient_checkpointing", False)
        self.head_dim = config.head_dim
        self.attention_dropout = config.attention_probs_dropout_prob
        self.unpad = True

    def select_attention(self, x: torch.Tensor, output_attentions: bool = False, window: int | None = None) -> str:
        """The kernel this forward runs (:func:`~vlbert.layers.attention.select_attention`): the config's
        ``attn_implementation`` where it can run hidden states ``x`` (its device, its compute dtype under
        autocast, this model's head size and attention dropout, and ``window``, a local layer's sliding window),
        else its fallback, said once in the log."""
        device = x.device
        dtype = (
            torch.get_autocast_dtype(device.type)
            if (torch.is_autocast_enabled(device.type) and x.dtype == torch.float32)
            else x.dtype
        )
        request = AttentionRequest(
            device, dtype, self.head_dim, self.attention_dropout if self.training else 0.0, output_attentions, window
        )
        return select_attention(self.attn_implementation, request)

    def unpadding(
        self,
        mask: torch.Tensor | None,
        batch: int,
        seq: int,
        attention: str,
        unpadding: Unpadding | None = None,
        device=None,
    ) -> tuple[Unpadding, str]:
        """The layout the layers run on and the kernel that runs it (see the class docstring): a kernel
        declared ``unpadded`` (:class:`~vlbert.layers.attention.AttentionKernel`) always gets the unpadded tokens;
        a ``padded`` one gets a dense batch when padding is under :attr:`min_padding_to_unpad`."""
        reads_cu_seqlens = ATTENTION_FUNCTIONS[attention].layout == "unpadded"
        if not self.unpad:
            return Unpadding.dense(batch, seq, device, mask), "sdpa" if reads_cu_seqlens else attention
        if unpadding is None:
            unpadding = Unpadding.from_mask(mask, batch, seq, device)
        if (
            not reads_cu_seqlens
            and unpadding.mask is not None
            and unpadding.num_tokens > (1 - self.min_padding_to_unpad) * batch * seq
        ):
            unpadding = Unpadding.dense(batch, seq, device, unpadding.mask)
        return unpadding, attention

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        unpadding: Unpadding | None = None,
    ) -> EncoderOutput:
        """Args: x float [B, S, H] embeddings; mask [B, S] (1 = real) or None; unpadding: where the real positions
        are, when the collator computed it (else read from ``mask``).
        Returns: :class:`EncoderOutput` with last_hidden_state [B, S, H] (in the autocast dtype under autocast),
        and when asked the L + 1 hidden states (the input first) and the L attention probabilities
        [B, heads, S, S] (no pooler). With ``gradient_checkpointing`` (config; training only) each layer's
        activations are recomputed in the backward instead of kept (``torch.utils.checkpoint``, non-reentrant,
        random state preserved: the same dropout masks, the same gradients).
        Raises: ValueError for an unknown ``attn_implementation``."""
        b, s = x.shape[:2]
        attention = self.select_attention(x, output_attentions)
        unpadding, attention = self.unpadding(mask, b, s, attention, unpadding, x.device)
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        x = unpadding.unpad(x)
        if torch.is_autocast_enabled(x.device.type):  # the residual stream in the autocast dtype (see LayerNorm)
            x = x.to(torch.get_autocast_dtype(x.device.type))
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled() and attentions is None
        for layer in self.layers:
            if recompute:
                x = torch.utils.checkpoint.checkpoint(layer, x, unpadding, attention, None, use_reentrant=False)
            else:
                x = layer(x, unpadding, attention, attentions)
            if hidden_states is not None:
                hidden_states.append(unpadding.pad(x))
        return EncoderOutput(
            last_hidden_state=unpadding.pad(x),
            hidden_states=tuple(hidden_states) if hidden_states else None,
            attentions=tuple(attentions) if attentions is not None else None,
        )


@contextlib.contextmanager
def run_padded(encoder: nn.Module):
    """Inside, every :class:`BertEncoder` of ``encoder`` (itself, or LXMERT's text and region streams) runs every
    forward on the padded batch with its mask (``unpad = False``: a padded attention kernel, no unpadding read from
    the mask), for a batch whose layout the host cannot know without waiting for the device (rows drawn on the
    device: hard negatives); a module without such encoders is left as it is."""
    encoders = [m for m in encoder.modules() if isinstance(getattr(m, "unpad", None), bool)]
    previous = [m.unpad for m in encoders]
    for m in encoders:
        m.unpad = False
    try:
        yield
    finally:
        for m, unpad in zip(encoders, previous, strict=True):
            m.unpad = unpad


def compile_model(model: nn.Module, **options) -> nn.Module:
    """``torch.compile`` the whole model in place (``nn.Module.compile``: parameter names and checkpoints are
    unchanged), with dynamic shapes since unpadded batches vary in length. With the collator's unpadded layout and
    masked positions the training forward is one graph (tests/gpu/test_gpu_step.py): inductor then fuses bias + GELU
    and dropout + residual + LayerNorm, which the eager step cannot. Off by default (``training.compile``): on a
    CPU compiled layers were slower than eager (docs/performance.md).
    ``options`` go to ``torch.compile`` (default ``dynamic=True``). Returns ``model``.
    """
    model.compile(**{"dynamic": True, **options})
    return model


class BertPooler(nn.Module):
    """tanh(W h_[CLS] + b): the sentence summary used by NSP and sequence classification (BERT section 3)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, last_hidden_state: torch.Tensor) -> torch.Tensor:
        """Args: float [B, S, H]. Returns float [B, H]."""
        return torch.tanh(self.dense(last_hidden_state[:, 0]))


class BertModel(PreTrainedModel):
    """The BERT encoder: embeddings, Transformer layers and pooler (transformers ``BertModel``).

    Load weights with ``BertModel.from_pretrained(dir_or_hub_name)``: any Hugging Face BERT checkpoint works,
    with or without pretraining heads.
    """

    config_class = BertConfig

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = self.build_embeddings(config)
        self.add_inputs(config)
        self.encoder = self.build_encoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def build_embeddings(self, config: BertConfig) -> nn.Module:
        """The text embeddings: :class:`BertEmbeddings` (a vision-language model's text tower picks its own)."""
        return BertEmbeddings(config)

    def add_inputs(self, config: BertConfig) -> None:
        """Build the input pathways besides the word embeddings (before the encoder, so parameters keep their
        order): none for text; :class:`~vlbert.models.vl.VLBertModel` adds its region pathway here."""

    def build_encoder(self, config: BertConfig) -> nn.Module:
        """The encoder: a :class:`BertEncoder` (a vision-language model picks its own from its config)."""
        return BertEncoder(config)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        layout: Layout = None,
    ) -> EncoderOutput:
        """Encode a batch of wordpiece sequences.

        Args:
            input_ids: int64 [B, T], wordpiece ids starting with [CLS].
            token_type_ids: int64 [B, T], 0 for segment A, 1 for segment B (default all 0).
            attention_mask: [B, T], 1 for real tokens, 0 for padding (default all 1).
            output_hidden_states: also return the L + 1 per-layer hidden states.
            output_attentions: also return each layer's attention probabilities [B, heads, T, T] (as
                transformers' eager attention; computed explicitly, so slower than the fused kernel).
            layout: optionally the unpadded layout of ``attention_mask`` as the collator computed it
                (:func:`~vlbert.layers.unpadded.unpadded_layout`), so the model never reads the mask on the device;
                as transformers passes FlashAttention's ``cu_seq_lens``.
        Returns:
            :class:`EncoderOutput` with last_hidden_state [B, T, H] and pooler_output [B, H].
        Raises:
            ValueError: wrong rank/dtype, mismatched shapes, T > max_position_embeddings, or a layout that does not
                describe ``attention_mask``.
        """
        check_text_inputs(self.config, input_ids, token_type_ids, attention_mask)
        x = self.embeddings(input_ids, token_type_ids)
        out = self.encoder(
            x, attention_mask, output_hidden_states, output_attentions, unpadding(layout, attention_mask)
        )
        out.pooler_output = self.pooler(out.last_hidden_state) if self.pooler is not None else None
        return out

    def idle_modules(self, masked_regions: torch.Tensor | None = None) -> list[nn.Module]:
        """Submodules a forward leaves without gradient: none for text (a vision-language model's region pathway
        declares its own, :meth:`~vlbert.models.vl.VLBertModel.idle_modules`)."""
        return []


class BertForPreTraining(UnitPreTrainingModel):
    """BERT with its pretraining objectives: the text units of :data:`~vlbert.objectives.OBJECTIVES`
    (``units_for("text")``, built and run by :class:`~vlbert.models.objective_units.UnitPreTrainingModel`, the loop
    :class:`~vlbert.models.vl.VLBertForPreTraining` shares): masked LM (``labels``; head ``masked_lm``, tied to
    the word embeddings), next-sentence prediction (``next_sentence_label``; head ``next_sentence``, BERT section
    3.1), and the heads' other users: whole-word masking (``wwm_labels``) and ALBERT's sentence-order prediction
    (``sentence_order_label``). A batch trains the units whose labels it carries: ``loss`` = their sum, so MLM +
    NSP is transformers' ``BertForPreTraining`` loss, MLM alone RoBERTa's. ``save_pretrained(dir)`` writes a
    directory that ``transformers.BertForPreTraining.from_pretrained(dir)`` loads with no missing or unexpected
    keys.
    """

    config_class = BertConfig
    base_model_prefix = "bert"
    modality = "text"

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.build_units(config)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        layout: Layout = None,
        **labels,
    ) -> PreTrainingOutput:
        """Run BERT and the units whose labels are given.

        Args:
            input_ids, token_type_ids, attention_mask: as :meth:`BertModel.forward`, [B, T].
            output_hidden_states, output_attentions: also return per-layer hidden states / attention probabilities.
            layout: the collator's unpadded layout (:meth:`BertModel.forward`).
            labels: the units' label keys (:attr:`label_names`): ``labels`` int64 [B, T] (the original id at
                masked positions, -100 elsewhere) with optionally ``masked_lm_positions`` int64 [N] (their flat
                positions row * T + column, the collator's: no host sync); ``next_sentence_label`` int64 [B]
                (0 = B follows A, 1 = B is random); ``sentence_order_label``, ``wwm_labels`` for those units.
        Returns:
            :class:`PreTrainingOutput`; ``losses``/``metrics`` carry e.g. ``mlm``/``mlm_accuracy`` and
            ``nsp``/``nsp_accuracy`` for whichever labels were given, ``loss`` their sum. With MLM labels
            ``prediction_logits`` is [N, V] over the N masked positions only; with no labels at all every head's
            logits: ``prediction_logits`` [B, T, V] and ``seq_relationship_logits`` [B, 2].
        Raises:
            TypeError: a keyword no unit reads. ValueError: as :meth:`BertModel.forward`.
        """
        layout = pop_legacy_layout(layout, labels)
        given = self.given_labels(labels)
        enc = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions, layout)
        out = PreTrainingOutput(
            last_hidden_state=enc.last_hidden_state,
            pooler_output=enc.pooler_output,
            hidden_states=enc.hidden_states,
            attentions=enc.attentions,
        )
        encoded = Encoded(
            self,
            enc.last_hidden_state,
            None,
            enc.pooler_output,
            attention_mask,
            word_embeddings=self.bert.embeddings.word_embeddings.weight,
        )
        return self.run_units(out, encoded, given)


__all__ = [
    "BertModel",
    "BertForPreTraining",
    "BertEmbeddings",
    "BertEncoder",
    "BertLayer",
    "SelfAttention",
    "BertPooler",
    "LayerNorm",
    "compile_model",
]
