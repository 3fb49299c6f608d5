"""The ModernBERT encoder and its masked-LM model.

Architecture: Warner et al. 2024 ("ModernBERT"), section 2.1, as transformers' ``ModernBertModel`` /
``ModernBertForMaskedLM`` compute it (``models/modernbert/modeling_modernbert.py`` at v5.24.0; same weights give
the same outputs: tests/published/test_modernbert_parity.py): word embeddings, LayerNorm and dropout (no position
table); pre-norm layers x += Attn(LN(x)); x += GeGLU(LN(x)) (the first layer's attention reads the embeddings'
norm directly), the attention rotating queries and keys by RoPE and, in local layers, attending within a
bidirectional sliding window; a final LayerNorm; no biases by default. The MLM head is dense, activation,
LayerNorm, then the tied word-embedding projection plus a bias.

Built from the library's layers as BERT is (:mod:`vlbert.models.bert`): one fused ``qkv`` projection read as
strided views, the layers on the unpadded tokens (:class:`~vlbert.layers.unpadded.Unpadding`, unpadded once, padded
once), attention an entry of :data:`~vlbert.layers.attention.ATTENTION_FUNCTIONS` (a local layer asks for a kernel
that takes a ``window``; one that does not falls back, with one log line), RoPE on the unpadded positions
(:mod:`vlbert.layers.rotary`), and with ``labels`` the vocabulary projection on masked positions only. Parameter
names are BERT's (encoder under ``bert.``) and map onto transformers' in :mod:`vlbert.modernbert_checkpoint`.
"""

from __future__ import annotations

import math

import torch
import torch.utils.checkpoint
from torch import nn

from vlbert.layers.activations import activation
from vlbert.layers.attention import ATTENTION_FUNCTIONS, check_attention_name
from vlbert.layers.kernels import Dropout
from vlbert.layers.losses import masked_lm_loss
from vlbert.layers.rotary import apply_rotary, rotary_angles, token_positions
from vlbert.layers.unpadded import Layout, Unpadding, unpadding
from vlbert.models.bert import BertEncoder, LayerNorm
from vlbert.models.inputs import check_text_inputs
from vlbert.models.outputs import EncoderOutput, PreTrainingOutput
from vlbert.models.pretrained import PreTrainedModel
from vlbert.modernbert_checkpoint import modernbert_from_hf, modernbert_to_hf
from vlbert.modernbert_config import ModernBertConfig


def _linear(n_in: int, n_out: int, bias: bool, std: float | None = None) -> nn.Linear:
    """``nn.Linear`` that remembers its initial standard deviation (``None``: the config's initializer_range)."""
    layer = nn.Linear(n_in, n_out, bias=bias)
    layer.init_std = std
    return layer


def _norm(config: ModernBertConfig) -> LayerNorm:
    return LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernBertEmbeddings(nn.Module):
    """Word embeddings, LayerNorm, dropout: ModernBERT's input (no position or segment table: positions enter as
    RoPE in every layer). Args of forward: input_ids int64 [B, T]. Returns float [B, T, H]."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = _norm(config)
        self.dropout = Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.norm(self.word_embeddings(input_ids)))


class ModernBertAttention(nn.Module):
    """Multi-head self-attention with RoPE on q and k, global or within a sliding window, with a fused ``qkv``
    projection read as strided views (as :class:`~vlbert.models.bert.SelfAttention`). Dropout
    ``attention_dropout`` on the probabilities and after the output projection (transformers' ``out_drop``)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        out_std = config.initializer_range / math.sqrt(2.0 * config.num_hidden_layers)
        self.qkv = _linear(config.hidden_size, 3 * config.hidden_size, config.attention_bias)
        self.out = _linear(config.hidden_size, config.hidden_size, config.attention_bias, out_std)
        self.dropout_p = config.attention_dropout
        self.dropout = Dropout(config.attention_dropout)

    def forward(
        self,
        x: torch.Tensor,
        unpadding: Unpadding,
        attention: str,
        rotary: tuple[torch.Tensor, torch.Tensor],
        window: int | None = None,
        attentions: list | None = None,
    ) -> torch.Tensor:
        """Args: x float [N, H] unpadded; attention: a key of ``ATTENTION_FUNCTIONS``; rotary: (cos, sin) float32
        [N, head_dim] of the tokens' positions; window: the positions each side a query sees (None: all);
        attentions: a list to append the probabilities [B, heads, S, S] to. Returns float [N, H]."""
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        extra = {} if window is None else {"window": window}
        y, probs = ATTENTION_FUNCTIONS[attention](
            q,
            k,
            v,
            unpadding=unpadding,
            dropout_p=self.dropout_p,
            training=self.training,
            output_attentions=attentions is not None,
            **extra,
        )
        if attentions is not None:
            attentions.append(probs)
        return self.dropout(self.out(y.reshape(n, self.num_heads * self.head_dim)))


class ModernBertLayer(nn.Module):
    """One pre-norm layer: x += Attn(LN(x)); x += W_o drop(act(W_a LN(x)) * W_g LN(x)) (GeGLU, Shazeer 2020: the
    input projection's first half is activated, its second half the gate). Layer 0 has no attention norm (the
    embeddings' norm precedes it)."""

    def __init__(self, config: ModernBertConfig, index: int):
        super().__init__()
        out_std = config.initializer_range / math.sqrt(2.0 * config.num_hidden_layers)
        self.attention_norm = _norm(config) if index else nn.Identity()
        self.attention = ModernBertAttention(config)
        self.ffn_norm = _norm(config)
        self.ffn_in = _linear(config.hidden_size, 2 * config.intermediate_size, config.mlp_bias)
        self.ffn_out = _linear(config.intermediate_size, config.hidden_size, config.mlp_bias, out_std)
        self.act = activation(config.hidden_activation)
        self.dropout = Dropout(config.mlp_dropout)
        self.window = config.window(index)
        self.theta = config.rope_theta(index)

    def forward(
        self, x: torch.Tensor, unpadding: Unpadding, kernels: dict, rotary: dict, attentions: list | None = None
    ) -> torch.Tensor:
        """Args: x float [N, H] unpadded; kernels: window (None for global) -> the kernel's name; rotary: theta ->
        (cos, sin) [N, head_dim]; attentions as :class:`ModernBertAttention`. Returns float [N, H]."""
        x = x + self.attention(
            self.attention_norm(x), unpadding, kernels[self.window], rotary[self.theta], self.window, attentions
        )
        value, gate = self.ffn_in(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.ffn_out(self.dropout(self.act(value) * gate))


class ModernBertEncoder(BertEncoder):
    """ModernBERT's layers and final norm on the unpadded tokens: :class:`~vlbert.models.bert.BertEncoder`'s layout
    and kernel choice (the collator's layout or one read from the mask; ``run_padded``; gradient checkpointing),
    with one kernel for the global layers and one for the local ones (the config's, or its fallback where it takes
    no window), and the RoPE angles of both thetas computed once per forward.

    ``hidden_states`` are transformers' L + 1: the embeddings, the first L - 1 layers' outputs, then the final
    norm's output (``last_hidden_state``).

    ``windows=False`` makes every layer attend globally, each keeping its RoPE base (the vision-language models'
    tower, :mod:`vlbert.models.text_towers`, says why)."""

    def __init__(self, config: ModernBertConfig, windows: bool = True):
        nn.Module.__init__(self)
        self.layers = nn.ModuleList(ModernBertLayer(config, i) for i in range(config.num_hidden_layers))
        if not windows:  # every layer global (a vision-language model's: see vlbert.models.text_towers)
            for layer in self.layers:
                layer.window = None
        self.final_norm = _norm(config)
        self.attn_implementation = config.attn_implementation
        check_attention_name(self.attn_implementation)
        self.gradient_checkpointing = config.gradient_checkpointing
        self.head_dim = config.head_dim
        self.attention_dropout = config.attention_dropout
        self.unpad = True

    def kernels(self, x: torch.Tensor, output_attentions: bool) -> dict:
        """window (None for the global layers) -> the kernel that runs those layers for hidden states ``x``."""
        return {w: self.select_attention(x, output_attentions, w) for w in {layer.window for layer in self.layers}}

    def layout(self, mask, b: int, s: int, kernels: dict, unpadding: Unpadding | None, device) -> Unpadding:
        """The layout every layer runs on (:meth:`BertEncoder.unpadding`): the unpadded tokens where a kernel reads
        ``cu_seqlens``; with ``unpad`` off each such kernel becomes ``sdpa`` (``kernels`` is updated)."""
        reading = [w for w, name in kernels.items() if ATTENTION_FUNCTIONS[name].layout == "unpadded"]
        decisive = kernels[reading[0]] if reading else next(iter(kernels.values()))
        layout, chosen = self.unpadding(mask, b, s, decisive, unpadding, device)
        if chosen != decisive:
            kernels.update({w: chosen for w in reading})
        return layout

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        unpadding: Unpadding | None = None,
        text_length: int | None = None,
    ) -> EncoderOutput:
        """Args and returns as :meth:`BertEncoder.forward`: x float [B, S, H] embeddings, mask [B, S] (1 = real) or
        None, the collator's ``unpadding`` or None; last_hidden_state [B, S, H] after the final norm (zeros at
        padding where the batch ran unpadded). ``text_length``: with regions after the text, T (columns T.. are
        regions, which RoPE then leaves unrotated: position 0 for all of them); None: every column is a token at
        its position. Raises ValueError for an unknown ``attn_implementation``."""
        b, s = x.shape[:2]
        kernels = self.kernels(x, output_attentions)
        unpadding = self.layout(mask, b, s, kernels, unpadding, x.device)
        positions = token_positions(unpadding)
        if text_length is not None:  # the regions: one position, 0 (no rotation), whatever their order
            positions = torch.where(positions < text_length, positions, 0)
        rotary = {t: rotary_angles(positions, self.head_dim, t) for t in {layer.theta for layer in self.layers}}
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        x = unpadding.unpad(x)
        if torch.is_autocast_enabled(x.device.type):  # the residual stream in the autocast dtype (see LayerNorm)
            x = x.to(torch.get_autocast_dtype(x.device.type))
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled() and attentions is None
        for layer in self.layers:
            if recompute:
                x = torch.utils.checkpoint.checkpoint(layer, x, unpadding, kernels, rotary, None, use_reentrant=False)
            else:
                x = layer(x, unpadding, kernels, rotary, attentions)
            if hidden_states is not None:
                hidden_states.append(unpadding.pad(x))
        last = unpadding.pad(self.final_norm(x))
        if hidden_states is not None:
            hidden_states[-1] = last
        return EncoderOutput(
            last_hidden_state=last,
            hidden_states=tuple(hidden_states) if hidden_states else None,
            attentions=tuple(attentions) if attentions is not None else None,
        )


def modernbert_init(module: nn.Module, config: ModernBertConfig) -> None:
    """Initialise ``module``'s own parameters as transformers' ``ModernBertPreTrainedModel._init_weights``: a
    Linear or Embedding from a normal truncated at ``initializer_cutoff_factor`` standard deviations (its
    ``init_std``, else ``initializer_range``) with zero bias, a LayerNorm as the identity, the MLM head's bias zero."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        std = getattr(module, "init_std", None) or config.initializer_range
        cut = config.initializer_cutoff_factor * std
        nn.init.trunc_normal_(module.weight, mean=0.0, std=std, a=-cut, b=cut)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, ModernBertMaskedLMHead) and module.bias is not None:
        nn.init.zeros_(module.bias)


class ModernBertPreTrainedModel(PreTrainedModel):
    """Base of the ModernBERT models: config, the key map onto transformers' names (``from_pretrained`` of a
    transformers ModernBERT directory, ``save_pretrained`` that transformers loads back), and ModernBERT's
    initialisation (transformers' ``ModernBertPreTrainedModel._init_weights``: truncated normals cut at
    ``initializer_cutoff_factor`` standard deviations: initializer_range for embeddings and input projections,
    initializer_range / sqrt(2 L) for output projections and the prediction head's dense layer, hidden_size^-0.5
    for a task classifier; LayerNorm = identity)."""

    config_class = ModernBertConfig
    base_model_prefix = "bert"
    architecture_name = "ModernBERT"

    def _init_module(self, module: nn.Module) -> None:
        modernbert_init(module, self.config)

    @classmethod
    def from_hf_state_dict(cls, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """transformers' ModernBERT names -> ours (:func:`~vlbert.modernbert_checkpoint.modernbert_from_hf`;
        refuses a checkpoint with learned absolute positions)."""
        return modernbert_from_hf(state)

    def hf_state_dict(self, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """This model's weights (or ``state_dict``, in its names: a sharded model's, gathered) under transformers'
        ModernBERT names (what ``save_pretrained`` writes)."""
        return modernbert_to_hf(self.state_dict() if state_dict is None else state_dict, self.base_model_prefix)


class ModernBertModel(ModernBertPreTrainedModel):
    """The ModernBERT encoder (transformers ``ModernBertModel``): embeddings, layers, final norm; no pooler.
    ``from_pretrained`` reads any transformers ModernBERT directory, with or without heads."""

    base_model_prefix = ""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.embeddings = ModernBertEmbeddings(config)
        self.encoder = ModernBertEncoder(config)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        layout: Layout = None,
    ) -> EncoderOutput:
        """Encode a batch of token sequences.

        Args:
            input_ids: int64 [B, T] (ModernBERT's tokenizer: [CLS] ... [SEP]).
            attention_mask: [B, T], 1 for real tokens, 0 for padding (default all 1).
            token_type_ids: accepted for the library's text batches and not read: ModernBERT has no segment
                embeddings (a pair is [CLS] A [SEP] B [SEP], told apart by the separator alone).
            output_hidden_states, output_attentions: as :meth:`vlbert.BertModel.forward` (hidden states as
                :class:`ModernBertEncoder` says).
            layout: the collator's unpadded layout of ``attention_mask`` (no host sync), or None.
        Returns:
            :class:`~vlbert.models.outputs.EncoderOutput`: last_hidden_state float [B, T, H] (pooler_output None).
        Raises:
            ValueError: inputs of the wrong rank, dtype or shape, T > max_position_embeddings, ids outside the
                vocabulary, or a layout that does not describe ``attention_mask``.
        """
        check_text_inputs(self.config, input_ids, None, attention_mask)
        x = self.embeddings(input_ids)
        return self.encoder(
            x, attention_mask, output_hidden_states, output_attentions, unpadding(layout, attention_mask)
        )

    def idle_modules(self, masked_regions: torch.Tensor | None = None) -> list[nn.Module]:
        """Submodules a forward leaves without gradient: none."""
        return []


class ModernBertPredictionHead(nn.Module):
    """dense, activation, LayerNorm (``classifier_bias``, ``classifier_activation``, ``norm_bias``): transformers'
    ``ModernBertPredictionHead``, before the MLM decoder and the task classifiers. float [..., H] -> [..., H]."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        out_std = config.initializer_range / math.sqrt(2.0 * config.num_hidden_layers)
        self.dense = _linear(config.hidden_size, config.hidden_size, config.classifier_bias, out_std)
        self.act = activation(config.classifier_activation)
        self.norm = _norm(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(hidden)))


class ModernBertMaskedLMHead(ModernBertPredictionHead):
    """The prediction head, then the projection tied to the word embeddings plus ``bias`` (``decoder_bias``; None
    without). The head interface :func:`~vlbert.layers.losses.masked_lm_loss` calls, as BERT's
    :class:`~vlbert.layers.pretraining_heads.MaskedLMHead`; ``padded`` is accepted and does nothing (ModernBERT's
    vocabulary, 50,368, is already a multiple of 64)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.decoder_bias else None

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor, padded: bool = False) -> torch.Tensor:
        """Args: hidden float [..., H]; word_embeddings float [V, H]. Returns logits float [..., V]."""
        return nn.functional.linear(super().forward(hidden), word_embeddings, self.bias)


class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    """ModernBERT with its masked-LM head (transformers ``ModernBertForMaskedLM``; MLM only, no NSP: Warner et al.
    2024 section 2.2). ``save_pretrained(dir)`` writes a directory ``transformers.ModernBertForMaskedLM`` loads
    with no missing or unexpected keys; ``from_pretrained`` reads one it wrote."""

    objectives = ("mlm",)

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.bert = ModernBertModel(config)
        self.head = ModernBertMaskedLMHead(config)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        masked_lm_positions: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        layout: Layout = None,
    ) -> PreTrainingOutput:
        """Run the encoder and the MLM head.

        Args:
            input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions, layout: as
                :meth:`ModernBertModel.forward`.
            labels: int64 [B, T], the original id at masked positions and -100 elsewhere; with them the logits are
                computed at masked positions only.
            masked_lm_positions: int64 [N], the masked positions' flat indices (row * T + column) as the collator
                computed them (no host sync), or None.
        Returns:
            :class:`~vlbert.models.outputs.PreTrainingOutput`: ``prediction_logits`` float [B, T, V] without labels
            (transformers' ``logits``), [N, V] over the masked positions with them, plus ``losses["mlm"]`` and
            ``metrics["mlm_accuracy"]``; last_hidden_state, hidden_states, attentions.
        Raises:
            ValueError: as :meth:`ModernBertModel.forward`.
        """
        enc = self.bert(
            input_ids,
            attention_mask,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            layout=layout,
        )
        out = PreTrainingOutput(
            last_hidden_state=enc.last_hidden_state, hidden_states=enc.hidden_states, attentions=enc.attentions
        )
        words = self.bert.embeddings.word_embeddings.weight
        if labels is None:
            out.prediction_logits = self.head(enc.last_hidden_state, words)
            return out
        loss, logits, accuracy, count = masked_lm_loss(
            self.head, words, enc.last_hidden_state, labels, masked_lm_positions
        )
        out.add("mlm", loss, "mlm_accuracy", accuracy, count)
        out.prediction_logits = logits
        return out


__all__ = [
    "ModernBertModel",
    "ModernBertForMaskedLM",
    "ModernBertPreTrainedModel",
    "ModernBertEncoder",
    "ModernBertLayer",
    "ModernBertAttention",
    "ModernBertEmbeddings",
    "ModernBertPredictionHead",
    "ModernBertMaskedLMHead",
    "modernbert_init",
]
