"""VQA accuracy (Antol et al. 2015, section 2; the VQA v2 evaluation) and the soft targets used to train for it.

An answer is fully right when at least 3 of the 10 annotators gave it: for each annotator, the prediction scores
min(1, #other annotators who gave it / 3), and the 10 scores are averaged. Answers are compared after the
evaluation's normalisation: lower case, punctuation removed (but decimal points and digit-group commas kept in
numbers), number words zero..ten written as digits, articles dropped, common contractions given their apostrophe.
Unlike the reference script, which normalises only when the annotators disagree, normalisation is always applied.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

_NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                 "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
_ARTICLES = {"a", "an", "the"}
_CONTRACTIONS = {"aint": "ain't", "arent": "aren't", "cant": "can't", "couldnt": "couldn't", "didnt": "didn't",
                 "doesnt": "doesn't", "dont": "don't", "hadnt": "hadn't", "hasnt": "hasn't", "havent": "haven't",
                 "hes": "he's", "im": "i'm", "isnt": "isn't", "itll": "it'll", "ive": "i've", "shes": "she's",
                 "shouldnt": "shouldn't", "thats": "that's", "theres": "there's", "theyre": "they're",
                 "wasnt": "wasn't", "werent": "weren't", "whats": "what's", "wont": "won't", "wouldnt": "wouldn't",
                 "youre": "you're", "youve": "you've"}
_PUNCTUATION = re.compile(r"[;/\[\]\"{}()=+\\_\-><@`,?!*#%^&$~|:]")
_PERIOD = re.compile(r"(?<!\d)\.(?!\d)")
_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d)")


def normalize_answer(answer: str) -> str:
    """The VQA evaluation's answer normalisation (see module docstring). "Two dogs." -> "2 dogs"."""
    text = " ".join(answer.replace("\n", " ").replace("\t", " ").lower().split())
    text = _DIGIT_COMMA.sub("", text)       # 1,000 -> 1000
    text = _PERIOD.sub("", text)            # sentence periods go, 2.5 stays
    text = _PUNCTUATION.sub(" ", text)
    words = []
    for word in text.split():
        word = _NUMBER_WORDS.get(word, word)
        if word in _ARTICLES:
            continue
        words.append(_CONTRACTIONS.get(word, word))
    return " ".join(words)


def soft_score(count: int) -> float:
    """Training target of an answer given by ``count`` annotators: min(count / 3, 1) (VQA v2 soft score)."""
    return min(count / 3.0, 1.0)


def vqa_accuracy(prediction: str, references: Sequence[str]) -> float:
    """Accuracy of one predicted answer against the annotators' answers.

    Args:
        prediction: the model's answer.
        references: every annotator's answer (10 in VQA v2). With a single reference (datasets such as
            easy-VQA with one correct answer per question) a match scores 1.
    Returns:
        float in [0, 1]: the mean over annotators of min(1, matches among the other annotators / 3).
    Raises:
        ValueError: no references.
    """
    if not references:
        raise ValueError("vqa_accuracy needs at least one reference answer")
    pred = normalize_answer(prediction)
    refs = [normalize_answer(r) for r in references]
    if len(refs) == 1:
        return float(pred == refs[0])
    matches = sum(r == pred for r in refs)
    scores = [min(1.0, (matches - (r == pred)) / 3.0) for r in refs]
    return sum(scores) / len(scores)


def answer_targets(references: Sequence[str], answer_to_index: dict[str, int]) -> dict[int, float]:
    """Soft target per answer-vocabulary index from the annotators' answers (answers outside the vocabulary are
    left out). A single reference gets score 1."""
    counts = Counter(normalize_answer(r) for r in references)
    if len(references) == 1:
        return {answer_to_index[a]: 1.0 for a in counts if a in answer_to_index}
    return {answer_to_index[a]: soft_score(c) for a, c in counts.items() if a in answer_to_index}


__all__ = ["normalize_answer", "vqa_accuracy", "soft_score", "answer_targets"]
