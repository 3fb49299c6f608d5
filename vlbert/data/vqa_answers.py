"""VQA answers in the forms the official evaluation compares (GT-Vision-Lab/VQA,
``PythonEvaluationTools/vqaEvaluation/vqaEval.py`` at master, commit a013f00 "Fixed processing answers bug",
March 2021; the metric of Antol et al. 2015, section 2), and the soft targets that follow the same processing. The
data side (answer vocabulary, targets) and the metric (:func:`vlbert.evaluation.vqa.vqa_accuracy`) both read them
here, so the model is trained on the answers it is scored on.

The official rule, per question:
  1. every annotator's answer and the prediction have newlines and tabs turned into spaces and are stripped;
  2. if the stripped answers are not all the same string, every answer *and* the prediction go through
     :func:`process_punctuation` then :func:`process_digit_article`; if they are all the same, neither is
     processed and the prediction is compared as it is (so "Yes" scores 0 against ten "yes");
  3. for each annotator, the prediction scores min(1, number of the *other* annotators whose answer equals it / 3);
     the question's accuracy is the mean of the ten scores.

The official code's quirks are reproduced because the published numbers include them:
  * the period rule ``(?!<=\\d)(\\.)(?!\\d)`` was meant to look behind but looks ahead for the text "<=digit", so a
    period is removed wherever no digit follows it, after a digit too ("3." -> "3"; "3.5" is kept);
  * it passes ``re.UNICODE`` (32) where ``re.sub`` takes its count: at most 32 periods are removed;
  * a punctuation mark that touches a space anywhere in the answer is deleted everywhere, otherwise replaced by a
    space; when a digit,digit comma appears anywhere in the answer, every mark is deleted ("1,000" -> "1000");
  * the marks are the official list ``; / [ ] " { } ( ) = + \\ _ - > < @ ` , ? !``: ``:`` and ``'`` are not marks
    ("10:30" and "who's" are kept), nor are ``% $ # & * ^ ~ |``;
  * the contraction table is the official one (straight apostrophes); its upper-case keys ("Im", "Ive", "Id've")
    never match because words are lower-cased first, and it maps "somebody'd" to "somebodyd";
  * number words are "none" and "zero" .. "ten" only.
The leave-one-out of step 3 removes each annotator's own answer. The official code does it by comparing answer
records, which removes exactly one because each record has its own ``answer_id`` (VQA v1/v2 annotations).

One extension, for datasets with a single reference answer (easy-VQA): there the official leave-one-out would
score every prediction 0, so a prediction equal to the reference (compared as in step 2: one answer is unanimous,
so neither is processed) scores 1.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

_NUMBER_WORDS = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
_ARTICLES = {"a", "an", "the"}
_PUNCTUATION = (
    ";",
    "/",
    "[",
    "]",
    '"',
    "{",
    "}",
    "(",
    ")",
    "=",
    "+",
    "\\",
    "_",
    "-",
    ">",
    "<",
    "@",
    "`",
    ",",
    "?",
    "!",
)
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")  # sic: see the module docstring
_DIGIT_COMMA = re.compile(r"(\d)(,)(\d)")
_OFFICIAL_PERIOD_COUNT = int(re.UNICODE)  # sic: the official code passes the flag (32) where re.sub takes a count

# The official contraction table (120 entries): "key value" pairs separated by " | ".
_CONTRACTIONS = dict(
    pair.split(" ")
    for line in """
aint ain't | arent aren't | cant can't | couldve could've | couldnt couldn't | couldn'tve couldn't've
couldnt've couldn't've | didnt didn't | doesnt doesn't | dont don't | hadnt hadn't | hadnt've hadn't've
hadn'tve hadn't've | hasnt hasn't | havent haven't | hed he'd | hed've he'd've | he'dve he'd've | hes he's
howd how'd | howll how'll | hows how's | Id've I'd've | I'dve I'd've | Im I'm | Ive I've | isnt isn't
itd it'd | itd've it'd've | it'dve it'd've | itll it'll | let's let's | maam ma'am | mightnt mightn't
mightnt've mightn't've | mightn'tve mightn't've | mightve might've | mustnt mustn't | mustve must've
neednt needn't | notve not've | oclock o'clock | oughtnt oughtn't | ow's'at 'ow's'at | 'ows'at 'ow's'at
'ow'sat 'ow's'at | shant shan't | shed've she'd've | she'dve she'd've | she's she's | shouldve should've
shouldnt shouldn't | shouldnt've shouldn't've | shouldn'tve shouldn't've | somebody'd somebodyd
somebodyd've somebody'd've | somebody'dve somebody'd've | somebodyll somebody'll | somebodys somebody's
someoned someone'd | someoned've someone'd've | someone'dve someone'd've | someonell someone'll
someones someone's | somethingd something'd | somethingd've something'd've | something'dve something'd've
somethingll something'll | thats that's | thered there'd | thered've there'd've | there'dve there'd've
therere there're | theres there's | theyd they'd | theyd've they'd've | they'dve they'd've | theyll they'll
theyre they're | theyve they've | twas 'twas | wasnt wasn't | wed've we'd've | we'dve we'd've | weve we've
werent weren't | whatll what'll | whatre what're | whats what's | whatve what've | whens when's
whered where'd | wheres where's | whereve where've | whod who'd | whod've who'd've | who'dve who'd've
wholl who'll | whos who's | whove who've | whyll why'll | whyre why're | whys why's | wont won't
wouldve would've | wouldnt wouldn't | wouldnt've wouldn't've | wouldn'tve wouldn't've | yall y'all
yall'll y'all'll | y'allll y'all'll | yall'd've y'all'd've | y'alld've y'all'd've | y'all'dve y'all'd've
youd you'd | youd've you'd've | you'dve you'd've | youll you'll | youre you're | youve you've
""".strip().splitlines()
    for pair in line.split(" | ")
)


def process_punctuation(text: str) -> str:
    """The official ``processPunctuation``.

    Each official mark is deleted everywhere if it touches a space anywhere in ``text`` (or if a digit,digit comma
    appears anywhere in ``text``), otherwise replaced by a space; then at most 32 periods not followed by a digit
    are removed. "1,000" -> "1000", "x/y z/ w" -> "xy z w", "t-shirt" -> "t shirt", "3." -> "3".
    """
    out = text
    delete_all = _DIGIT_COMMA.search(text) is not None
    for mark in _PUNCTUATION:
        touches_space = mark + " " in text or " " + mark in text
        out = out.replace(mark, "" if touches_space or delete_all else " ")
    return _PERIOD.sub("", out, count=_OFFICIAL_PERIOD_COUNT)


def process_digit_article(text: str) -> str:
    """The official ``processDigitArticle``: lower-case, split on whitespace, number words "none", "zero" ..
    "ten" as digits, articles (a, an, the) dropped, then each word looked up in the official contraction table;
    joined by single spaces. "Two dogs" -> "2 dogs", "dont know" -> "don't know"."""
    words = [_NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    return " ".join(_CONTRACTIONS.get(w, w) for w in words if w not in _ARTICLES)


def _clean(answer: str) -> str:
    return answer.replace("\n", " ").replace("\t", " ").strip()


def normalize_answer(answer: str) -> str:
    """An answer as the official evaluation processes it when the annotators disagree: newlines and tabs to
    spaces, stripped, :func:`process_punctuation`, :func:`process_digit_article`."""
    return process_digit_article(process_punctuation(_clean(answer)))


def _unanimous(references: Sequence[str]) -> bool:
    return len({_clean(r) for r in references}) <= 1


def reference_forms(references: Sequence[str]) -> list[str]:
    """The annotators' answers as the official evaluation compares them: cleaned (newlines and tabs to spaces,
    stripped), and processed with :func:`normalize_answer` only when the cleaned answers are not all the same."""
    if _unanimous(references):
        return [_clean(r) for r in references]
    return [normalize_answer(r) for r in references]


def prediction_form(prediction: str, references: Sequence[str]) -> str:
    """The prediction as the official evaluation compares it with ``references``: cleaned, and processed with
    :func:`normalize_answer` only when the cleaned references are not all the same."""
    return _clean(prediction) if _unanimous(references) else normalize_answer(prediction)


def soft_score(count: int) -> float:
    """Training target of an answer given by ``count`` annotators: min(count / 3, 1) (the VQA v2 soft score of
    Teney et al. 2018, "Tips and tricks for VQA")."""
    return min(count / 3.0, 1.0)


def answer_targets(references: Sequence[str], answer_to_index: dict[str, int]) -> dict[int, float]:
    """Soft target per answer-vocabulary index: :func:`soft_score` of how many annotators gave each answer, the
    answers taken in their :func:`reference_forms` (the official processing); answers outside the vocabulary are
    left out. A single reference gets score 1.

    Returns:
        {vocabulary index: target in (0, 1]}.
    """
    counts = Counter(reference_forms(references))
    if len(references) == 1:
        return {answer_to_index[a]: 1.0 for a in counts if a in answer_to_index}
    return {answer_to_index[a]: soft_score(c) for a, c in counts.items() if a in answer_to_index}


__all__ = [
    "normalize_answer",
    "process_punctuation",
    "process_digit_article",
    "reference_forms",
    "prediction_form",
    "soft_score",
    "answer_targets",
]
