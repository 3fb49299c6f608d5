"""The text benchmarks' official evaluators, restated for the tests (their licenses are unclear, so no file is
vendored: each function follows its script's procedure step by step, and names the source it was read from).

* :func:`conlleval`: conlleval.pl (Erik Tjong Kim Sang, version 2004-01-26) as shipped in
  chakki-works/seqeval@77e3d636793885cfa725a4bf2c776e818d789816 ``tests/conlleval.pl``: its ``startOfChunk`` /
  ``endOfChunk`` rules for B/I/O/E tags and its running count of correct chunks.
* :func:`squad_v1`: ``evaluate-v1.1.py`` as copied in huggingface/evaluate@b6e7c3b0ed02444f1b3f4f1eb48a39f27af321ec
  ``metrics/squad/compute_score.py``.
* :func:`squad_v2`: ``evaluate-v2.0.py`` as copied in huggingface/datasets@02bb18c7f9899b206983480b14bc1accf69714a5
  ``metrics/squad_v2/evaluate.py`` (``main`` without the plots).
* :func:`glue`: huggingface/evaluate@3a62fc3f6f6722ca17f8a6a7b04d9cae9a6c4286 ``metrics/glue/glue.py``'s
  ``_compute``.

The tests feed them the files a vlbert run wrote and the evaluation data in the benchmark's own layout.
"""

from __future__ import annotations

import collections
import re
import string

# --- conlleval.pl -----------------------------------------------------------------------------------------------


def _split_tag(tag: str) -> tuple[str, str]:
    # "20040126 ET code which allows hyphens in the types": the prefix is up to the first hyphen.
    m = re.match(r"^([^-]*)-(.*)$", tag)
    return (m.group(1), m.group(2)) if m else (tag, "")


def _end_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
    end = (prev_tag, tag) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")}
    if prev_tag not in ("O", ".") and prev_type != type_:
        end = True
    return end or prev_tag in ("]", "[")


def _start_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
    start = (prev_tag, tag) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"), ("O", "E")}
    if tag not in ("O", ".") and prev_type != type_:
        start = True
    return start or tag in ("[", "]")


def conlleval(sentences: list[tuple[list[str], list[str]]]) -> dict[str, float]:
    """conlleval.pl over ``[(gold tags, guessed tags)]`` of each sentence (a sentence boundary is a line read as
    ``-X- O O``). Returns ``{"precision", "recall", "f1", "accuracy"}`` as fractions (the script prints them x 100)
    and the counts ``found_correct``, ``found_guessed``, ``correct_chunks``, ``tokens``."""
    lines = []
    for gold, guessed in sentences:
        assert len(gold) == len(guessed)
        lines += [("w", g, p) for g, p in zip(gold, guessed, strict=True)] + [("-X-", "O", "O")]
    correct_chunk = found_correct = found_guessed = correct_tags = tokens = 0
    in_correct = False
    last_correct, last_guessed, last_correct_type, last_guessed_type = "O", "O", "", ""
    for first, gold_tag, guessed_tag in lines:
        guessed, guessed_type = _split_tag(guessed_tag)
        correct, correct_type = _split_tag(gold_tag)
        if first == "-X-":
            guessed = "O"
        if in_correct:
            end_c = _end_of_chunk(last_correct, correct, last_correct_type, correct_type)
            end_g = _end_of_chunk(last_guessed, guessed, last_guessed_type, guessed_type)
            if end_c and end_g and last_guessed_type == last_correct_type:
                in_correct = False
                correct_chunk += 1
            elif end_c != end_g or guessed_type != correct_type:
                in_correct = False
        start_c = _start_of_chunk(last_correct, correct, last_correct_type, correct_type)
        start_g = _start_of_chunk(last_guessed, guessed, last_guessed_type, guessed_type)
        if start_c and start_g and guessed_type == correct_type:
            in_correct = True
        found_correct += start_c
        found_guessed += start_g
        if first != "-X-":
            correct_tags += correct == guessed and guessed_type == correct_type
            tokens += 1
        last_guessed, last_correct, last_guessed_type, last_correct_type = guessed, correct, guessed_type, correct_type
    if in_correct:
        correct_chunk += 1
    precision = correct_chunk / found_guessed if found_guessed else 0.0
    recall = correct_chunk / found_correct if found_correct else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "accuracy": correct_tags / tokens,
        "found_correct": found_correct,
        "found_guessed": found_guessed,
        "correct_chunks": correct_chunk,
        "tokens": tokens,
    }


# --- SQuAD --------------------------------------------------------------------------------------------------------


def _normalize(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(re.compile(r"\b(a|an|the)\b", re.UNICODE), " ", s)
    return " ".join(s.split())


def squad_v1(dataset: list[dict], predictions: dict[str, str]) -> dict[str, float]:
    """evaluate-v1.1.py's ``evaluate(dataset, predictions)``: ``dataset`` is SQuAD's ``data`` list."""

    def f1_score(prediction, ground_truth):
        p, g = _normalize(prediction).split(), _normalize(ground_truth).split()
        num_same = sum((collections.Counter(p) & collections.Counter(g)).values())
        if num_same == 0:
            return 0
        precision, recall = num_same / len(p), num_same / len(g)
        return 2 * precision * recall / (precision + recall)

    def exact_match_score(prediction, ground_truth):
        return _normalize(prediction) == _normalize(ground_truth)

    f1 = exact_match = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    continue
                truths = [a["text"] for a in qa["answers"]]
                exact_match += max(exact_match_score(predictions[qa["id"]], t) for t in truths)
                f1 += max(f1_score(predictions[qa["id"]], t) for t in truths)
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


def _get_tokens(s):
    return _normalize(s).split() if s else []


def _compute_f1(a_gold, a_pred):
    gold_toks, pred_toks = _get_tokens(a_gold), _get_tokens(a_pred)
    num_same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision, recall = num_same / len(pred_toks), num_same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def _get_raw_scores(dataset, preds):
    exact_raw, f1_raw = {}, {}
    for a in dataset:
        for p in a["paragraphs"]:
            for qa in p["qas"]:
                golds = [x["text"] for x in qa["answers"] if _normalize(x["text"])] or [""]
                if qa["id"] not in preds:
                    continue
                exact_raw[qa["id"]] = max(int(_normalize(g) == _normalize(preds[qa["id"]])) for g in golds)
                f1_raw[qa["id"]] = max(_compute_f1(g, preds[qa["id"]]) for g in golds)
    return exact_raw, f1_raw


def _make_eval_dict(exact, f1, qids=None):
    qids = qids or list(exact)
    return {
        "exact": 100.0 * sum(exact[k] for k in qids) / len(qids),
        "f1": 100.0 * sum(f1[k] for k in qids) / len(qids),
        "total": len(qids),
    }


def _find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    cur = best = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        diff = scores[qid] if qid_to_has_ans[qid] else (-1 if preds[qid] else 0)
        cur += diff
        if cur > best:
            best, thresh = cur, na_probs[qid]
    return 100.0 * best / len(scores), thresh


def squad_v2(
    dataset: list[dict], preds: dict[str, str], na_probs: dict[str, float] | None = None, na_prob_thresh: float = 1.0
) -> dict:
    """evaluate-v2.0.py's ``main`` (``--na-prob-file`` given as ``na_probs``, ``--na-prob-thresh``), over its
    functions (``get_tokens``, ``compute_f1``, ``get_raw_scores``, ``make_eval_dict``, ``find_best_thresh``)."""
    qid_to_has_ans = {qa["id"]: bool(qa["answers"]) for a in dataset for p in a["paragraphs"] for qa in p["qas"]}
    exact_raw, f1_raw = _get_raw_scores(dataset, preds)
    probs = na_probs if na_probs is not None else {k: 0.0 for k in preds}

    def apply(scores):  # apply_no_ans_threshold
        return {q: float(not qid_to_has_ans[q]) if probs[q] > na_prob_thresh else s for q, s in scores.items()}

    exact_t, f1_t = apply(exact_raw), apply(f1_raw)
    out = _make_eval_dict(exact_t, f1_t)
    has = [k for k, v in qid_to_has_ans.items() if v]
    no = [k for k, v in qid_to_has_ans.items() if not v]
    if has:
        out.update({f"HasAns_{k}": v for k, v in _make_eval_dict(exact_t, f1_t, has).items()})
    if no:
        out.update({f"NoAns_{k}": v for k, v in _make_eval_dict(exact_t, f1_t, no).items()})
    if na_probs is not None:
        for name, scores in (("exact", exact_raw), ("f1", f1_raw)):
            out[f"best_{name}"], out[f"best_{name}_thresh"] = _find_best_thresh(preds, scores, na_probs, qid_to_has_ans)
    return out


def squad_dataset(records: list[dict]) -> list[dict]:
    """Records ``{"id", "context", "question", "answers": {"text", "answer_start"}}`` (``datasets``' squad layout)
    in SQuAD's JSON ``data`` layout, one article per record."""
    return [
        {
            "title": r["id"],
            "paragraphs": [
                {
                    "context": r["context"],
                    "qas": [
                        {
                            "id": r["id"],
                            "question": r["question"],
                            "answers": [
                                {"text": t, "answer_start": s}
                                for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"], strict=True)
                            ],
                        }
                    ],
                }
            ],
        }
        for r in records
    ]


# --- GLUE ---------------------------------------------------------------------------------------------------------


def glue(task: str, predictions, references) -> dict[str, float]:
    """huggingface/evaluate's ``Glue._compute`` for ``task`` (numpy arrays of label indices or scores)."""
    import numpy as np
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import f1_score, matthews_corrcoef

    preds, labels = np.asarray(predictions), np.asarray(references)
    if task == "cola":
        return {"matthews_correlation": matthews_corrcoef(labels, preds)}
    if task == "stsb":
        return {"pearson": float(pearsonr(preds, labels)[0]), "spearmanr": float(spearmanr(preds, labels)[0])}
    if task in ("mrpc", "qqp"):
        return {"accuracy": float((preds == labels).mean()), "f1": float(f1_score(y_true=labels, y_pred=preds))}
    return {"accuracy": float((preds == labels).mean())}
