"""Fine-tuning heads of the BERT paper (section 4, figure 4) with transformers' names and semantics: one output
layer on the shared encoder, the whole network fine-tuned. Also the feature-based use of section 5.3: every
layer's hidden states and a learned scalar mix of layers (Peters et al. 2018; Tenney et al. 2019).

Parameter names equal transformers' (``classifier``, ``qa_outputs``), so checkpoints load both ways.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vlbert.config import BertConfig
from vlbert.layers.kernels import Dropout
from vlbert.layers.losses import IGNORE_INDEX, upcast
from vlbert.layers.unpadded import UnpaddedLayout
from vlbert.models.bert import BertModel
from vlbert.models.outputs import ObjectiveOutput
from vlbert.models.pretrained import PreTrainedModel


@dataclass
class ClassificationOutput(ObjectiveOutput):
    """``logits``: float [B, num_labels] (sequence), [B, T, num_labels] (token), [B, num_choices] (choice);
    plus the hidden states when asked. ``loss``/``losses``/``metrics`` as :class:`ObjectiveOutput`."""

    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class QuestionAnsweringOutput(ObjectiveOutput):
    """``start_logits``, ``end_logits``: float [B, T] span boundary scores (padding positions included)."""

    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def _dropout(config: BertConfig) -> Dropout:
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return Dropout(p)


class BertForSequenceClassification(PreTrainedModel):
    """[CLS] pooled output -> dropout -> linear (BERT section 4.1; transformers' class of the same name).

    ``num_labels`` > 1: single-label classification, cross-entropy on int64 labels [B]; ``num_labels`` == 1:
    regression, mean squared error on float labels [B] (e.g. STS-B); float labels [B, num_labels] with
    ``num_labels`` > 1: multi-label, binary cross-entropy with logits. Sentence pairs go in as
    ``[CLS] A [SEP] B [SEP]`` with token_type_ids.
    """

    base_model_prefix = "bert"
    objectives = ("cls",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.dropout = _dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        labels=None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        layout: UnpaddedLayout | None = None,
    ) -> ClassificationOutput:
        """Args: text [B, T]; labels int64 [B] (classification) or float [B] (regression); ``layout``: the
        collator's unpadded layout (:meth:`BertModel.forward`: no host sync). Returns logits [B, num_labels]; with
        labels, ``losses["cls"]`` and ``metrics["cls_accuracy"]`` (classification)."""
        enc = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions, layout)
        logits = self.classifier(self.dropout(enc.pooler_output))
        out = ClassificationOutput(logits=logits, hidden_states=enc.hidden_states, attentions=enc.attentions)
        if labels is not None:
            add_sequence_loss(out, logits, labels, self.config.num_labels)
        return out


def add_sequence_loss(out: ClassificationOutput, logits: torch.Tensor, labels: torch.Tensor, num_labels: int) -> None:
    """Add a sequence head's loss to ``out`` (transformers' ``problem_type`` by the labels): ``num_labels`` == 1:
    regression, mean squared error on float labels [B] (``losses["cls"]``, ``metrics["cls_mse"]``); float labels
    [B, num_labels]: multi-label, binary cross-entropy with logits; int64 labels [B]: cross-entropy (both with
    ``metrics["cls_accuracy"]``). ``logits`` float [B, num_labels]. Raises ValueError for a class label outside
    [0, num_labels) (:func:`check_labels`)."""
    if num_labels == 1:
        pred = upcast(logits.squeeze(-1))
        loss = F.mse_loss(pred, labels.to(pred.dtype))
        out.add("cls", loss, "cls_mse", loss.detach(), labels.numel())
    elif labels.dtype.is_floating_point:
        loss = F.binary_cross_entropy_with_logits(upcast(logits), labels.to(upcast(logits).dtype))
        with torch.no_grad():
            acc = ((logits > 0) == (labels > 0.5)).float().mean()
        out.add("cls", loss, "cls_accuracy", acc, labels.shape[0])
    else:
        check_labels(labels, num_labels)
        loss = F.cross_entropy(upcast(logits), labels)
        with torch.no_grad():
            acc = (logits.argmax(-1) == labels).float().mean()
        out.add("cls", loss, "cls_accuracy", acc, labels.numel())


def check_labels(labels: torch.Tensor, num_labels: int) -> None:
    """Raise ``ValueError`` if a class label (ignoring -100) is outside [0, num_labels).

    Values are read on the host only: labels on an accelerator are checked by an asynchronous device assertion
    (``torch._assert_async``, as :func:`~vlbert.models.inputs.check_text_inputs` checks ids there), since reading
    them would make the host wait for the GPU on every step (the text recipes' datasets give labels from the
    label space, so the device check guards a mismatched ``num_labels``)."""
    if labels.device.type != "cpu":
        if not torch.compiler.is_compiling():
            ok = (labels == IGNORE_INDEX) | ((labels >= 0) & (labels < num_labels))
            torch._assert_async(
                ok.all(), f"a label is outside [0, num_labels={num_labels}); set num_labels to the number of classes"
            )
        return
    valid = labels[labels != IGNORE_INDEX]
    if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= num_labels):
        raise ValueError(
            f"label {int(valid.max()) if int(valid.max()) >= num_labels else int(valid.min())} is "
            f"outside [0, num_labels={num_labels}); set num_labels to the number of classes"
        )


class BertForTokenClassification(PreTrainedModel):
    """Every wordpiece's final hidden state -> dropout -> linear (BERT section 5.3, NER).

    Labels int64 [B, T] with -100 where no prediction is scored (padding, special tokens and, for word-level
    tagging, every piece of a word but the first; see :func:`vlbert.data.finetuning.align_word_labels`).
    """

    base_model_prefix = "bert"
    objectives = ("tag",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = _dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        labels=None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        layout: UnpaddedLayout | None = None,
    ) -> ClassificationOutput:
        """Returns logits [B, T, num_labels]; with labels, ``losses["tag"]`` and ``metrics["tag_accuracy"]``
        (counted over the scored pieces: a 0-d tensor on an accelerator, read on the CPU). ``layout``: the
        collator's unpadded layout (:meth:`BertModel.forward`)."""
        enc = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions, layout)
        logits = self.classifier(self.dropout(enc.last_hidden_state))
        out = ClassificationOutput(logits=logits, hidden_states=enc.hidden_states, attentions=enc.attentions)
        if labels is not None:
            add_token_loss(out, logits, labels, self.config.num_labels)
        return out


def add_token_loss(out: ClassificationOutput, logits: torch.Tensor, labels: torch.Tensor, num_labels: int) -> None:
    """Add a tagging head's loss to ``out``: cross-entropy of ``logits`` float [B, T, num_labels] against int64
    ``labels`` [B, T] (-100 where nothing is scored), ``losses["tag"]`` and ``metrics["tag_accuracy"]`` over the
    scored pieces (a 0-d tensor count on an accelerator). Raises ValueError as :func:`check_labels`."""
    check_labels(labels, num_labels)
    scored = labels != IGNORE_INDEX
    loss = F.cross_entropy(upcast(logits.flatten(0, 1)), labels.flatten(), ignore_index=IGNORE_INDEX)
    with torch.no_grad():  # no boolean indexing: on an accelerator its size would be read by the host
        count = scored.sum()
        acc = ((logits.argmax(-1) == labels) & scored).sum().float() / count.clamp(min=1)
    out.add("tag", loss, "tag_accuracy", acc, int(count) if labels.device.type == "cpu" else count)


class BertForQuestionAnswering(PreTrainedModel):
    """Span extraction (BERT section 4.2, SQuAD): a start vector and an end vector score every position.

    Loss: mean of start and end cross-entropies over positions; positions outside [0, T) are clamped to T and
    ignored, as transformers. :func:`best_span` decodes the answer with end >= start and a maximum length.
    """

    base_model_prefix = "bert"
    objectives = ("qa",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        # transformers' span loss normalises over every position, padding included, so padded positions must
        # carry the values transformers computes there: no unpadding for this head.
        self.bert.encoder.unpad = False
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        start_positions=None,
        end_positions=None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        layout: UnpaddedLayout | None = None,
    ) -> QuestionAnsweringOutput:
        """Args: text [B, T]; start_positions/end_positions int64 [B] (wordpiece indices); ``layout``: the
        collator's unpadded layout (:meth:`BertModel.forward`). Returns start/end logits [B, T];
        with positions, ``losses["qa"]`` and ``metrics["qa_exact"]`` (both boundaries right)."""
        enc = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions, layout)
        start_logits, end_logits = self.qa_outputs(enc.last_hidden_state).unbind(-1)
        out = QuestionAnsweringOutput(
            start_logits=start_logits, end_logits=end_logits, hidden_states=enc.hidden_states, attentions=enc.attentions
        )
        if start_positions is not None and end_positions is not None:
            t = start_logits.shape[1]
            start, end = start_positions.clamp(0, t), end_positions.clamp(0, t)
            loss = (
                F.cross_entropy(upcast(start_logits), start, ignore_index=t)
                + F.cross_entropy(upcast(end_logits), end, ignore_index=t)
            ) / 2
            with torch.no_grad():
                exact = ((start_logits.argmax(-1) == start) & (end_logits.argmax(-1) == end)).float().mean()
            out.add("qa", loss, "qa_exact", exact, start.numel())
        return out


def best_span(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    max_answer_length: int = 30,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The highest-scoring span with start <= end < start + max_answer_length (BERT section 4.2).

    Args:
        start_logits, end_logits: float [B, T].
        max_answer_length: longest span in wordpieces.
        allowed: bool [B, T], positions a span may use (e.g. the context's wordpieces); default all.
    Returns:
        (start int64 [B], end int64 [B], score float [B] = start_logit + end_logit).
    """
    t = start_logits.shape[1]
    scores = start_logits[:, :, None] + end_logits[:, None, :]  # [B, start, end]
    i = torch.arange(t, device=start_logits.device)
    valid = (i[None, :] >= i[:, None]) & (i[None, :] - i[:, None] < max_answer_length)
    valid = valid[None].expand_as(scores)
    if allowed is not None:
        valid = valid & allowed[:, :, None] & allowed[:, None, :]
    scores = scores.masked_fill(~valid, float("-inf"))
    flat = scores.flatten(1).argmax(-1)
    return flat // t, flat % t, scores.flatten(1).gather(1, flat[:, None]).squeeze(1)


class BertForMultipleChoice(PreTrainedModel):
    """Each (context, choice) pair scored from its [CLS] by one linear unit; softmax over choices (BERT section
    4.4, SWAG). Inputs are [B, num_choices, T]."""

    base_model_prefix = "bert"
    objectives = ("choice",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.dropout = _dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_weights()

    def forward(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        labels=None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> ClassificationOutput:
        """Args: int64 [B, C, T] each; labels int64 [B] (the right choice). Returns logits [B, C]; with labels,
        ``losses["choice"]`` and ``metrics["choice_accuracy"]``."""
        b, c, t = input_ids.shape
        flat = lambda x: None if x is None else x.reshape(b * c, t)  # noqa: E731
        enc = self.bert(
            flat(input_ids), flat(token_type_ids), flat(attention_mask), output_hidden_states, output_attentions
        )
        logits = self.classifier(self.dropout(enc.pooler_output)).view(b, c)
        out = ClassificationOutput(logits=logits, hidden_states=enc.hidden_states, attentions=enc.attentions)
        if labels is not None:
            check_labels(labels, c)
            loss = F.cross_entropy(upcast(logits), labels)
            with torch.no_grad():
                acc = (logits.argmax(-1) == labels).float().mean()
            out.add("choice", loss, "choice_accuracy", acc, labels.numel())
        return out


class ScalarMix(nn.Module):
    """A learned softmax-weighted sum of layers times a scale: gamma * sum_j softmax(w)_j h_j (Peters et al.
    2018, ELMo eq. 1; Tenney et al. 2019). Feed it ``output_hidden_states``.

    Args:
        num_layers: how many hidden states are mixed (num_hidden_layers + 1 with the embeddings).
    """

    def __init__(self, num_layers: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, hidden_states: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> torch.Tensor:
        """Args: num_layers tensors [B, T, H]. Returns float [B, T, H]."""
        if len(hidden_states) != self.weights.numel():
            raise ValueError(f"ScalarMix over {self.weights.numel()} layers got {len(hidden_states)} hidden states")
        w = self.weights.softmax(0)
        return self.gamma * sum(w[i] * h for i, h in enumerate(hidden_states))


def layer_features(hidden_states: tuple[torch.Tensor, ...], strategy: str) -> torch.Tensor:
    """Feature-based BERT (BERT section 5.3, table 7): combine per-layer hidden states without fine-tuning.

    Args:
        hidden_states: the L + 1 states from ``output_hidden_states=True`` ([B, T, H] each).
        strategy: ``"last"``, ``"second_to_last"``, ``"sum_last_four"``, ``"concat_last_four"`` ([B, T, 4H]),
            ``"sum_all"`` (all L layers, embeddings excluded) or ``"embeddings"``.
    """
    layers = hidden_states[1:]
    if strategy == "last":
        return layers[-1]
    if strategy == "second_to_last":
        return layers[-2]
    if strategy == "sum_last_four":
        return torch.stack(layers[-4:]).sum(0)
    if strategy == "concat_last_four":
        return torch.cat(layers[-4:], dim=-1)
    if strategy == "sum_all":
        return torch.stack(layers).sum(0)
    if strategy == "embeddings":
        return hidden_states[0]
    raise ValueError(
        f"unknown strategy {strategy!r}; use last, second_to_last, sum_last_four, concat_last_four, "
        "sum_all or embeddings"
    )


__all__ = [
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertForMultipleChoice",
    "ScalarMix",
    "layer_features",
    "best_span",
    "ClassificationOutput",
    "QuestionAnsweringOutput",
    "check_labels",
    "add_sequence_loss",
    "add_token_loss",
]
