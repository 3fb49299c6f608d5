"""NLVR2 (``tools/finetune_nlvr2.py``): is a statement true of two images? The statement is encoded with each
image and both pooled outputs are classified together (UNITER / LXMERT), accuracy on the evaluation split.

Datasets: ``easy-vqa`` (the embedded demonstration, see :func:`vlbert.data.nlvr2.easy_vqa_image_pairs`) and ``nlvr2``
(the public JSONL files plus region shards of the NLVR2 images).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from vlbert.data.nlvr2 import ImagePairCollator, ImagePairDataset, easy_vqa_image_pairs, load_nlvr2
from vlbert.evaluation.classification import predict_labels
from vlbert.models.vl_classification import VLBertForImagePairClassification
from vlbert.recipes.regions import DatasetBuilder, RegionTaskDataConfig, load_examples, region_task_info, task_regions
from vlbert.recipes.runner import Recipe, RunContext, TaskData, load_model, write_output_file
from vlbert.utils import gathered_columns


@dataclass
class NLVR2DataConfig(RegionTaskDataConfig):
    """NLVR2 data (YAML section ``data``): :class:`RegionTaskDataConfig` (dataset "easy-vqa", ``train_pairs`` /
    ``eval_pairs`` statements drawn, or "nlvr2", the public ``train_file`` / ``eval_file`` JSONL; image ids from
    ``{stem}`` = ``<split>-<set>-<pair>`` and ``{k}`` = 0 left / 1 right)."""

    train_file: str = ""
    eval_file: str = ""
    train_pairs: int = 8000
    eval_pairs: int = 2000


#: dataset name -> (train, eval) statements.
DATASETS = {
    "easy-vqa": DatasetBuilder(lambda data, seed: (easy_vqa_image_pairs("train", data.train_pairs, seed),
                                                   easy_vqa_image_pairs("test", data.eval_pairs, seed))),
    "nlvr2": DatasetBuilder(lambda data, seed: (load_nlvr2(data.train_file, data.image_id_format),
                                                load_nlvr2(data.eval_file, data.image_id_format)),
                            needs=("train_file", "eval_file", "shards"), image_id_format="{stem}-img{k}"),
}


class NLVR2Data(TaskData):
    """Training and evaluation statements with the regions of both images.

    Raises:
        ValueError: an unknown dataset, or nlvr2 without its files.
    """

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        data = ctx.data
        train, held_out = load_examples(DATASETS, data, self.seed)
        regions = task_regions(ctx)
        self.regions = regions
        self.train = ImagePairDataset(train, regions, ctx.tokenizer, data.max_text_length, data.max_regions)
        self.eval = ImagePairDataset(held_out, regions, ctx.tokenizer, data.max_text_length, data.max_regions)
        self.collator = ImagePairCollator(ctx.tokenizer)
        self.feature_dim = next(iter(regions.values())).feature_dim

    def predict(self, model) -> tuple[dict[str, bool], float]:
        """(identifier -> predicted truth of every evaluation statement, accuracy)."""
        index, gold, predicted = gathered_columns(*predict_labels(model, self.rank_eval_batches()))
        answers = {self.eval.examples[i].identifier: bool(p) for i, p in zip(index, predicted)}
        return answers, sum(g == p for g, p in zip(gold, predicted)) / max(len(gold), 1)


def evaluate(ctx: RunContext, data: NLVR2Data, model) -> dict:
    """Accuracy on the evaluation statements; every prediction to ``predictions.csv`` in the NLVR2 evaluation
    script's format (``identifier,True|False`` per line, no header: lil-lab/nlvr ``nlvr2/eval``)."""
    answers, accuracy = data.predict(model)
    write_output_file(ctx, "predictions.csv", "".join(f"{k},{v}\n" for k, v in answers.items()))
    return {"accuracy": accuracy}


def build_model(ctx: RunContext, data: NLVR2Data) -> VLBertForImagePairClassification:
    return load_model(VLBertForImagePairClassification, ctx, num_labels=2, region_feature_dim=data.feature_dim)


def majority_baseline(ctx: RunContext, data: NLVR2Data, model) -> dict:
    """Evaluation accuracy of always answering the most frequent training label."""
    majority = Counter(ex.label for ex in data.train.examples).most_common(1)[0][0]
    return {"accuracy_majority_baseline": sum(ex.label == majority for ex in data.eval.examples) / len(data.eval)}


def inference_info(ctx: RunContext, data: NLVR2Data) -> dict:
    """Label names (index 1 = the statement is true), the maximum lengths and the regions' detector."""
    return region_task_info(ctx, data, labels=["False", "True"])


RECIPE = Recipe("nlvr2", NLVR2DataConfig, NLVR2Data, build_model, evaluate=evaluate,
                baselines=majority_baseline, uses_regions=True, inference_info=inference_info)

__all__ = ["RECIPE", "NLVR2DataConfig", "NLVR2Data"]
