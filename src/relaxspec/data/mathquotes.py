"""Math solutions that quote the fact each step uses (issue 29).

Most wrong answers of the variant-trained target are *plan* errors, not arithmetic: a number read
from the wrong fact, a fact skipped, a stop before the last one (docs/models.md, "Why the math
answers fail"). Here every step of a variant solution (:func:`mathvariants.vary_solution`) is
preceded by the clauses of the question its new numbers come from, one ``> clause`` line each, so
the number a step uses sits in the line above it and a fact left unquoted is visible. A number is
*new* when no earlier step (in the generator's order) produced it; it is looked up in the
question's clauses as a digit string, a spelled number (``twelve``) or a multiplier word
(``doubles``, ``half``). A problem whose numbers cannot all be traced keeps its plain variant.
Training seeds from :data:`QUOTE_SEED_START`; the held-out sets are :mod:`mathvariants`' (same
prompts, so a model trained on quoted rows is scored on the same questions as before).
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from relaxspec.data.mathgen import NUMBER_WORDS, MathProblem
from relaxspec.data.mathvariants import parse_steps, train_variant_problems, vary_solution

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


def quote_plan(problem: MathProblem) -> list[list[int]] | None:
    """For each step of ``problem``'s generator solution, the indices of the clauses its new numbers
    come from: one clause stating all of them if there is one, else a clause per number; among
    several, the earliest not yet quoted. None when a new number is stated by no clause (or the
    solution is not the generator's ``Label: a op b = c`` lines)."""
    steps = parse_steps(problem.solution)
    if len(steps) != problem.steps:
        return None
    clauses = question_clauses(problem.question)
    numbers = [clause_numbers(c) for c in clauses]
    results: set[int] = set()
    used: set[int] = set()
    plan = []
    for _label, a, _op, b, c in steps:
        new = [v for v in (a, b) if v not in results]
        both = [i for i, ns in enumerate(numbers) if new and all(ns.count(v) >= new.count(v) for v in new)]
        picked = [_pick(both, used)] if both else []
        for value in new if not both else []:
            holders = [i for i, ns in enumerate(numbers) if value in ns]
            if not holders:
                return None
            picked.append(_pick(holders, used))
        used.update(picked)
        plan.append(sorted(set(picked)))
        results.add(c)
    return plan


def quote_solution(problem: MathProblem, r: random.Random) -> str:
    """A variant solution of ``problem`` (:func:`vary_solution`) with each step's clauses quoted
    above it as ``> clause`` lines; the plain variant when the plan cannot be traced."""
    plan = quote_plan(problem)
    if plan is None:
        return vary_solution(problem, r)
    clauses = question_clauses(problem.question)
    quotes = [[f"> {clauses[i]}" for i in step] for step in plan]
    return vary_solution(problem, r, quotes=quotes)


def with_quotes(problem: MathProblem) -> MathProblem:
    """``problem`` with a quoted variant solution drawn from its seed."""
    r = random.Random(f"mathquote-{problem.seed}-{problem.family}")
    return replace(problem, solution=quote_solution(problem, r))


def train_quote_problems(n: int, start: int = QUOTE_SEED_START) -> list[MathProblem]:
    """``n`` training problems (training phrasings, held-out questions skipped), solutions quoted."""
    return train_variant_problems(n, start, with_quotes)
