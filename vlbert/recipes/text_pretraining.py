"""Text pretraining (``vlbert pretrain --modality text``): BERT's MLM + NSP on a document corpus, or any set of
text objective units (``data.objectives``: ``{mlm: 1}`` is RoBERTa's recipe without NSP; ``sop``, ``wwm``).

corpus -> (prepared once: sentences -> wordpieces in on-disk arrays) -> segment pairs drawn at load time ->
collator (the units prepare the batch) -> :class:`BertForPreTraining`, or with ``model.architecture: modernbert``
:class:`~vlbert.models.modernbert.ModernBertForMaskedLM` (MLM only; :data:`ARCHITECTURES`). Every corpus, the embedded default included, takes the prepared
path (:mod:`vlbert.data.token_corpus`, :mod:`vlbert.data.corpus_pairs`), so no setting makes memory grow with the
corpus. Source: BERT paper section 3.1 and appendix A.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Annotated, Any

from accelerate.utils import gather_object

from vlbert import checkpoint as ckpt
from vlbert.common.typed_config import Range, Takes, check_fields, check_mapping
from vlbert.data.corpus_pairs import CorpusPairsDataset, split_documents
from vlbert.data.masking_schedule import MaskingSchedule
from vlbert.data.pretraining import MaskingCollator, text_units
from vlbert.data.token_corpus import TokenCorpus, prepare_corpus
from vlbert.layers.losses import IGNORE_INDEX
from vlbert.models.bert import BertForPreTraining
from vlbert.models.modernbert import ModernBertForMaskedLM
from vlbert.recipes.init_from import load_model
from vlbert.recipes.runner import Recipe, RunContext, TaskData
from vlbert.run_files import read_run_file

logger = logging.getLogger(__name__)

#: ``model.architecture`` -> the model text pretraining trains: BERT (the default; Devlin et al. 2019) or ModernBERT
#: (Warner et al. 2024; its fields are :class:`~vlbert.modernbert_config.ModernBertConfig`'s). A model class with a
#: tuple ``objectives`` trains those alone (ModernBERT: ``mlm``).
ARCHITECTURES = {"bert": BertForPreTraining, "modernbert": ModernBertForMaskedLM}


@dataclass
class TextDataConfig:
    """Corpus and pretraining-data settings (YAML section ``data``).

    corpus: "bbc-news", a local .txt/.jsonl file or directory, or a ``datasets`` hub name. It is tokenised once
        into on-disk arrays read by position (cached under ``corpus_cache_dir`` by corpus and tokenizer;
        ``vlbert prepare-corpus`` does it ahead of a run) and pairs are drawn from them at load time.
    text_field: the text column of JSONL or ``datasets`` corpora.
    eval_fraction: share of documents held out for evaluation (whole documents, so no leakage).
    max_seq_length: wordpieces per pair including [CLS] and two [SEP] (BERT: 128, then 512).
    short_seq_prob: probability of a shorter target length (BERT: 0.1).
    mlm_probability: share of wordpieces chosen for prediction (BERT: 0.15; ModernBERT: 0.3, AnswerDotAI/ModernBERT
        ``yamls/modernbert/modernbert-base-pretrain.yaml``).
    mlm_probability_schedule: the training rate as a function of the step, ``{step fraction: rate}`` (mmBERT:
        ``{0: 0.3, 0.767: 0.15, 0.967: 0.05}``; definition and sources:
        :class:`~vlbert.data.masking_schedule.MaskingSchedule`); empty (the default): ``mlm_probability``
        throughout.
    eval_mlm_probability: the held-out batches' rate; None (the default): ``mlm_probability``. ModernBERT always
        evaluates at 0.15 "for consistent comparison" (its pretraining yaml's ``eval_loader``).
    max_eval_batches: cap on held-out batches per evaluation (0 = all).
    num_proc: processes for the one-time tokenisation (``datasets.map``).
    objectives: the text objective units every batch trains (names in :data:`vlbert.objectives.OBJECTIVES` with
        modality "text": ``mlm``, ``nsp``, ``sop``, ``wwm``), each with weight 1 (on) or 0 (off): BERT sums their
        losses on every batch, so a weight is no frequency. Default ``{mlm: 1, nsp: 1}`` (BERT); ``{mlm: 1}`` is
        MLM without NSP, the recipe of RoBERTa and of ModernBERT, NeoBERT, mmBERT and Ettin. Pairs draw a random segment B (half the time) only when ``nsp`` is on.

    Raises:
        ValueError: an unknown or vision-language-only objective, a weight other than 0 or 1, no objective on, or
            two units that choose the same thing (``mlm`` with ``wwm``: the masked pieces; ``nsp`` with ``sop``:
            segment B).
    """

    corpus: str = "bbc-news"
    text_field: str = "text"
    eval_fraction: Annotated[float, Range(ge=0, lt=1)] = 0.05
    max_seq_length: Annotated[int, Range(ge=5)] = 128  # [CLS] A [SEP] B [SEP]
    short_seq_prob: Annotated[float, Range(ge=0, le=1)] = 0.1
    mlm_probability: Annotated[float, Range(ge=0, le=1)] = 0.15
    mlm_probability_schedule: Annotated[
        dict[float, float], Takes("a mapping of step fraction to masking rate, e.g. {0: 0.3, 0.767: 0.15, 0.967: 0.05}")
    ] = field(default_factory=dict)
    eval_mlm_probability: Annotated[float, Range(gt=0, lt=1)] | None = None
    max_eval_batches: Annotated[int, Range(ge=0)] = 0
    num_proc: Annotated[int, Range(ge=1)] = 1
    corpus_cache_dir: str = "~/.cache/vlbert/corpora"
    objectives: Annotated[
        dict[str, float], Takes("a mapping of objective name to weight, 1 (on) or 0 (off), e.g. {mlm: 1, nsp: 1}")
    ] = field(default_factory=lambda: {"mlm": 1, "nsp": 1})

    def __post_init__(self) -> None:
        check_fields(self, "data")  # types and ranges (built in Python; a config section was read through them)
        text_units(self.objectives)  # unknown names: ValueError naming the text objectives
        MaskingSchedule(self.mlm_probability_schedule, 1)  # fractions and rates in range
        bad = {n: w for n, w in self.objectives.items() if isinstance(w, bool) or w not in (0, 1)}
        if bad:
            raise ValueError(
                f"data.objectives weights of text pretraining are 1 (on) or 0 (off), got {bad}: every "
                "batch trains every objective (BERT sums their losses); e.g. {mlm: 1, nsp: 1}"
            )
        if not self.running:
            raise ValueError("data.objectives turns no objective on; e.g. {mlm: 1} (RoBERTa) or {mlm: 1, nsp: 1}")
        for pair in (("mlm", "wwm"), ("nsp", "sop")):
            if set(pair) <= set(self.running):
                raise ValueError(
                    f"data.objectives has both {pair[0]} and {pair[1]}, which choose the same "
                    f"{'wordpieces to mask' if pair[0] == 'mlm' else 'segment B'}; keep one"
                )

    @property
    def running(self) -> tuple[str, ...]:
        """The objectives turned on (weight 1)."""
        return tuple(name for name, weight in self.objectives.items() if weight == 1)


class TextPretrainingData(TaskData):
    """Training and held-out batches for MLM + NSP from one prepared corpus (see :class:`TextDataConfig`).

    Raises:
        FileNotFoundError / ValueError: from the corpus readers (missing or empty corpus, a JSONL without the
            text field).
    """

    eval_batch_factor = 1

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        data, tokenizer = ctx.data, ctx.tokenizer
        held_out_rate = data.eval_mlm_probability or data.mlm_probability  # the collator's own: held-out batches
        self.collator = MaskingCollator.from_tokenizer(
            tokenizer, mlm_probability=held_out_rate, unpadded=True, objectives=data.running
        )
        masking = MaskingSchedule(data.mlm_probability_schedule, ctx.training.max_steps, data.mlm_probability)
        if data.mlm_probability_schedule or held_out_rate != data.mlm_probability:
            self.step_fields = masking.fields  # each training batch's items carry their step's rate
        self.max_eval_batches = data.max_eval_batches
        corpus = TokenCorpus(
            prepare_corpus(data.corpus, tokenizer, data.corpus_cache_dir, data.text_field, num_proc=data.num_proc)
        )
        train_docs, eval_docs = split_documents(corpus.num_documents, data.eval_fraction, self.seed)
        random_next = "nsp" in data.running  # NSP's negatives; SOP and MLM alone keep B the true continuation
        self.train = CorpusPairsDataset(
            corpus, train_docs, tokenizer, data.max_seq_length, data.short_seq_prob, self.seed, "train", random_next
        )
        if len(eval_docs) >= 2:
            self.eval = CorpusPairsDataset(
                corpus,
                eval_docs,
                tokenizer,
                data.max_seq_length,
                data.short_seq_prob,
                self.seed + 1,
                "eval",
                random_next,
            )
        counts = corpus.token_counts(len(tokenizer))  # counted at preparation: the whole corpus
        counts[list(tokenizer.all_special_ids)] = -1
        self.majority_token = int(counts.argmax())

    def majority_baseline_accuracy(self) -> float:
        """Held-out MLM accuracy of always predicting the corpus's most frequent ordinary wordpiece (counted at
        preparation)."""
        hits = total = 0
        key = next(u.inputs[0] for u in text_units(self.collator.objectives) if u.output == "prediction_logits")
        for batch in self.rank_eval_batches():
            labels = batch[key][batch[key] != IGNORE_INDEX]
            hits += int((labels == self.majority_token).sum())
            total += labels.numel()
        parts = gather_object([(hits, total)])
        return sum(h for h, _ in parts) / max(sum(t for _, t in parts), 1)


def read_model_section(section: Any) -> dict[str, Any]:
    """The ``model`` section's given keys, checked and converted: ``architecture`` (a key of :data:`ARCHITECTURES`,
    default "bert"; always in the result) and the fields of that architecture's config class.

    Raises:
        ValueError: an unknown architecture (the known named), an unknown key (the architecture's keys listed), a
            value of the wrong type or out of range.
    """
    values = dict(section) if isinstance(section, dict) else section
    name = values.pop("architecture", "bert") if isinstance(values, dict) else "bert"
    if name not in ARCHITECTURES:
        raise ValueError(f"model.architecture={name!r} is not a text architecture; use one of {sorted(ARCHITECTURES)}")
    return {"architecture": name, **check_mapping(ARCHITECTURES[name].config_class, values, "model")}


def _checkpoint_architecture(init_from: str) -> str | None:
    """The :data:`ARCHITECTURES` key of the checkpoint at ``init_from`` (from its config.json's ``model_type``), or
    None where it has no config.json."""
    path = ckpt.resolve_checkpoint_dir(init_from) / ckpt.CONFIG_NAME
    if not path.is_file():
        return None
    return "modernbert" if read_run_file(path).get("model_type") == "modernbert" else "bert"


def _model_section(ctx: RunContext) -> tuple[str, dict[str, Any]]:
    """(architecture, the ``model`` section without it). An ``init_from`` checkpoint decides the architecture: a
    section written for the other one is ignored with one warning line, refused where set on the command line."""
    section = ctx.model_section
    name = section.pop("architecture", "bert")
    saved = _checkpoint_architecture(ctx.init_from) if ctx.init_from else None
    if saved is None or saved == name:
        return name, section
    given = sorted(k for k in ctx.command_line_keys if k.startswith("model."))
    if given:
        raise ValueError(
            f"--set {', '.join(given)} sets a {name} model, but init_from {ctx.init_from} is a {saved} checkpoint, "
            "which decides the architecture: drop those --set flags, or train a fresh model without --init-from"
        )
    if section or name != "bert":
        logger.warning(
            "init_from %s is a %s checkpoint: ignoring the config's %s model section", ctx.init_from, saved, name
        )
    return saved, {}


def build_model(ctx: RunContext, data) -> BertForPreTraining | ModernBertForMaskedLM:
    """A fresh model of ``model.architecture`` (:data:`ARCHITECTURES`) from the ``model`` section (vocab_size and
    the special token ids from the tokenizer), or ``init_from`` (its architecture decides; other ``model`` entries
    apply: :func:`vlbert.recipes.init_from.load_model`).

    Raises:
        ValueError: ``data.max_seq_length`` beyond the model's ``max_position_embeddings``; ``data.objectives``
            turning on an objective the architecture has no head for (ModernBERT: anything but ``mlm``).
    """
    name, section = _model_section(ctx)
    cls = ARCHITECTURES[name]
    heads = getattr(cls, "objectives", None)  # a class-level tuple: those alone (BERT's is its units, per config)
    extra = [o for o in ctx.data.running if isinstance(heads, tuple) and o not in heads]
    if extra:
        raise ValueError(
            f"data.objectives turns on {extra}, but a {cls.architecture_name} model has a head for "
            f"{list(heads)} only (no NSP); set data.objectives: {{mlm: 1}}"
        )
    defaults = {}
    if cls is ModernBertForMaskedLM and not ctx.init_from:  # the tokenizer's ids, not ModernBERT's tokenizer's
        tok = ctx.tokenizer
        ids = {"cls_token_id": tok.cls_token_id, "sep_token_id": tok.sep_token_id}
        defaults = {**ids, "bos_token_id": tok.cls_token_id, "eos_token_id": tok.sep_token_id}
    model = load_model(cls, dataclasses.replace(ctx, config={**ctx.config, "model": section}), **defaults)
    if ctx.data.max_seq_length > model.config.max_position_embeddings:
        raise ValueError(
            f"data.max_seq_length={ctx.data.max_seq_length} exceeds the model's "
            f"max_position_embeddings={model.config.max_position_embeddings}; lower max_seq_length"
        )
    return model


def baselines(ctx: RunContext, data: TextPretrainingData, model) -> dict:
    """The majority baseline of the masking unit's held-out accuracy (``eval_mlm_accuracy_majority_baseline``,
    or ``wwm``'s), where a masking unit runs and there are held-out documents."""
    masking = [u for u in text_units(data.collator.objectives) if u.output == "prediction_logits"]
    if not (data.eval and masking):
        return {}
    return {f"eval_{masking[0].metric}_majority_baseline": data.majority_baseline_accuracy()}


def processor_fields(ctx: RunContext, data: TextPretrainingData) -> dict:
    """The maximum length, for :class:`vlbert.inference.TextFillMaskPipeline`."""
    return {"max_text_length": ctx.data.max_seq_length}


RECIPE = Recipe(
    "text-pretraining",
    TextDataConfig,
    TextPretrainingData,
    build_model,
    baselines=baselines,
    default_init=None,
    processor_fields=processor_fields,
    read_model_section=read_model_section,
)

__all__ = ["RECIPE", "ARCHITECTURES", "TextDataConfig", "TextPretrainingData", "read_model_section"]
