"""VQA accuracy exactly as the official evaluation computes it (GT-Vision-Lab/VQA,
``PythonEvaluationTools/vqaEvaluation/vqaEval.py``; Antol et al. 2015, section 2), and the soft targets used to
train for it.

The official rule: the prediction has tabs and newlines turned into spaces and is stripped, then goes through
:func:`process_punctuation` and :func:`process_digit_article`. The annotators' answers go through
:func:`process_punctuation` only, and only when they are not all the same string; ten identical answers are
compared raw (the maintainers keep this for answers that read text off the image). For each annotator, the
prediction scores min(1, number of the *other* annotators who gave it / 3); the scores are averaged.

The official code's quirks are reproduced because the published numbers include them:
  * the period rule ``(?!<=\\d)(\\.)(?!\\d)`` means to look behind but looks ahead for the text "<=digit", so a
    period is removed wherever no digit follows it, after a digit too ("3." -> "3");
  * it passes ``re.UNICODE`` (32) where ``re.sub`` takes its count: at most 32 periods are removed;
  * a punctuation mark that touches a space anywhere in the answer is deleted everywhere, otherwise replaced by a
    space; when a digit,digit comma appears anywhere, every punctuation mark is deleted;
  * the list of punctuation marks is the official one (``; : / ' [ ] " ( ) = + \\ _ > < @ ` , ?``): ``%``, ``$``,
    ``#``, ``&``, ``*``, ``^``, ``~``, ``|``, ``!``, ``-``, ``{``, ``}`` are kept;
  * the contraction table is the official one, curly apostrophes included; its upper-case keys ("Im", "Ive")
    never match because words are lower-cased first.

Training may use any target normalisation, but the answer vocabulary is built with :func:`normalize_answer`,
the official prediction-side processing, so that a predicted vocabulary entry is scored as the official code
scores it.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

_NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                 "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
_ARTICLES = {"a", "an", "the"}
_PUNCTUATION = (";", ":", "/", "'", "[", "]", '"', "(", ")", "=", "+", "\\", "_", ">", "<", "@", "`", ",", "?")
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")  # sic: see the module docstring
_DIGIT_COMMA = re.compile(r"(\d)(,)(\d)")
_OFFICIAL_PERIOD_COUNT = re.UNICODE  # sic: the official code passes the flag where re.sub takes its count

# The official contraction table as "key value" pairs (’ is U+2019, as in the official file).
_CONTRACTIONS = dict(line.split() for line in """
aint ain't
arent aren't
cant can't
couldve could've
couldnt couldn't
couldn'tve couldn’t’ve
couldnt’ve couldn’t’ve
didnt didn’t
doesnt doesn’t
dont don’t
hadnt hadn’t
hadnt’ve hadn’t’ve
hadn'tve hadn’t’ve
hasnt hasn’t
havent haven’t
hed he’d
hed’ve he’d’ve
he’dve he’d’ve
hes he’s
howd how’d
howll how’ll
hows how’s
Id’ve I’d’ve
I’dve I’d’ve
Im I’m
Ive I’ve
isnt isn’t
itd it’d
itd’ve it’d’ve
it’dve it’d’ve
itll it’ll
let’s let’s
maam ma’am
mightnt mightn’t
mightnt’ve mightn’t’ve
mightn’tve mightn’t’ve
mightve might’ve
mustnt mustn’t
mustve must’ve
neednt needn’t
notve not’ve
oclock o’clock
oughtnt oughtn’t
ow’s’at ’ow’s’at
’ows’at ’ow’s’at
’ow’sat ’ow’s’at
shant shan’t
shed’ve she’d’ve
she’dve she’d’ve
she’s she’s
shouldve should’ve
shouldnt shouldn’t
shouldnt’ve shouldn’t’ve
shouldn’tve shouldn’t’ve
somebody’d somebodyd
somebodyd’ve somebody’d’ve
somebody’dve somebody’d’ve
somebodyll somebody’ll
somebodys somebody’s
someoned someone’d
someoned’ve someone’d’ve
someone’dve someone’d’ve
someonell someone’ll
someones someone’s
somethingd something’d
somethingd’ve something’d’ve
something’dve something’d’ve
somethingll something’ll
thats that’s
thered there’d
thered’ve there’d’ve
there’dve there’d’ve
therere there’re
theres there’s
theyd they’d
theyd’ve they’d’ve
they’dve they’d’ve
theyll they’ll
theyre they’re
theyve they’ve
twas ’twas
wasnt wasn’t
wed’ve we’d’ve
we’dve we’d’ve
weve we've
werent weren’t
whatll what’ll
whatre what’re
whats what’s
whatve what’ve
whens when’s
whered where’d
wheres where's
whereve where’ve
whod who’d
whod’ve who’d’ve
who’dve who’d’ve
wholl who’ll
whos who’s
whove who've
whyll why’ll
whyre why’re
whys why’s
wont won’t
wouldve would’ve
wouldnt wouldn’t
wouldnt’ve wouldn’t’ve
wouldn’tve wouldn’t’ve
yall y’all
yall’ll y’all’ll
y’allll y’all’ll
yall’d’ve y’all’d’ve
y’alld’ve y’all’d’ve
y’all’dve y’all’d’ve
youd you’d
youd’ve you’d’ve
you’dve you’d’ve
youll you’ll
youre you’re
youve you’ve
""".strip().splitlines())


def process_punctuation(text: str) -> str:
    """The official ``processPunctuation``: each official punctuation mark is deleted everywhere if it touches a
    space anywhere in ``text`` (or if a digit,digit comma appears anywhere), otherwise replaced by a space; then
    up to 32 periods not followed by a digit are removed. "1,000" -> "1000", "x/y z/ w" -> "xy z w"."""
    out = text
    delete_all = _DIGIT_COMMA.search(text) is not None
    for mark in _PUNCTUATION:
        touches_space = mark + " " in text or " " + mark in text
        out = out.replace(mark, "" if touches_space or delete_all else " ")
    return _PERIOD.sub("", out, _OFFICIAL_PERIOD_COUNT)


def process_digit_article(text: str) -> str:
    """The official ``processDigitArticle``: lower-case, split on whitespace, number words zero..ten (and "none")
    as digits, articles dropped, contractions from the official table. "Two dogs" -> "2 dogs"."""
    words = [_NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    return " ".join(_CONTRACTIONS.get(w, w) for w in words if w not in _ARTICLES)


def normalize_answer(answer: str) -> str:
    """The official processing of a predicted answer: tabs/newlines to spaces, strip, :func:`process_punctuation`,
    :func:`process_digit_article`. The answer vocabulary and the training targets use it."""
    return process_digit_article(process_punctuation(answer.replace("\n", " ").replace("\t", " ").strip()))


def soft_score(count: int) -> float:
    """Training target of an answer given by ``count`` annotators: min(count / 3, 1) (VQA v2 soft score)."""
    return min(count / 3.0, 1.0)


def vqa_accuracy(prediction: str, references: Sequence[str]) -> float:
    """Accuracy of one predicted answer against the annotators' answers, as the official evaluation scores it
    (see the module docstring).

    Args:
        prediction: the model's answer (any string; processed as the official code processes predictions).
        references: every annotator's answer, as in the annotation file (10 in VQA v2). With a single reference
            (datasets such as easy-VQA, with one correct answer per question), where the official leave-one-out
            rule would always give 0, a match of the processed prediction with the reference scores 1.
    Returns:
        float in [0, 1]: the mean over annotators of min(1, matches among the other annotators / 3).
    Raises:
        ValueError: no references.
    """
    if not references:
        raise ValueError("vqa_accuracy needs at least one reference answer")
    pred = normalize_answer(prediction)
    refs = list(references)
    if len(refs) == 1:
        return float(pred == refs[0] or pred == normalize_answer(refs[0]))
    if len(set(refs)) > 1:
        refs = [process_punctuation(r) for r in refs]
    matches = sum(r == pred for r in refs)
    return sum(min(1.0, (matches - (r == pred)) / 3.0) for r in refs) / len(refs)


def answer_targets(references: Sequence[str], answer_to_index: dict[str, int]) -> dict[int, float]:
    """Soft target per answer-vocabulary index from the annotators' answers (each processed with
    :func:`normalize_answer`; answers outside the vocabulary are left out). A single reference gets score 1."""
    counts = Counter(normalize_answer(r) for r in references)
    if len(references) == 1:
        return {answer_to_index[a]: 1.0 for a in counts if a in answer_to_index}
    return {answer_to_index[a]: soft_score(c) for a, c in counts.items() if a in answer_to_index}


__all__ = ["normalize_answer", "process_punctuation", "process_digit_article", "vqa_accuracy", "soft_score",
           "answer_targets"]
