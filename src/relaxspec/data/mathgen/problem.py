"""A math problem, its prompt format and answer extraction, and the checked solution steps."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_VALUE = 999  # every number in a problem, given or computed, has at most three digits

# Seed ranges: training problems use seeds [0, EVAL_SEED_START); evaluation problems use
# seeds from EVAL_SEED_START on. The ranges never overlap, so the splits are disjoint by seed.
EVAL_SEED_START = 1_000_000_000


@dataclass(frozen=True)
class MathProblem:
    """One problem: ``prompt`` is what the model sees, ``solution`` what it should write."""

    seed: int
    question: str
    solution: str  # step lines then "#### <answer>"
    answer: int
    steps: int
    family: str = ""  # the story family that generated it

    @property
    def prompt(self) -> str:
        return format_prompt(self.question)

    @property
    def text(self) -> str:
        """The full training document: prompt followed by the solution."""
        return f"{self.prompt}\n{self.solution}"


def format_prompt(question: str) -> str:
    """The documented prompt format: ``Question: …\\nAnswer:``."""
    return f"Question: {question}\nAnswer:"


_ANSWER_RE = re.compile(r"####\s*(-?\d+)")


def extract_answer(completion: str) -> int | None:
    """The integer after the first ``####`` in a completion, or None if there is none."""
    match = _ANSWER_RE.search(completion)
    return int(match.group(1)) if match else None


class _Steps:
    """Collects solution lines ``label: a op b = c`` while checking the arithmetic."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, label: str, a: int, op: str, b: int) -> int:
        if op == "/" and (b == 0 or a % b):
            raise _Retry
        result = {"+": a + b, "-": a - b, "*": a * b, "/": a // max(b, 1)}[op]
        if not 0 <= result <= MAX_VALUE:
            raise _Retry
        self.lines.append(f"{label}: {a} {op} {b} = {result}")
        return result


class _Retry(Exception):
    """Raised when a random draw breaks a constraint; the generator draws again."""


def _divisors(n: int, low: int = 2, high: int = 9) -> list[int]:
    return [d for d in range(low, high + 1) if n % d == 0 and n // d > 1]


Story = tuple[list[str], _Steps, str]
