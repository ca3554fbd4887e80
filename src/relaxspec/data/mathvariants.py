"""Math problems with several correct solution paths and phrasings (issue 29).

:mod:`relaxspec.data.mathgen` writes one solution per problem; a real model is uncertain among many
correct ways to write the same reasoning, the regime relaxed verification exploits. Here each
solution is re-rendered with a variant drawn per example (:func:`vary_solution`): any order of
independent steps that respects their dependencies (:func:`step_order`), the step wording
(:data:`STEP_STYLES`, optional connectives), ``a * b = c`` or ``a*b=c``, and an optional closing
sentence before ``#### N``. The arithmetic and the answer never change. Problems come from the
phrasing-style generator (:func:`mathgen.generate_styled_problem`). Splits: training phrasings on
training seeds with held-out questions skipped (:func:`mathgen.is_heldout_question`); held-out
seeds, scenario families and phrasing families on the evaluation seeds. Models: docs/models.md.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import replace

from relaxspec.data.mathgen import (
    ALL_NAMES,
    EVAL_SEED_START,
    HELDOUT_PHRASINGS,
    TRAIN_PHRASINGS,
    MathProblem,
    generate_styled_problem,
    heldout_family_problems,
    is_heldout_question,
)

STEP_STYLES = ("colon", "equals", "trailing", "numbered", "bare")
_STEP = re.compile(r"^(?P<label>.+): (?P<a>\d+) (?P<op>[-+*/]) (?P<b>\d+) = (?P<c>\d+)$")
_CONNECTIVES = ("Then", "Next,", "So")
_CLOSINGS = ("So the answer is {n}.", "The answer is {n}.", "Answer: {n}.")
TRAIN_SEED_START = 300_000  # variant rows use other training questions than math_styles_train


def parse_steps(solution: str) -> list[tuple[str, int, str, int, int]]:
    """``(label, a, op, b, c)`` of each ``Label: a op b = c`` line of a mathgen solution."""
    out = []
    for line in solution.splitlines():
        m = _STEP.match(line)
        if m:
            out.append((m["label"], int(m["a"]), m["op"], int(m["b"]), int(m["c"])))
    return out


def step_deps(steps: list[tuple[str, int, str, int, int]]) -> list[set[int]]:
    """Per step, the earlier steps whose results it uses: a step depends on an earlier one when one
    of its operands equals that step's result (conservative: a coincidence only adds a dependency)."""
    return [{i for i in range(j) if steps[i][4] in (steps[j][1], steps[j][3])} for j in range(len(steps))]


def step_order(steps: list[tuple[str, int, str, int, int]], r: random.Random) -> list[int]:
    """A random order of the steps in which each follows every earlier step whose result it uses
    (:func:`step_deps`), with the last step kept last."""
    n = len(steps)
    deps = step_deps(steps)
    done: list[int] = []
    while len(done) < n - 1:
        ready = [j for j in range(n - 1) if j not in done and deps[j] <= set(done)]
        done.append(r.choice(ready))
    return [*done, n - 1] if n else []


def _lower(label: str) -> str:
    """The label as it reads mid-sentence: first letter lower-cased unless it starts with a name."""
    first = re.split(r"[ ']", label, maxsplit=1)[0]
    return label if first in ALL_NAMES else label[:1].lower() + label[1:]


def render_step(label: str, eq: str, style: str, index: int, connective: str) -> str:
    """One solution line in ``style`` (``index`` counts from 1; ``connective`` may be empty)."""
    if style == "bare":
        return eq
    if style == "trailing":
        return f"{eq} ({_lower(label)})"
    if style == "numbered":
        return f"Step {index}: {_lower(label)} = {eq}"
    lead = f"{connective} {_lower(label)}" if connective else label
    return f"{lead}: {eq}" if style == "colon" else f"{lead} = {eq}"


def vary_solution(
    problem: MathProblem,
    r: random.Random,
    quotes: list[list[str]] | None = None,
    order: list[int] | None = None,
) -> str:
    """A correct solution of ``problem`` in a drawn order, wording and equation style; ``quotes``
    (lines per step of the generator's solution, :mod:`mathquotes`) go above their step, and
    ``order`` (indices of those steps) replaces the drawn order."""
    steps = parse_steps(problem.solution)
    style = r.choice(STEP_STYLES)
    compact = r.random() < 0.25
    use_connectives = style in ("colon", "equals") and r.random() < 0.4
    lines = []
    for index, j in enumerate(step_order(steps, r) if order is None else order, 1):
        label, a, op, b, c = steps[j]
        eq = f"{a}{op}{b}={c}" if compact else f"{a} {op} {b} = {c}"
        connective = r.choice(_CONNECTIVES) if use_connectives and index > 1 and r.random() < 0.5 else ""
        lines.extend(quotes[j] if quotes else [])
        lines.append(render_step(label, eq, style, index, connective))
    if r.random() < 0.3:
        lines.append(r.choice(_CLOSINGS).format(n=problem.answer))
    return "\n".join([*lines, f"#### {problem.answer}"])


def with_variant(problem: MathProblem) -> MathProblem:
    """``problem`` with its solution re-rendered by a variant drawn from its seed."""
    r = random.Random(f"mathvar-{problem.seed}-{problem.family}")
    return replace(problem, solution=vary_solution(problem, r))


def train_variant_problems(
    n: int, start: int = TRAIN_SEED_START, render: Callable[[MathProblem], MathProblem] = with_variant
) -> list[MathProblem]:
    """``n`` training problems (training phrasings, held-out questions skipped), each re-rendered by
    ``render`` (a variant; :func:`mathquotes.with_quotes` a variant that quotes its facts)."""
    out, seed = [], start
    while len(out) < n:
        if seed >= EVAL_SEED_START:
            raise ValueError("training seeds would overlap the evaluation range")
        p = generate_styled_problem(seed, TRAIN_PHRASINGS)
        if not is_heldout_question(p.question):
            out.append(render(p))
        seed += 1
    return out


def heldout_seed_variant_problems(n: int) -> list[MathProblem]:
    """Held-out seeds: training phrasings, evaluation seeds, held-out questions only."""
    out, seed = [], EVAL_SEED_START
    while len(out) < n:
        p = generate_styled_problem(seed, TRAIN_PHRASINGS)
        if is_heldout_question(p.question):
            out.append(with_variant(p))
        seed += 1
    return out


def heldout_family_variant_problems(n: int) -> list[MathProblem]:
    """Held-out scenario families (new story types), as in :func:`mathgen.heldout_family_problems`."""
    return [with_variant(p) for p in heldout_family_problems(n)]


def heldout_phrasing_variant_problems(n: int) -> list[MathProblem]:
    """Held-out (scenario, style) phrasing families on the evaluation seeds."""
    return [with_variant(generate_styled_problem(EVAL_SEED_START + i, HELDOUT_PHRASINGS)) for i in range(n)]
