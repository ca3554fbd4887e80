"""The broadened generator (issue 15): 1–6 steps over the original five and 20 more story families
(:data:`MATH_FAMILIES`), split into training families on training seeds
(:func:`train_family_problems`), held-out seeds of the same families
(:func:`eval_family_seed_problems`; a question is held out by its hash, so the two can never share
a question), and held-out scenario families never generated for training
(:func:`heldout_family_problems`). It draws from its own functions, so the original generator
(:mod:`.original`) stays byte-identical."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

from relaxspec.data.mathgen.heldout_stories import _ages, _bus, _legs, _orchard, _tank, _timing
from relaxspec.data.mathgen.original import _batches, _compare, _inventory, _rate, _shopping
from relaxspec.data.mathgen.problem import EVAL_SEED_START, MathProblem, Story, _Retry, _Steps
from relaxspec.data.mathgen.stories import (
    _classroom,
    _coins,
    _diary,
    _fundraiser,
    _garden,
    _parking,
    _party,
    _reading,
    _recipe,
    _savings,
    _sharing,
    _sports,
    _travel,
    _wages,
)
from relaxspec.data.mathgen.words import ALL_NAMES, MORE_DISTRACTORS
from relaxspec.errors import RelaxSpecError

MIN_STEPS, MAX_STEPS = 1, 6
HELDOUT_QUESTION_BUCKETS = 20  # broadened generator: one question in twenty is a held-out seed


MATH_FAMILIES: dict[str, Callable[[random.Random, int], Story]] = {
    # the original five (unchanged functions; here they also get 1 and 6 steps)
    "inventory": _inventory,
    "shopping": _shopping,
    "rate": _rate,
    "compare": _compare,
    "batches": _batches,
    # new
    "diary": _diary,
    "savings": _savings,
    "recipe": _recipe,
    "travel": _travel,
    "garden": _garden,
    "classroom": _classroom,
    "reading": _reading,
    "wages": _wages,
    "sports": _sports,
    "fundraiser": _fundraiser,
    "party": _party,
    "coins": _coins,
    "sharing": _sharing,
    "parking": _parking,
    # held out (below)
    "bus": _bus,
    "legs": _legs,
    "orchard": _orchard,
    "tank": _tank,
    "ages": _ages,
    "timing": _timing,
}
# Never generated for training; each has relatives among the training families (bus: diary and
# parking; legs: coins; orchard: garden and batches; tank: savings; ages: compare; timing: wages).
HELDOUT_MATH_FAMILIES: tuple[str, ...] = ("ages", "bus", "legs", "orchard", "tank", "timing")
TRAIN_MATH_FAMILIES: tuple[str, ...] = tuple(f for f in MATH_FAMILIES if f not in HELDOUT_MATH_FAMILIES)


def is_heldout_question(question: str) -> bool:
    """Broadened generator: whether a question belongs to the held-out-seed split (by its hash)."""
    digest = hashlib.sha1(question.encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_QUESTION_BUCKETS == 0


def _maybe_distract(rng: random.Random, sentences: list[str]) -> None:
    """With probability 0.3, insert a distractor sentence (its number plays no part) after the first."""
    if rng.random() < 0.3:
        template = rng.choice(MORE_DISTRACTORS)
        other = rng.choice(ALL_NAMES)
        sentences.insert(rng.randint(1, len(sentences)), template.format(other=other, n=rng.randint(2, 99)))


def _draw_scenario(rng: random.Random, family: str, n_steps: int) -> tuple[list[str], _Steps, str] | None:
    """One draw of ``family``'s story with ``n_steps`` steps, a distractor maybe inserted:
    ``(sentences, steps, question)``, or None when the draw must be retried."""
    try:
        sentences, steps, question = MATH_FAMILIES[family](rng, n_steps)
    except _Retry:
        return None
    if not MIN_STEPS <= len(steps.lines) <= MAX_STEPS:
        return None
    _maybe_distract(rng, sentences)
    return sentences, steps, question


def generate_family_problem(seed: int, families: Sequence[str] = TRAIN_MATH_FAMILIES) -> MathProblem:
    """The broadened generator's problem for ``seed``: 1–6 steps, a family from ``families``."""
    unknown = set(families) - set(MATH_FAMILIES)
    if unknown or not families:
        raise RelaxSpecError(f"unknown math families: {sorted(unknown)}" if unknown else "no families")
    rng = random.Random(seed)
    for _ in range(1000):
        n_steps = rng.randint(MIN_STEPS, MAX_STEPS)
        family = rng.choice(list(families))
        drawn = _draw_scenario(rng, family, n_steps)
        if drawn is None:
            continue
        sentences, steps, question = drawn
        answer = int(steps.lines[-1].rsplit("= ", 1)[1])
        solution = "\n".join([*steps.lines, f"#### {answer}"])
        text = " ".join([*sentences, question])
        return MathProblem(seed, text, solution, answer, len(steps.lines), family=family)
    raise RuntimeError(f"could not generate a math problem for seed {seed}")  # pragma: no cover


def train_family_problems(n: int, start: int = 0) -> list[MathProblem]:
    """Broadened training problems: training families, seeds from ``start``, held-out questions skipped."""
    out, seed = [], start
    while len(out) < n:
        if seed >= EVAL_SEED_START:
            raise ValueError("training seeds would overlap the evaluation range")
        p = generate_family_problem(seed, TRAIN_MATH_FAMILIES)
        if not is_heldout_question(p.question):
            out.append(p)
        seed += 1
    return out


def eval_family_seed_problems(n: int) -> list[MathProblem]:
    """Held-out seeds of the broadened generator: training families, held-out questions only."""
    out, seed = [], EVAL_SEED_START
    while len(out) < n:
        p = generate_family_problem(seed, TRAIN_MATH_FAMILIES)
        if is_heldout_question(p.question):
            out.append(p)
        seed += 1
    return out


def heldout_family_problems(n: int) -> list[MathProblem]:
    """Held-out scenario families (:data:`HELDOUT_MATH_FAMILIES`: new story types) on the evaluation seeds."""
    return [generate_family_problem(EVAL_SEED_START + i, HELDOUT_MATH_FAMILIES) for i in range(n)]
