"""Why a math answer is wrong: the arithmetic inside a step, or the plan (issue 29).

A wrong answer to a generated word problem (:mod:`relaxspec.data.mathgen`) fails in one of four
ways, told apart from the completion's equations ``a op b = c`` and the reference solution's:

- ``arithmetic``: some equation the model wrote is false (``83 - 16 = 76``);
- ``extra step``: every equation is true, but there are more of them than the reference has
  (a fact used twice, or a step after the last);
- ``missing step``: every equation is true, fewer than the reference (a fact skipped, or an early
  stop);
- ``wrong operand``: every equation is true and their number is right, but some operand is not the
  one the problem calls for (a number misread or carried from the wrong step).

:func:`classify` names one completion's failure; :func:`bench_failures` tallies a bench run's
wrong answers per (method, dataset) (``scripts/math_failures.py``). Which kind dominates decides
what training data could help (docs/models.md).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

KINDS = ("arithmetic", "extra step", "missing step", "wrong operand")
_EQUATION = re.compile(r"(\d+)\s*([-+*/])\s*(\d+)\s*=\s*(\d+)")


def equations(text: str) -> list[tuple[int, str, int, int]]:
    """Every ``a op b = c`` in ``text`` (non-negative integers), in order."""
    return [(int(a), op, int(b), int(c)) for a, op, b, c in _EQUATION.findall(text)]


def is_true(a: int, op: str, b: int, c: int) -> bool:
    """``a op b == c`` exactly (division by zero is false)."""
    if op == "/":
        return b != 0 and Fraction(a, b) == c
    return {"+": a + b, "-": a - b, "*": a * b}[op] == c


def classify(completion: str, reference: str) -> str:
    """The kind of failure (one of :data:`KINDS`) of a completion whose answer is wrong, given
    the reference solution's text."""
    written = equations(completion)
    if not all(is_true(*eq) for eq in written):
        return "arithmetic"
    expected = len(equations(reference))
    if len(written) > expected:
        return "extra step"
    if len(written) < expected:
        return "missing step"
    return "wrong operand"


def bench_failures(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], Counter[str]]:
    """Failure kinds of a bench run's wrong math answers, per (method, dataset); records of the
    generated math datasets only (their examples are rebuilt to read each reference solution).
    Every cell gets ``total`` and ``wrong`` beside the kinds."""
    from relaxspec.eval.datasets import load_examples

    scored = [r for r in records if r.get("metric") == "exact_match" and r.get("quality") is not None]
    references: dict[str, dict[str, str | None]] = {}
    for dataset in sorted({r["cell"]["dataset"] for r in scored}):
        n = len({r["example"] for r in scored if r["cell"]["dataset"] == dataset})
        references[dataset] = {e.id: e.reference for e in load_examples(dataset, n)}
    out: dict[tuple[str, str], Counter[str]] = {}
    for r in scored:
        dataset = r["cell"]["dataset"]
        reference = references[dataset].get(r["example"])
        if reference is None:
            continue
        cell = out.setdefault((r["cell"]["method"], dataset), Counter())
        cell["total"] += 1
        if r["quality"] < 1:
            cell["wrong"] += 1
            cell[classify(r["text"], reference)] += 1
    return out
