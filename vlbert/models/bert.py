"""The BERT encoder and its pretraining heads.

Architecture: Devlin et al. 2019 ("BERT"), section 3 and appendix A: token + learned position + segment embeddings,
a post-LayerNorm Transformer encoder (Vaswani et al. 2017), a tanh pooler on [CLS], a masked-LM head whose output
projection is tied to the word embeddings, and a 2-way next-sentence head on the pooled output. Numerically it is
transformers' ``BertModel`` / ``BertForPreTraining`` (same weights give the same outputs; see
tests/test_parity_transformers.py); the parameter names are our own and map onto Hugging Face's in
:mod:`vlbert.checkpoint`.

Differences from transformers, all for speed and none visible in the numbers:
  * query/key/value are one fused ``qkv`` projection;
  * attention runs through ``torch.nn.functional.scaled_dot_product_attention``;
  * with ``labels``, MLM logits are computed on masked positions only (never [B, T, vocab_size]).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlbert.config import BertConfig
from vlbert.layers.activations import activation
from vlbert.layers.kernels import Dropout, dropout
from vlbert.models.outputs import EncoderOutput, PreTrainingOutput
from vlbert.models.pretrained import PreTrainedModel
from vlbert.objectives import OBJECTIVES, Encoded


def extended_attention_mask(mask: torch.Tensor) -> torch.Tensor:
    """Turn a key padding mask into the boolean mask ``scaled_dot_product_attention`` broadcasts over heads.

    Args:
        mask: [B, S], 1/True = a real token or region that may be attended to, 0/False = padding.
    Returns:
        bool [B, 1, 1, S]: True where attention is allowed.
    """
    return mask.bool()[:, None, None, :]


class BertEmbeddings(nn.Module):
    """Input embeddings: word + learned absolute position + segment (token type), then LayerNorm and dropout.

    Source: BERT paper section 3.2, figure 2; transformers ``BertEmbeddings``.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
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


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention (Vaswani et al. 2017, section 3.2) with a fused QKV projection.

    The kernel is ``torch.nn.functional.scaled_dot_product_attention``, which picks a flash / memory-efficient
    implementation where the hardware has one.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, unpadded: "Unpadded | None" = None,
                attentions: list | None = None) -> torch.Tensor:
        """Args: x float [B, S, H], or [N, H] real positions only when ``unpadded`` says where they sit;
        attn_mask bool [B, 1, 1, S] (True = attend) or None (attend everywhere); attentions: a list to append
        this layer's attention probabilities to (float [B, heads, S, S], rows of padded queries included), which
        computes them explicitly instead of through the fused kernel.
        Returns: the same layout as ``x`` (after the output projection, before dropout and residual)."""
        qkv = self.qkv(x)
        if unpadded is not None:
            qkv = unpadded.pad(qkv)
        b, s, three_h = qkv.shape
        q, k, v = qkv.view(b, s, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if attentions is not None:
            y = self._attention_with_cpu_dropout(q, k, v, attn_mask, attentions)
        elif self.training and self.dropout_p > 0 and x.device.type == "cpu":
            y = self._attention_with_cpu_dropout(q, k, v, attn_mask)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=self.dropout_p if self.training else 0.0)
        y = y.transpose(1, 2).reshape(b, s, three_h // 3)
        if unpadded is not None:
            y = unpadded.unpad(y)
        return self.out(y)

    def _attention_with_cpu_dropout(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                    attn_mask: torch.Tensor | None, attentions: list | None = None) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + mask) with :func:`dropout`, times v: what ``scaled_dot_product_attention``
        computes, for CPU training, where its dropout path (the math kernel with ``bernoulli_``) is slower, and
        whenever the probabilities are asked for (appended to ``attentions`` after dropout, the weights that
        multiply v, as transformers' eager attention returns them; in eval mode dropout is the identity).
        q, k, v: float [B, heads, S, head_dim]; attn_mask bool [B, 1, 1, S] or None. Returns [B, heads, S, d]."""
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(self.head_dim ** -0.5)
        if attn_mask is not None:
            scores = scores.masked_fill_(~attn_mask, torch.finfo(scores.dtype).min)
        probs = dropout(torch.softmax(scores, -1), self.dropout_p, self.training)
        if attentions is not None:
            attentions.append(probs)
        return torch.matmul(probs, v)


class BertLayer(nn.Module):
    """One post-LN Transformer encoder layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)) (BERT section 3)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.act = activation(config.hidden_act)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, unpadded: "Unpadded | None" = None,
                attentions: list | None = None) -> torch.Tensor:
        """Args: x float [B, S, H] (or [N, H] with ``unpadded``); attn_mask, attentions as :class:`SelfAttention`.
        Returns the same layout as ``x``."""
        x = self.attention_norm(x + self.dropout(self.attention(x, attn_mask, unpadded, attentions)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(self.act(self.ffn_in(x)))))


class Unpadded:
    """Where the real positions of a padded [B, S] batch are, to run position-wise layers (projections,
    feed-forward, LayerNorm) on the N real positions only: padding costs nothing there (MLPerf BERT / MosaicBERT
    "unpadding"). Attention scatters back to [B, S] for ``scaled_dot_product_attention``.
    """

    def __init__(self, mask: torch.Tensor):
        self.batch, self.seq = mask.shape
        self.index = mask.reshape(-1).nonzero().squeeze(1)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """[B, S, D] -> [N, D]."""
        return x.reshape(self.batch * self.seq, -1).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[N, D] -> [B, S, D] with zeros at padding."""
        out = x.new_zeros(self.batch * self.seq, x.shape[-1])
        return out.index_copy(0, self.index, x).view(self.batch, self.seq, -1)


class BertEncoder(nn.Module):
    """A stack of ``num_hidden_layers`` :class:`BertLayer`; shared by the text and vision-language models.

    When at least ``min_padding_to_unpad`` (5%) of the batch's positions are padding, layers run unpadded (see
    :class:`Unpadded`): real positions get exactly the values of the padded computation and padded positions come
    out as zeros. With less padding the gather/scatter copies cost more than the padded rows they save (measured
    on the default text batch, 0.25% padding: 310 ms vs 296 ms per step), so the padded batch runs as is and
    padded positions carry values that nothing reads, as in transformers.
    """

    min_padding_to_unpad = 0.05

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.unpad = True

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> EncoderOutput:
        """Args: x float [B, S, H] embeddings; mask [B, S] (1 = real) or None.
        Returns: :class:`EncoderOutput` with last_hidden_state [B, S, H], and when asked the L + 1 hidden states
        (the input first) and the L attention probabilities [B, heads, S, S] (no pooler)."""
        attn_mask = extended_attention_mask(mask) if mask is not None else None
        unpadded = Unpadded(mask) if self.unpad and mask is not None else None
        if unpadded is not None and unpadded.index.numel() > (1 - self.min_padding_to_unpad) * mask.numel():
            unpadded = None  # (almost) no padding: nothing to save
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        if unpadded is not None:
            x = unpadded.unpad(x)
        for layer in self.layers:
            x = layer(x, attn_mask, unpadded, attentions)
            if hidden_states is not None:
                hidden_states.append(unpadded.pad(x) if unpadded is not None else x)
        if unpadded is not None:
            x = unpadded.pad(x)
        return EncoderOutput(last_hidden_state=x, hidden_states=tuple(hidden_states) if hidden_states else None,
                             attentions=tuple(attentions) if attentions is not None else None)


def compile_encoder_layers(model: nn.Module, **options) -> int:
    """``torch.compile`` every :class:`BertLayer` of ``model`` in place (``nn.Module.compile``: parameter names
    and checkpoints are unchanged), with dynamic shapes since unpadded batches vary in length. Compiling layers
    rather than the whole model keeps the data-dependent parts (unpadding, masked-position selection) eager.

    Inductor fuses bias + GELU and dropout + residual + LayerNorm, which pays on GPUs; on a 2-core CPU the
    compiled layers were slower than eager (text default: 352-379 ms vs 325 ms per step), so it is off by
    default (``training.compile``). ``options`` go to ``torch.compile`` (default ``dynamic=True``).
    Returns the number of layers compiled.
    """
    options = {"dynamic": True, **options}
    layers = [m for m in model.modules() if isinstance(m, BertLayer)]
    for layer in layers:
        layer.compile(**options)
    return len(layers)


def check_text_inputs(config: BertConfig, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                      attention_mask: torch.Tensor | None) -> None:
    """Raise ``ValueError`` for text inputs a model of ``config`` cannot embed, naming the input and the fix:
    not [B, T] integer ids, T beyond ``max_position_embeddings``, token_type_ids/attention_mask of another shape,
    ids outside the embedding tables (``vocab_size``, ``type_vocab_size``), or a row with no real token.

    Shapes are always checked; values are checked on CPU tensors. On an accelerator a value check would stall
    the host on every step, so there an out-of-range id becomes an asynchronous device assertion instead.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq_len], got shape {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
    if input_ids.shape[1] > config.max_position_embeddings:
        raise ValueError(
            f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings="
            f"{config.max_position_embeddings}; truncate inputs (e.g. max_seq_length) to at most that")
    for name, t in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
        if t is not None and t.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but input_ids has {tuple(input_ids.shape)}")
    if torch.compiler.is_compiling() or input_ids.numel() == 0:
        return
    ranges = [("input_ids", input_ids, config.vocab_size, "the tokenizer saved with the checkpoint")]
    if token_type_ids is not None:
        ranges.append(("token_type_ids", token_type_ids, config.type_vocab_size, "0 (segment A) and 1 (segment B)"))
    for name, ids, size, fix in ranges:
        if ids.device.type != "cpu":
            torch._assert_async(((ids >= 0) & (ids < size)).all(), f"{name} outside [0, {size})")
            continue
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= size:
            raise ValueError(f"{name} holds {low if low < 0 else high}, outside the model's table of {size} "
                             f"entries; use {fix}")
    if attention_mask is not None and attention_mask.device.type == "cpu" and not attention_mask.any(1).all():
        row = int((~attention_mask.bool().any(1)).nonzero()[0])
        raise ValueError(f"attention_mask row {row} has no real token (all 0); every sequence needs at least [CLS]")


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
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> EncoderOutput:
        """Encode a batch of wordpiece sequences.

        Args:
            input_ids: int64 [B, T], wordpiece ids starting with [CLS].
            token_type_ids: int64 [B, T], 0 for segment A, 1 for segment B (default all 0).
            attention_mask: [B, T], 1 for real tokens, 0 for padding (default all 1).
            output_hidden_states: also return the L + 1 per-layer hidden states.
            output_attentions: also return each layer's attention probabilities [B, heads, T, T] (as
                transformers' eager attention; computed explicitly, so slower than the fused kernel).
        Returns:
            :class:`EncoderOutput` with last_hidden_state [B, T, H] and pooler_output [B, H].
        Raises:
            ValueError: wrong rank/dtype, mismatched shapes, or T > max_position_embeddings.
        """
        check_text_inputs(self.config, input_ids, token_type_ids, attention_mask)
        out = self.encoder(self.embeddings(input_ids, token_type_ids), attention_mask, output_hidden_states,
                           output_attentions)
        out.pooler_output = self.pooler(out.last_hidden_state) if self.pooler is not None else None
        return out


class BertForPreTraining(PreTrainedModel):
    """BERT with its two pretraining objectives: masked LM and next-sentence prediction (BERT section 3.1).

    The heads and losses are the objective units :class:`~vlbert.objectives.MaskedLanguageModeling` (head
    ``masked_lm``, tied to the word embeddings) and :class:`~vlbert.objectives.NextSentencePrediction` (head
    ``next_sentence``). ``loss`` = mean MLM cross-entropy over masked positions + NSP cross-entropy, as
    transformers' ``BertForPreTraining``. ``save_pretrained(dir)`` writes a directory that
    ``transformers.BertForPreTraining.from_pretrained(dir)`` loads with no missing or unexpected keys.
    """

    config_class = BertConfig
    base_model_prefix = "bert"
    objectives = ("mlm", "nsp")

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.units = [OBJECTIVES[name] for name in self.objectives]
        for unit in self.units:
            setattr(self, unit.head, unit.build_head(config))
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False) -> PreTrainingOutput:
        """Run BERT and its MLM/NSP heads.

        Args:
            input_ids, token_type_ids, attention_mask: as :meth:`BertModel.forward`, [B, T].
            labels: int64 [B, T], the original id at masked positions and -100 elsewhere. When given,
                ``prediction_logits`` is [N, V] over the N masked positions only; otherwise [B, T, V].
            next_sentence_label: int64 [B], 0 = segment B follows A, 1 = B is a random segment.
            output_hidden_states, output_attentions: also return per-layer hidden states / attention probabilities.
        Returns:
            :class:`PreTrainingOutput`; ``losses``/``metrics`` carry ``mlm``/``mlm_accuracy`` and
            ``nsp``/``nsp_accuracy`` for whichever labels were given, ``loss`` their sum.
        """
        enc = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions)
        out = PreTrainingOutput(last_hidden_state=enc.last_hidden_state, pooler_output=enc.pooler_output,
                                hidden_states=enc.hidden_states, attentions=enc.attentions)
        encoded = Encoded(self, enc.last_hidden_state, None, enc.pooler_output)
        given = {"labels": labels, "next_sentence_label": next_sentence_label}
        for unit in self.units:
            if all(given[k] is not None for k in unit.inputs):
                result = unit.loss(encoded, given)
                out.add(unit.name, result.loss, unit.metric, result.metric, result.count)
                if unit.name == "mlm":
                    out.prediction_logits = result.logits
                else:
                    out.seq_relationship_logits = result.logits
        if labels is None:
            out.prediction_logits = self.masked_lm(enc.last_hidden_state, self.bert.embeddings.word_embeddings.weight)
        if next_sentence_label is None:
            out.seq_relationship_logits = self.next_sentence(enc.pooler_output)
        return out


__all__ = ["BertModel", "BertForPreTraining", "BertEmbeddings", "BertEncoder", "BertLayer", "SelfAttention",
           "BertPooler", "Unpadded", "extended_attention_mask", "check_text_inputs", "compile_encoder_layers"]
