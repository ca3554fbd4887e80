"""Phrasing styles: held-out *phrasing* families (issue 15).

The same story (training scenario, same arithmetic, same vocabulary) can be rendered in several
phrasing styles: as written, question first, numbered facts, linked by connectives, small
numbers spelled out as words, or one sentence joined by semicolons. A *phrasing family* is one
(scenario, style) pair. Each training scenario has one style held out (:data:`HELDOUT_PHRASINGS`)
and is trained in all the others, and each style is trained with most scenarios, so a held-out
phrasing family is seen arithmetic and seen wording in a combination never seen in training.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from relaxspec.data.mathgen.families import (
    MATH_FAMILIES,
    MAX_STEPS,
    MIN_STEPS,
    TRAIN_MATH_FAMILIES,
    _draw_scenario,
)
from relaxspec.data.mathgen.problem import EVAL_SEED_START, MathProblem
from relaxspec.errors import RelaxSpecError

PHRASING_STYLES: tuple[str, ...] = (
    "plain",
    "question_first",
    "numbered",
    "connectors",
    "number_words",
    "semicolons",
)
NUMBER_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
_LEAD_INS = ("Here is what happened:", "Use these facts:", "The story:", "What we know:")
_CONNECTORS = ("Then", "After that,", "Next,", "Later,")
# first words that are not names: lower-cased when a sentence continues another
_COMMON_STARTS = frozenset(
    [
        "A",
        "An",
        "The",
        "They",
        "On",
        "At",
        "In",
        "Each",
        "Every",
        "It",
        "There",
        "Afterwards",
        "After",
        "Later",
        "Next",
        "Her",
        "His",
        "Their",
        "One",
        "Some",
        "All",
        "Both",
        "When",
        "During",
        "By",
        "For",
        "To",
        "If",
        "Finally",
        "Half",
        "Twice",
        "Everyone",
        "Nobody",
    ]
)
_SMALL_NUMBER = re.compile(r"\b(1?\d|20)\b")


def _continue(sentence: str) -> str:
    """A sentence as it reads after a connective: its first word lower-cased unless it is a name."""
    first = sentence.split(" ", 1)[0]
    return sentence[:1].lower() + sentence[1:] if first in _COMMON_STARTS else sentence


def render_style(style: str, sentences: list[str], question: str, rng: random.Random) -> str | None:
    """The question text of a story in ``style``, or None where the style would not change it
    (one sentence to number or link, no number up to twenty to spell out)."""
    if style == "plain":
        return " ".join([*sentences, question])
    if style == "question_first":
        return " ".join([question, rng.choice(_LEAD_INS), *sentences])
    if len(sentences) < 2 and style in ("numbered", "connectors", "semicolons"):
        return None
    if style == "numbered":
        return " ".join([*(f"({i}) {s}" for i, s in enumerate(sentences, 1)), question])
    if style == "connectors":
        linked = [sentences[0]]
        for sentence in sentences[1:]:
            if sentence.startswith("Then "):
                linked.append(sentence)
            else:
                linked.append(f"{rng.choice(_CONNECTORS)} {_continue(sentence)}")
        return " ".join([*linked, question])
    if style == "semicolons":
        parts = [sentences[0].rstrip(".")] + [_continue(s).rstrip(".") for s in sentences[1:]]
        return "; ".join(parts) + ". " + question
    if style == "number_words":
        text = " ".join([*sentences, question])
        spelled = _SMALL_NUMBER.sub(lambda m: NUMBER_WORDS[int(m.group())], text)
        return spelled if spelled != text else None
    raise RelaxSpecError(f"unknown phrasing style {style!r}; choose from {', '.join(PHRASING_STYLES)}")


def _phrasing(family: str, style: str) -> str:
    return f"{family}/{style}"


# One held-out style per training scenario, rotating over the non-plain styles in scenario order.
HELDOUT_PHRASINGS: tuple[str, ...] = tuple(
    _phrasing(family, PHRASING_STYLES[1 + i % (len(PHRASING_STYLES) - 1)])
    for i, family in enumerate(sorted(TRAIN_MATH_FAMILIES))
)
TRAIN_PHRASINGS: tuple[str, ...] = tuple(
    _phrasing(family, style)
    for family in sorted(TRAIN_MATH_FAMILIES)
    for style in PHRASING_STYLES
    if _phrasing(family, style) not in HELDOUT_PHRASINGS
)


def generate_styled_problem(seed: int, phrasings: Sequence[str] = TRAIN_PHRASINGS) -> MathProblem:
    """The problem for ``seed`` from one (scenario, style) phrasing family of ``phrasings``.

    ``family`` of the result is ``"<scenario>/<style>"``; the solution is the scenario's own.
    """
    valid = {_phrasing(f, st) for f in MATH_FAMILIES for st in PHRASING_STYLES}
    unknown = set(phrasings) - valid
    if unknown or not phrasings:
        raise RelaxSpecError(f"unknown phrasing families: {sorted(unknown)}" if unknown else "no phrasings")
    rng = random.Random(seed)
    phrasing = rng.choice(list(phrasings))
    family, style = phrasing.split("/")
    for _ in range(1000):
        n_steps = rng.randint(MIN_STEPS, MAX_STEPS)
        drawn = _draw_scenario(rng, family, n_steps)
        if drawn is None:
            continue
        sentences, steps, question = drawn
        text = render_style(style, sentences, question, rng)
        if text is None:
            continue
        answer = int(steps.lines[-1].rsplit("= ", 1)[1])
        solution = "\n".join([*steps.lines, f"#### {answer}"])
        return MathProblem(seed, text, solution, answer, len(steps.lines), family=phrasing)
    raise RuntimeError(f"could not generate a styled math problem for seed {seed}")  # pragma: no cover


def train_styled_problems(n: int, start: int = 0) -> list[MathProblem]:
    """Training problems over :data:`TRAIN_PHRASINGS`, seeds ``start .. start + n - 1``."""
    if start + n > EVAL_SEED_START:
        raise ValueError("training seeds would overlap the evaluation range")
    return [generate_styled_problem(seed, TRAIN_PHRASINGS) for seed in range(start, start + n)]


def heldout_phrasing_problems(n: int) -> list[MathProblem]:
    """Held-out phrasing families (:data:`HELDOUT_PHRASINGS`) on the evaluation seeds."""
    return [generate_styled_problem(EVAL_SEED_START + i, HELDOUT_PHRASINGS) for i in range(n)]
