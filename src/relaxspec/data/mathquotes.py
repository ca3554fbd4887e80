"""Math solutions that walk the question's facts in order, quoting each one or not (issue 29).

Most wrong answers of the variant-trained target are *plan* errors, not arithmetic: a number read
from the wrong fact, a fact skipped, a stop before the last one (docs/models.md, "Why the math
answers fail"). Here a solution quotes every clause of the question that states a number, in
order, one ``> clause`` line each (``(not needed)`` after a distractor), and writes each step as
soon as the clauses it needs are quoted, worded as a :mod:`mathvariants` variant. So the next fact
is always the next clause, and the numbers a step uses sit just above it. A number is *new* when
no earlier step (in the generator's order) produced it; it is traced to a clause as a digit
string, a spelled number (``twelve``) or a multiplier word (``doubles``, ``half``). A problem whose
numbers cannot all be traced keeps its plain variant. :func:`ordered_solution` writes the same
walk without the quote lines (steps in the order the question states their facts). Training seeds
from :data:`QUOTE_SEED_START`; scored on :mod:`mathvariants`' held-out sets (the same prompts).
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from relaxspec.data.mathgen import NUMBER_WORDS, MathProblem
from relaxspec.data.mathvariants import parse_steps, step_deps, train_variant_problems, vary_solution

QUOTE_SEED_START = 600_000  # other questions than mathvar's training rows (from 300 000)
_SENTENCE_END = re.compile(r"(?<=[.;:?])\s+")
_NUMBERED = re.compile(r"^\(\d+\)\s*")
_SUBCLAUSE = re.compile(r",? and |, ")
_WORD_VALUES = {w: i for i, w in enumerate(NUMBER_WORDS)} | {
    "doubles": 2,
    "double": 2,
    "twice": 2,
    "half": 2,
    "halves": 2,
    "triples": 3,
}
_TOKEN = re.compile(r"\d+|[A-Za-z]+")


def clause_numbers(clause: str) -> list[int]:
    """The numbers a clause states: digit strings, spelled numbers and multiplier words."""
    out = []
    for token in _TOKEN.findall(clause):
        if token.isdigit():
            out.append(int(token))
        elif token.lower() in _WORD_VALUES:
            out.append(_WORD_VALUES[token.lower()])
    return out


def question_clauses(question: str) -> list[str]:
    """The fact clauses of a question, in order: sentences (split at ``. ; : ?``) without the
    asked sentence, lead-ins or ``(n)`` numbers, each split at ``,`` / ``and`` where every part
    states a number (``Ann has 3 pens and Bo has 4 pens`` is two facts)."""
    clauses = []
    for sentence in _SENTENCE_END.split(question.strip()):
        sentence = _NUMBERED.sub("", sentence).rstrip(".;:").strip()
        if not sentence or sentence.endswith("?") or not clause_numbers(sentence):
            continue
        parts = [p.strip() for p in _SUBCLAUSE.split(sentence)]
        clauses.extend(parts if all(clause_numbers(p) for p in parts) else [sentence])
    return clauses


def _pick(holders: list[int], used: set[int]) -> int:
    """The first clause not yet quoted among ``holders``, else the first."""
    return next((i for i in holders if i not in used), holders[0])


def quote_plan(problem: MathProblem, clauses: list[str]) -> list[list[int]] | None:
    """For each step of ``problem``'s generator solution, the indices of the ``clauses`` (of its
    question) its new numbers come from: one clause stating all of them if there is one, else a
    clause per number; among several, the earliest not yet quoted. None when a new number is stated
    by no clause (or the solution is not the generator's ``Label: a op b = c`` lines)."""
    steps = parse_steps(problem.solution)
    if len(steps) != problem.steps:
        return None
    numbers = [clause_numbers(c) for c in clauses]
    results: set[int] = set()
    used: set[int] = set()
    plan = []
    for _label, a, _op, b, c in steps:
        new = [v for v in (a, b) if v not in results]
        both = [i for i, ns in enumerate(numbers) if new and all(ns.count(v) >= new.count(v) for v in new)]
        if both:
            picked = [_pick(both, used)]
        else:
            holders = [[i for i, ns in enumerate(numbers) if v in ns] for v in new]
            if not all(holders):
                return None
            picked = sorted({_pick(h, used) for h in holders})
        used.update(picked)
        plan.append(picked)
        results.add(c)
    return plan


def _ready(problem: MathProblem, plan: list[list[int]]) -> list[int]:
    """Per generator step, the last clause it needs: its own quoted clauses and, through the steps
    whose results it uses (:func:`mathvariants.step_deps`), theirs."""
    ready: list[int] = []
    for j, deps in enumerate(step_deps(parse_steps(problem.solution))):
        ready.append(max([*plan[j], *(ready[i] for i in deps), 0]))
    return ready


def walk_order(problem: MathProblem) -> tuple[list[list[str]], list[int]] | None:
    """The walk through ``problem``'s clauses: per generator step the ``> clause`` lines quoted just
    above it (``(not needed)`` after one no step uses), and the step order, each step written as soon
    as the clauses it needs are quoted (:func:`_ready`; ties in the generator's order). None when the
    plan cannot be traced (:func:`quote_plan`)."""
    clauses = question_clauses(problem.question)
    plan = quote_plan(problem, clauses)
    if plan is None:
        return None
    used = {i for step in plan for i in step}
    lines = [f"> {c}" if i in used else f"> {c} (not needed)" for i, c in enumerate(clauses)]
    ready = _ready(problem, plan)
    order = sorted(range(len(plan)), key=lambda j: (ready[j], j))  # ready never decreases along it
    quotes: list[list[str]] = [[] for _ in plan]
    start = 0
    for n, j in enumerate(order):
        end = len(clauses) if n == len(order) - 1 else ready[j] + 1  # the last step takes the rest
        quotes[j], start = lines[start:end], end
    return quotes, order


def quote_solution(problem: MathProblem, r: random.Random) -> str:
    """A solution that walks the question's clauses in order (:func:`walk_order`), quoting each
    clause above the first step that needs it, worded as a variant (:func:`vary_solution`). The
    plain variant when the plan cannot be traced."""
    walk = walk_order(problem)
    if walk is None:
        return vary_solution(problem, r)
    quotes, order = walk
    return vary_solution(problem, r, quotes=quotes, order=order)


def ordered_solution(problem: MathProblem, r: random.Random) -> str:
    """The walk of :func:`quote_solution` without its quote lines: the steps in the order the
    question states their facts, worded as a variant. The plain variant when it cannot be traced."""
    walk = walk_order(problem)
    return vary_solution(problem, r) if walk is None else vary_solution(problem, r, order=walk[1])


def with_quotes(problem: MathProblem) -> MathProblem:
    """``problem`` with a quoted variant solution drawn from its seed."""
    r = random.Random(f"mathquote-{problem.seed}-{problem.family}")
    return replace(problem, solution=quote_solution(problem, r))


def train_quote_problems(n: int, start: int = QUOTE_SEED_START) -> list[MathProblem]:
    """``n`` training problems (training phrasings, held-out questions skipped), solutions quoted."""
    return train_variant_problems(n, start, with_quotes)


def with_order(problem: MathProblem) -> MathProblem:
    """``problem`` with an ordered variant solution (no quotes) drawn from its seed."""
    r = random.Random(f"mathorder-{problem.seed}-{problem.family}")
    return replace(problem, solution=ordered_solution(problem, r))


def train_ordered_problems(n: int, start: int = QUOTE_SEED_START) -> list[MathProblem]:
    """``n`` training problems (the questions of :func:`train_quote_problems`), steps in the order
    the question states their facts, no quotes."""
    return train_variant_problems(n, start, with_order)
