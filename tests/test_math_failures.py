"""Why math answers fail (relaxspec.eval.math_failures): each kind told apart, and a bench run's
wrong answers tallied against the rebuilt reference solutions."""

from __future__ import annotations

from relaxspec.eval.datasets import load_examples
from relaxspec.eval.math_failures import KINDS, bench_failures, classify, equations, is_true

REFERENCE = "Children in total: 5 * 20 = 100\nPresent: 100 - 17 = 83\nNow: 83 + 8 = 91\n#### 91"


def test_equations_and_their_truth():
    text = "a: 5*20=100\nb: 100 - 17 = 83 (left)\n#### 83"
    assert equations(text) == [(5, "*", 20, 100), (100, "-", 17, 83)]
    assert is_true(44, "/", 2, 22) and not is_true(45, "/", 2, 22) and not is_true(4, "/", 0, 0)
    assert not is_true(83, "-", 16, 76) and is_true(83, "-", 16, 67) and is_true(6, "*", 7, 42)


def test_each_kind_of_failure():
    assert classify("5 * 20 = 100\n100 - 17 = 73\n73 + 8 = 81\n#### 81", REFERENCE) == "arithmetic"
    extra = "5 * 20 = 100\n100 - 17 = 83\n83 + 8 = 91\n91 + 8 = 99\n#### 99"
    assert classify(extra, REFERENCE) == "extra step"
    assert classify("5 * 20 = 100\n100 - 17 = 83\n#### 83", REFERENCE) == "missing step"
    assert classify("5 * 20 = 100\n100 - 16 = 84\n84 + 8 = 92\n#### 92", REFERENCE) == "wrong operand"
    # A false equation is arithmetic whatever else is wrong; no equation at all is a missing step.
    false_then_more = "5 * 20 = 100\n100 - 17 = 83\n83 + 8 = 90\n90 + 1 = 91\n#### 91"
    assert classify(false_then_more, REFERENCE) == "arithmetic"
    assert classify("#### 7", REFERENCE) == "missing step"
    assert set(KINDS) == {"arithmetic", "extra step", "missing step", "wrong operand"}


def test_bench_failures_tallies_wrong_answers_per_cell_against_the_generated_references():
    examples = load_examples("mathvar", 3)
    assert all(e.reference and e.reference.endswith(f"#### {e.answer}") for e in examples)
    first = examples[0].reference
    lines = first.splitlines()
    missing = "\n".join([*lines[:-2], "#### 0"]) if len(lines) > 2 else "#### 0"

    def record(example, text, quality, method="ar", metric="exact_match"):
        cell = {"method": method, "dataset": "mathvar"}
        return {"cell": cell, "example": example.id, "text": text, "quality": quality, "metric": metric}

    records = [
        record(examples[0], first, 1.0),
        record(examples[1], "1 + 1 = 3\n#### 3", 0.0),
        record(examples[0], missing, 0.0, method="nsd"),
        record(examples[2], "anything", None),  # unscored: skipped
        record(examples[2], "x", 0.0, metric="pass@1"),  # not a math metric: skipped
    ]
    got = bench_failures(records)
    assert got[("ar", "mathvar")] == {"total": 2, "wrong": 1, "arithmetic": 1}
    assert got[("nsd", "mathvar")] == {"total": 1, "wrong": 1, "missing step": 1}
