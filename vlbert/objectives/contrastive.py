"""Image-text contrastive learning (ITC; ALBEF, Li et al. 2021, section 3.2; ``models/model_pretrain.py`` at
salesforce/ALBEF@b9727e4): each caption and each image is embedded on its own (a unimodal [CLS] projected to
``config.projection_dim`` and L2-normalised), and InfoNCE both ways pulls a pair's embeddings together against every
other caption and image of the global batch.

Unimodal embeddings. ALBEF has unimodal encoders before its fusion: the first 6 BERT layers run on the text alone and
a ViT on the image alone; ITC reads their [CLS]. A single-stream model has one encoder for both modalities, so each
modality alone through it is its unimodal encoder: the caption alone (its [CLS]), and ``[CLS] [SEP]`` followed by the
regions (that [CLS]), the passes :class:`~vlbert.models.retrieval.VLBertForImageTextRetrieval` embeds with and ITM's
hard negatives draw by (:mod:`vlbert.objectives.image_text_matching`). (The first K layers alone would be ALBEF's
split more literally; the whole encoder is what retrieval's dual-encoder stage reads, so a pretrained ITC head serves
it as trained.) A two-stream model (LXMERT) would take its language and region streams before the cross-modality
layers; its region stream has no [CLS] and no pass runs it alone, so ITC refuses two-stream models
(:meth:`ImageTextContrastive.unsupported`).

Targets. Captions of equal content (``content_id``) are positives of each other and never negatives, each positive
weighted equally (the soft targets of retrieval's :func:`~vlbert.models.retrieval.contrastive_loss`); with distinct
contents this is ALBEF's ``loss_ita`` at ``alpha`` = 0 without the queue (``sim_targets`` the identity).

Across processes. Every rank's embeddings are gathered with the gradient
(``torch.distributed.nn.functional.all_gather``, whose backward sums each column's gradient over the ranks that
read it); each rank's loss is over its own rows against the global batch's columns. With the trainer's weighting
(:func:`~vlbert.training.distributed.global_batch_loss`: each rank's loss times its share of the rows, the
gradients averaged over ranks), N processes at batch b train exactly as one at N x b. Training batches are equal
on every rank (the training loader drops an incomplete global batch), so the gather needs no sizes and reads
nothing back; without gradient the rows are gathered by :func:`~vlbert.utils.all_gather_padded`, padded to the
batch's ``gather_bounds`` (read by no rank), and the padded columns are masked out of the softmax, the targets and
the chance. Evaluation (the model in eval mode) gathers nothing: the trainer deals the held-out batches to the ranks
round-robin, so ranks run different numbers of them and a collective would wait forever; each held-out batch is
scored as one process scores it.

Temperature. Learned, starting at 0.07 and clamped to [0.001, 0.5] before each use, in place as ALBEF does
(``self.temp.clamp_(0.001, 0.5)`` under ``no_grad`` at the start of ``forward``): the value used is the clamped
parameter and its whole gradient reaches the parameter, even at a bound. Where the parameter in the forward is a
computing copy (bf16-params: FSDP2 all-gathers a bfloat16 copy of the float32 shard), the in-place clamp still gives
the forward the clamped value and ALBEF's gradient, but it is lost on the float32 weight the optimizer updates; so
the trainer also clamps the trained weight after every optimizer step (:meth:`ContrastiveHead.constrain_parameters`),
and the next forward starts from an in-range weight as in ALBEF (clamp, forward, step, clamp, ...: the same
sequence). A functional clamp (``temperature.clamp(...)`` in the loss, the parameter left free) was not chosen: its
gradient is zero outside the range, so a weight that overshot a bound would stay past it, unlike ALBEF's.

Momentum distillation (ALBEF section 3.3): with a momentum teacher on the model
(:mod:`vlbert.objectives.momentum`), the columns are the teacher's features of the global batch (gathered without
gradient) followed by its queue, the targets mix in the teacher's softmax with weight ``alpha``, and the global
batch's teacher features are then enqueued (:meth:`ImageTextContrastive.distilled`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from vlbert.layers.losses import upcast
from vlbert.layers.unpadded import regions_alone_layout, unpadded_layout
from vlbert.objectives.base import Encoded, Objective, ObjectiveResult, PrepareContext
from vlbert.objectives.momentum import teacher_of
from vlbert.utils import all_gather_equal, all_gather_padded, process_position

if TYPE_CHECKING:
    from vlbert.models.inputs import VLInputs

#: ALBEF's temperature: its start (``configs/Pretrain.yaml`` ``temp``) and its clamp (``model_pretrain.py``).
TEMPERATURE, TEMPERATURE_RANGE = 0.07, (0.001, 0.5)


class ContrastiveHead(nn.Module):
    """``text_proj``, ``image_proj``: Linear(hidden_size, projection_dim) on each modality's [CLS]; ``temperature``:
    a learned scalar (:data:`TEMPERATURE`, clamped to :data:`TEMPERATURE_RANGE` by :meth:`clamped_temperature`)."""

    def __init__(self, hidden_size: int, projection_dim: int):
        super().__init__()
        self.text_proj = nn.Linear(hidden_size, projection_dim)
        self.image_proj = nn.Linear(hidden_size, projection_dim)
        self.temperature = nn.Parameter(torch.tensor(TEMPERATURE))

    def _init_own_weights(self, std: float) -> None:
        with torch.no_grad():
            self.temperature.fill_(TEMPERATURE)

    def clamped_temperature(self) -> torch.Tensor:
        """The temperature after clamping it in place to :data:`TEMPERATURE_RANGE` (ALBEF: ``temp.clamp_``): the
        parameter itself (0-d, or one element under FSDP2), or under FSDP2 its bfloat16 computing copy."""
        with torch.no_grad():
            self.temperature.clamp_(*TEMPERATURE_RANGE)
        return self.temperature

    @torch.no_grad()
    def constrain_parameters(self) -> None:
        """Clamp the trained temperature in place to :data:`TEMPERATURE_RANGE`; the trainer calls it after every
        optimizer step, when the parameter is the trained weight (with bf16-params the float32 DTensor shard,
        which :meth:`clamped_temperature` inside a forward does not reach). On the device, no host read."""
        self.temperature.clamp_(*TEMPERATURE_RANGE)


def gather_columns(
    tensors: list[torch.Tensor], rows: int = 0, local: bool = False
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """(every process's ``tensors`` concatenated along dim 0 in rank order, the columns that are real rows: bool
    [n] or None for all). One process, or ``local`` (evaluation: see the module docstring): the tensors themselves.
    With gradient enabled:
    ``torch.distributed.nn.functional.all_gather`` (differentiable, no host read; every rank must hold as many
    rows); without: :func:`~vlbert.utils.all_gather_padded` to ``rows`` per rank (ranks may differ in rows; no host
    read either).

    Raises:
        ValueError: without gradient across processes, a rank holding more than ``rows`` rows."""
    _, world = process_position()
    if world == 1 or local:
        return list(tensors), None
    if not torch.is_grad_enabled():
        return all_gather_padded(list(tensors), rows)
    from torch.distributed.nn.functional import all_gather

    return [torch.cat(all_gather(t), 0) if t.is_floating_point() else all_gather_equal(t) for t in tensors], None


def gather_equal(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every process's ``tensors`` concatenated along dim 0 in rank order, without gradient and without a host
    read (every rank must hold as many rows: training batches); the tensors themselves in one process."""
    return [all_gather_equal(t) for t in tensors]


def contrastive_rows(
    text: torch.Tensor,
    image: torch.Tensor,
    all_text: torch.Tensor,
    all_image: torch.Tensor,
    same: torch.Tensor,
    temperature: torch.Tensor | float,
    soft: tuple[torch.Tensor, torch.Tensor] | None = None,
    alpha: float = 0.0,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """InfoNCE both ways of this process's rows against the global batch's columns.

    Args:
        text, image: float [b, P], this process's unit-length text and image embeddings (row i: item i's pair).
        all_text, all_image: float [n, P], the columns: the global batch's (this process's rows among them; with
            a momentum model its features, then the queue's).
        same: bool [b, n], True where row i's caption and column j's have equal content (row i's own pair too).
        temperature: the softmax temperature.
        soft: (text -> image, image -> text) float [b, n] each, the momentum model's softmax over the same
            columns, or None; mixed into the targets with weight ``alpha`` (ALBEF's ``sim_t2i_targets``,
            ``sim_i2t_targets``).
        valid: bool [n], the columns that are real rows (False: the padding of a rank's smaller batch,
            :func:`gather_columns`), left out of the softmax, the targets and the chance; None: all are.
    Returns:
        (loss: float [], the mean of the text -> image and image -> text cross-entropies over the b rows, each
        row's positives weighted equally; accuracy: float [] detached, the fraction of the 2b rows whose top column
        is a positive; chance: float [], that fraction for a uniform guess, the mean share of positives).
    """
    if valid is not None:
        same = same & valid
    target = same.float() / same.float().sum(1, keepdim=True)
    t2i_target, i2t_target = target, target
    if soft is not None:
        t2i_target, i2t_target = (alpha * s + (1 - alpha) * target for s in soft)
    t2i = text @ all_image.T / temperature
    i2t = image @ all_text.T / temperature
    if valid is not None:  # padded columns: probability 0, and no 0 x -inf in the cross-entropy
        t2i, i2t = t2i.masked_fill(~valid, float("-inf")), i2t.masked_fill(~valid, float("-inf"))
    loss = (_cross_entropy(t2i_target, t2i, valid) + _cross_entropy(i2t_target, i2t, valid)) / 2
    with torch.no_grad():
        hits = torch.cat([same.gather(1, t2i.argmax(1, keepdim=True)), same.gather(1, i2t.argmax(1, keepdim=True))])
        columns = same.shape[1] if valid is None else valid.sum()
        chance = (same.float().sum(1) / columns).mean()
    return loss, hits.float().mean(), chance


def _cross_entropy(target: torch.Tensor, logits: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """The mean over rows of -sum(target x log_softmax(logits)), columns outside ``valid`` left out."""
    terms = -target * F.log_softmax(logits, 1)
    if valid is not None:
        terms = terms.masked_fill(~valid, 0.0)
    return terms.sum(1).mean()


class ImageTextContrastive(Objective):
    """``itc_content`` int64 [B]: each item's caption content id (the batch keeps every item's own caption and
    image); with a packed text collator also ``itc_text_layout`` (the text alone) and ``itc_image_layout``
    (``[CLS] [SEP]`` + regions), so neither unimodal pass reads a mask on the device. The joint pass is not read
    (:attr:`reads_joint` False): a step of ITC alone runs only the two unimodal passes. Metric ``itc_accuracy``
    (top-1 both ways) and ``itc_accuracy_chance``, a uniform guess's accuracy on the same batch (about 1 / the
    global batch; the end-of-run table's baseline)."""

    name, metric, head, inputs = "itc", "itc_accuracy", "itc", ("itc_content",)
    optional_inputs = ("itc_text_layout", "itc_image_layout", "gather_bounds")
    reads_joint = False

    def build_head(self, config) -> ContrastiveHead | None:
        """The head where ``config.contrastive_head`` asks for it, or None (a model that does not train ITC, or
        cannot run the unit: :meth:`unsupported`), which then has no ``itc`` parameters."""
        if not getattr(config, "contrastive_head", False) or self.unsupported(config):
            return None
        return ContrastiveHead(config.hidden_size, config.projection_dim)

    def unsupported(self, config) -> str | None:
        if getattr(config, "encoder", "single-stream") != "single-stream":
            return (
                "the itc objective needs a single-stream model (config.encoder: single-stream); a two-stream "
                "model's unimodal streams are not run alone yet"
            )
        return None

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        batch["itc_content"] = torch.tensor([x["content_id"] for x in items], dtype=torch.long)
        if ctx.gather_bounds is not None:
            batch["gather_bounds"] = ctx.gather_bounds
        if getattr(ctx.text, "lays_out", False):
            batch["itc_text_layout"] = unpadded_layout(batch["attention_mask"])
            batch["itc_image_layout"] = regions_alone_layout(batch["region_mask"])

    def embed(self, model: nn.Module, inputs: VLInputs, labels: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(text, image) float [B, P], unit length: the caption alone and ``[CLS] [SEP]`` + the regions through
        ``model``'s encoder, each [CLS] through its projection. [CLS] and [SEP] are read from each caption (its
        first and last real token) on the device."""
        head = getattr(model, self.head)
        text = model.bert(inputs.text_only().replace(layout=labels.get("itc_text_layout"))).last_hidden_state[:, 0]
        image = model.bert(inputs.regions_alone(labels.get("itc_image_layout"))).last_hidden_state[:, 0]
        return (
            F.normalize(upcast(head.text_proj(text)), dim=-1),
            F.normalize(upcast(head.image_proj(image)), dim=-1),
        )

    def loss(self, encoded: Encoded, labels) -> ObjectiveResult:
        model = encoded.model
        problem = self.unsupported(model.config)
        if problem:
            raise ValueError(problem)
        text, image = self.embed(model, encoded.inputs, labels)
        content = labels["itc_content"]
        temperature = getattr(model, self.head).clamped_temperature()
        teacher = teacher_of(model)
        if teacher is None:
            bounds = labels.get("gather_bounds")
            (all_text, all_image, all_content), valid = gather_columns(
                [text, image, content], bounds.rows if bounds is not None else content.shape[0], not model.training
            )
            same = content[:, None] == all_content[None, :]
            loss, accuracy, chance = contrastive_rows(text, image, all_text, all_image, same, temperature, valid=valid)
        else:
            loss, accuracy, chance = self.distilled(teacher, text, image, content, encoded.inputs, labels, temperature)
        b = content.shape[0]
        return ObjectiveResult(loss, accuracy, b, extra_metrics={f"{self.metric}_chance": (chance, b)})

    def distilled(self, teacher, text, image, content, inputs, labels, temperature):
        """ALBEF's ``loss_ita`` with its momentum model (``model_pretrain.py``): the columns are the momentum
        model's features of the global batch (gathered, no gradient) followed by the queue's; the targets are
        ``alpha`` times the momentum model's softmax over them plus ``1 - alpha`` times the content targets; then
        the global batch's momentum features are enqueued. Returns :func:`contrastive_rows`' triple."""
        with torch.no_grad():
            text_m, image_m = teacher.run(lambda parts: self.embed(parts, inputs, labels))
            all_text_m, all_image_m, all_content = gather_equal([text_m, image_m, content])
            columns_text, columns_image, columns_content = all_text_m, all_image_m, all_content
            if teacher.text_queue is not None:
                columns_text = torch.cat([all_text_m, teacher.text_queue])
                columns_image = torch.cat([all_image_m, teacher.image_queue])
                columns_content = torch.cat([all_content, teacher.content_queue])
            same = content[:, None] == columns_content[None, :]
            alpha = teacher.alpha("itc")
            soft = None
            if alpha:
                t = temperature.detach()
                soft = (F.softmax(text_m @ columns_image.T / t, 1), F.softmax(image_m @ columns_text.T / t, 1))
        result = contrastive_rows(text, image, columns_text, columns_image, same, temperature, soft, alpha)
        if teacher.text_queue is not None:
            teacher.enqueue(all_text_m, all_image_m, all_content)
        return result


__all__ = ["ImageTextContrastive", "ContrastiveHead", "contrastive_rows", "gather_columns", "gather_equal"]
