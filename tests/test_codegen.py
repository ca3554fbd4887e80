"""Synthetic code tasks: determinism, disjoint splits, and tests that accept exactly the right body."""

from __future__ import annotations

import ast
import re
from collections import Counter

import pytest

from relaxspec.data.codegen import (
    EVAL_SEED_START,
    FAMILIES,
    HELDOUT_FAMILIES,
    TRAIN_FAMILIES,
    eval_tasks,
    generate_task,
    heldout_family_tasks,
    is_heldout_spec,
    train_tasks,
)
from relaxspec.errors import RelaxSpecError


def _one_per_family(families, start: int = 0) -> dict:
    found, seed = {}, start
    while len(found) < len(families):
        task = generate_task(seed, families)
        found.setdefault(task.family, task)
        seed += 1
    return found


@pytest.fixture(scope="module")
def sample():
    """About 30 tasks of every family (training and held-out seeds, held-out families)."""
    tasks = [generate_task(s) for s in range(0, 1700)]
    tasks += [generate_task(EVAL_SEED_START + s, HELDOUT_FAMILIES) for s in range(360)]
    counts = Counter(t.family for t in tasks)
    assert set(counts) == set(FAMILIES) and min(counts.values()) >= 10
    return tasks


def _passes(task, body: str) -> bool:
    """Run the task's tests on ``body`` in this process (our own generated code, not a model's)."""
    namespace: dict = {}
    try:
        exec(
            compile(f"{task.prompt}{body}\n\n{task.test}\ncheck({task.entry_point})\n", "t", "exec"),
            namespace,
        )
    except Exception:
        return False
    return True


def test_families_and_splits_by_family():
    assert len(FAMILIES) >= 30 and len(HELDOUT_FAMILIES) >= 8
    assert set(TRAIN_FAMILIES) | set(HELDOUT_FAMILIES) == set(FAMILIES)
    assert not set(TRAIN_FAMILIES) & set(HELDOUT_FAMILIES)
    with pytest.raises(RelaxSpecError, match="unknown code task families"):
        generate_task(0, ["nope"])


def test_deterministic_by_seed():
    for seed in (0, 1, 99, 123_456, EVAL_SEED_START + 3):
        assert generate_task(seed) == generate_task(seed)
    assert train_tasks(40) == train_tasks(40)
    assert eval_tasks(10) == eval_tasks(10)
    assert heldout_family_tasks(10) == heldout_family_tasks(10)
    assert len({t.prompt for t in train_tasks(200)}) > 190  # seeds give different tasks


def test_task_shape(sample):
    for task in sample:
        assert task.prompt.startswith(f"def {task.entry_point}(") and task.prompt.endswith('"""')
        assert task.solution.startswith("\n    ") and not task.solution.endswith("\n")
        body = task.solution.splitlines()[1:]
        assert 1 <= len(body) <= 6 and all(line.startswith("    ") for line in body)
        assert task.text == task.prompt + task.solution
        assert task.test.startswith("def check(candidate):\n")
        assert task.test.count("    assert candidate(") >= 4
        assert task.problem["prompt"] == task.prompt and task.problem["entry_point"] == task.entry_point
        assert task.task_id == f"synthcode/{task.family}/{task.seed}"
        ast.parse(task.text)


def test_splits_are_disjoint_by_seed_and_spec():
    train = train_tasks(6000)
    held = eval_tasks(200)
    fams = heldout_family_tasks(200)
    assert {t.family for t in train} == set(TRAIN_FAMILIES)
    assert {t.family for t in held} <= set(TRAIN_FAMILIES)
    assert {t.family for t in fams} == set(HELDOUT_FAMILIES)
    assert max(t.seed for t in train) < EVAL_SEED_START <= min(t.seed for t in held + fams)
    assert all(is_heldout_spec(t.spec) for t in held)
    assert not any(is_heldout_spec(t.spec) for t in train)
    train_specs, train_prompts = {t.spec for t in train}, {t.prompt for t in train}
    assert not train_specs & {t.spec for t in held + fams}
    assert not train_prompts & {t.prompt for t in held + fams}
    # a held-out family's canonical body never appears verbatim in the training stream
    train_bodies = {t.solution for t in train}
    assert not train_bodies & {t.solution for t in fams}
    assert not {t.family for t in train} & set(HELDOUT_FAMILIES)


def test_every_canonical_body_passes_its_tests(sample):
    failed = [t.task_id for t in sample if not _passes(t, t.solution)]
    assert not failed


_INT = re.compile(r"(?<![\w.])\d+")
_CMP = re.compile(r"([<>]=?) (-?\d+)")


def _mutants(task) -> list[str]:
    """Wrong bodies: a constant return, the first integer literal + 1, a boundary comparison."""
    body = task.solution
    first = task.test.split(" == ", 1)[1].split("\n", 1)[0]
    out = [f"\n    return {first}"]
    m = _INT.search(body)
    if m:
        out.append(body[: m.start()] + str(int(m.group()) + 1) + body[m.end() :])
    m = _CMP.search(body)
    if m:
        flip = {">": ">=", ">=": ">", "<": "<=", "<=": "<"}[m.group(1)]
        out.append(body[: m.start()] + f"{flip} {m.group(2)}" + body[m.end() :])
    return out


def test_wrong_bodies_fail_their_tests(sample):
    survivors = [
        (t.task_id, mutant)
        for t in sample
        for mutant in _mutants(t)
        if mutant != t.solution and _passes(t, mutant)
    ]
    assert not survivors, survivors[:5]


@pytest.mark.slow  # a sandboxed process per task
def test_sandbox_scores_canonical_and_wrong_bodies():
    """Through the HumanEval path of the sandbox: one task per family (about 0.1 s each)."""
    from relaxspec.eval.sandbox import check_completion

    tasks = list(_one_per_family(TRAIN_FAMILIES).values()) + list(_one_per_family(HELDOUT_FAMILIES).values())
    for task in tasks:
        result = check_completion(task.problem, task.solution)
        assert result.passed, (task.task_id, result.detail)
    for task in tasks[::6]:
        assert not check_completion(task.problem, _mutants(task)[0]).passed
