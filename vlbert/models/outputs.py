"""Output dataclasses. Field names follow Hugging Face transformers (``last_hidden_state``, ``pooler_output``,
``hidden_states``, ``loss``, ``prediction_logits``, ``seq_relationship_logits``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class EncoderOutput:
    """Output of :class:`vlbert.BertModel` and :class:`vlbert.VLBertModel`.

    Attributes:
        last_hidden_state: float [B, S, H], the final layer (S = T for text, T + R for text + regions).
        pooler_output: float [B, H], tanh(dense(last_hidden_state[:, 0])), the [CLS] summary.
        hidden_states: when ``output_hidden_states=True``, a tuple of num_hidden_layers + 1 tensors [B, S, H]:
            the embedding output, then each layer's output (as transformers).
        attentions: when ``output_attentions=True``, a tuple of num_hidden_layers tensors [B, heads, S, S]: each
            layer's attention probabilities (rows: queries, columns: keys; padded keys get 0), as transformers.
        text_hidden_states, region_hidden_states, text_attentions, region_attentions, cross_attentions,
        region_cross_attentions: each stream's own states and attention maps, two-stream encoder only
        (:class:`~vlbert.models.two_stream.TwoStreamEncoder` says their shapes); None otherwise.
    """

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    text_hidden_states: tuple[torch.Tensor, ...] | None = None
    region_hidden_states: tuple[torch.Tensor, ...] | None = None
    text_attentions: tuple[torch.Tensor, ...] | None = None
    region_attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None
    region_cross_attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class ObjectiveOutput:
    """Output of a model with training objectives (pretraining or a fine-tuning head).

    Attributes:
        loss: scalar float, the sum of every computed objective's loss (what ``backward`` is called on); None
            when no labels were given.
        losses: objective name (``"mlm"``, ``"nsp"``, ``"itm"``, ...) -> scalar loss tensor.
        metrics: metric name (``"mlm_accuracy"``, ...) -> scalar tensor, computed without gradient.
        counts: objective name (and its metric's name) -> number of predictions its loss and metric average
            over (int; transformers' ``num_items_in_batch``, per objective), so that losses are weighted by it
            across ranks and metrics averaged correctly over several batches.
        squares: objective or metric name -> the mean over its predictions of each one's squared loss or metric
            value (0-d float; held out, where the objective knows its per-prediction values: the pretraining units),
            from which evaluation derives the standard error of the mean.
        unused_parameters: parameters this forward did not use (heads of objectives this batch does not train):
            the model declares them, and the trainer keeps them in DDP's graph with weight zero (so DDP needs no
            ``find_unused_parameters`` search) and drops their gradients.
    """

    loss: torch.Tensor | None = None
    losses: dict[str, torch.Tensor] = field(default_factory=dict)
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    unused_parameters: list = field(default_factory=list)
    squares: dict[str, torch.Tensor] = field(default_factory=dict)

    def add(self, name: str, loss: torch.Tensor, metric_name: str, metric: torch.Tensor, count: int) -> None:
        """Record one objective's loss, its metric and how many predictions they cover."""
        self.losses[name] = loss
        self.metrics[metric_name] = metric
        self.counts[name] = self.counts[metric_name] = count
        self.loss = loss if self.loss is None else self.loss + loss

    def add_unused(self, *modules) -> None:
        """Declare the parameters of ``modules`` (None entries skipped), which this forward did not use, in
        ``unused_parameters``: under DDP the trainer enters them into the backward with weight zero (DDP needs
        every parameter in every backward; :func:`~vlbert.training.distributed.global_batch_loss`) and drops their
        zero gradients, so the optimizer skips them. The loss is left as it is. Nothing without a loss or
        gradients."""
        if self.loss is None or not torch.is_grad_enabled():
            return
        idle = [p for m in modules if m is not None for p in m.parameters() if p.requires_grad]
        if idle:
            self.unused_parameters = [*self.unused_parameters, *idle]


@dataclass
class PreTrainingOutput(ObjectiveOutput):
    """Output of :class:`vlbert.BertForPreTraining` (fields as transformers' ``BertForPreTrainingOutput``).

    Attributes:
        prediction_logits: MLM logits. Without ``labels``: float [B, T, vocab_size], as transformers. With
            ``labels``: float [N, vocab_size] for the N masked positions only (``labels != -100``, row-major
            order), so training never materialises [B, T, vocab_size].
        seq_relationship_logits: float [B, 2], NSP logits (0 = B follows A, 1 = B is random).
        last_hidden_state, pooler_output, hidden_states, attentions: as :class:`EncoderOutput`.
    """

    prediction_logits: torch.Tensor | None = None
    seq_relationship_logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
