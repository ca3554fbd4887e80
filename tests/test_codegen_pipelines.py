"""Compositional pipeline code tasks: combination splits, determinism, and tests that decide."""

from __future__ import annotations

import ast
import hashlib
import json
import random
from collections import Counter

import pytest

from relaxspec.data import codegen
from relaxspec.data.codegen import (
    EVAL_SEED_START,
    GENERATOR_VERSION,
    HELDOUT_COMBOS,
    PIPELINE_COMBOS,
    TRAIN_COMBOS,
    WORDS,
    generate_pipeline_task,
    heldout_combo_tasks,
    train_pipeline_tasks,
)
from relaxspec.errors import RelaxSpecError
from test_codegen import _mutants, _passes  # the single-family tests' helpers

# sha256 of the existing families' first tasks, taken before the pipelines were added (generator
# version 1): version 2 only adds the pipeline space, so these tasks must not change.
FAMILIES_V1_DIGEST = "2170e38b3cad1d921ac51f64830212ede890f5569355e634b8160028168f9c3b"
# sha256 of the first held-out and training pipeline tasks (text + test) of version 2
PIPELINES_V2_DIGEST = "f50c7f56e04d19d1a0f68d8aef3ac49d3ba32dc34a502a808925737cb589f1a6"


def _parts(combo: str) -> tuple[str, str, str, str]:
    _, kind, f, m, a = combo.split(".")
    return kind, f, m, a


@pytest.fixture(scope="module")
def sample():
    """Training tasks and held-out-combination tasks (every held-out combination several times)."""
    tasks = train_pipeline_tasks(2500) + heldout_combo_tasks(700)
    assert {t.family for t in tasks[2500:]} == set(HELDOUT_COMBOS)
    return tasks


def test_the_families_of_version_1_are_unchanged():
    assert GENERATOR_VERSION == 2
    tasks = codegen.train_tasks(800) + codegen.eval_tasks(50) + codegen.heldout_family_tasks(50)
    # the same repr the digest was taken with (the CodeTask dataclass is unchanged)
    assert hashlib.sha256(repr(tasks).encode()).hexdigest() == FAMILIES_V1_DIGEST


def test_combination_space_and_split():
    assert len(PIPELINE_COMBOS) >= 400 and len(set(PIPELINE_COMBOS)) == len(PIPELINE_COMBOS)
    assert len(HELDOUT_COMBOS) >= 40
    assert set(TRAIN_COMBOS) | set(HELDOUT_COMBOS) == set(PIPELINE_COMBOS)
    assert not set(TRAIN_COMBOS) & set(HELDOUT_COMBOS)
    assert {_parts(c)[0] for c in HELDOUT_COMBOS} == {"list", "str"}
    train = [_parts(c) for c in TRAIN_COMBOS]
    for combo in HELDOUT_COMBOS:
        kind, f, m, a = _parts(combo)
        assert f != "all" or m != "same"  # more than one piece at work
        # every piece and every pair of pieces of a held-out combination is trained elsewhere
        assert any(t[:3] == (kind, f, m) for t in train)
        assert any(t[0] == kind and t[1] == f and t[3] == a for t in train)
        assert any(t[0] == kind and t[2:] == (m, a) for t in train)
    with pytest.raises(RelaxSpecError, match="unknown pipeline"):
        generate_pipeline_task(0, ["pipe.list.even.cube.sum"])


def test_deterministic_by_seed():
    for seed in (0, 7, 123_456, EVAL_SEED_START + 2):
        assert generate_pipeline_task(seed) == generate_pipeline_task(seed)
    assert train_pipeline_tasks(30) == train_pipeline_tasks(30)
    assert heldout_combo_tasks(20) == heldout_combo_tasks(20)
    assert train_pipeline_tasks(10, start=5) == train_pipeline_tasks(15)[5:]
    assert len({t.prompt for t in train_pipeline_tasks(300)}) > 290
    tasks = heldout_combo_tasks(30) + train_pipeline_tasks(30)
    digest = hashlib.sha256(json.dumps([t.text + t.test for t in tasks]).encode()).hexdigest()
    assert digest == PIPELINES_V2_DIGEST  # a change here needs a GENERATOR_VERSION bump


def test_splits_are_disjoint(sample):
    train, held = sample[:2500], sample[2500:]
    more_train = train_pipeline_tasks(6000)
    assert {t.family for t in more_train} <= set(TRAIN_COMBOS)
    assert len({t.family for t in more_train}) > 0.95 * len(TRAIN_COMBOS)
    assert max(t.seed for t in more_train) < EVAL_SEED_START <= min(t.seed for t in held)
    assert not {t.spec for t in more_train} & {t.spec for t in held}
    assert not {t.prompt for t in more_train} & {t.prompt for t in held}
    # the docstring sentences of held-out combinations are new sentences, not seen ones
    assert not {t.spec.split("\n")[1] for t in more_train} & {t.spec.split("\n")[1] for t in held}
    assert len(Counter(t.family for t in train)) > 0.8 * len(TRAIN_COMBOS)


def test_task_shape(sample):
    for task in sample:
        assert task.prompt.startswith(f"def {task.entry_point}(") and task.prompt.endswith('"""')
        assert task.solution.startswith("\n    ") and not task.solution.endswith("\n")
        assert 1 <= len(task.solution.splitlines()[1:]) <= 6
        assert task.test.count("    assert candidate(") >= 5
        assert task.entry_point not in ("sum", "max", "min", "list", "len")
        ast.parse(task.text)


def test_every_canonical_body_passes_its_tests(sample):
    assert not [t.task_id for t in sample if not _passes(t, t.solution)]


_PROBE_WORDS = (*WORDS, "banana", "orange", "pizza", "elephant", "umbrella", "tea", "io", "xyz")


def _probes(kind: str) -> list[tuple]:
    r = random.Random(0)
    if kind == "list":
        lists = [[r.randint(-12, 40) for _ in range(r.randint(0, 8))] for _ in range(300)]
        return [(v,) for v in [*lists, [0], [1], [-1], [0, 1, -1], [2, 0]]]
    return [(" ".join(r.choice(_PROBE_WORDS) for _ in range(r.randint(0, 7))),) for _ in range(300)]


def _function(task, body: str):
    namespace: dict = {}
    exec(compile(f"{task.prompt}{body}\n", "t", "exec"), namespace)
    return namespace[task.entry_point]


def _differs(task, body: str, probes: list[tuple]) -> bool:
    """Whether ``body`` and the canonical body disagree on some probe input (or ``body`` fails)."""
    good, bad = _function(task, task.solution), _function(task, body)
    for args in probes:
        try:
            if bad(*args) != good(*args):
                return True
        except Exception:
            return True
    return False


def test_wrong_bodies_fail_their_tests(sample):
    """Every mutant (constant return, an integer literal + 1, a boundary flipped) that behaves
    differently from the canonical body on some probe input fails the task's own tests."""
    probes = {"list": _probes("list"), "str": _probes("str")}
    survivors = []
    for task in sample[::3]:
        for mutant in _mutants(task):
            if mutant == task.solution or not _passes(task, mutant):
                continue
            if _differs(task, mutant, probes[_parts(task.family)[0]]):
                survivors.append((task.task_id, mutant))
    assert not survivors, survivors[:5]


def test_sandbox_scores_canonical_and_wrong_bodies():
    from relaxspec.eval.sandbox import check_completion

    tasks = heldout_combo_tasks(6) + train_pipeline_tasks(4)
    for task in tasks:
        result = check_completion(task.problem, task.solution)
        assert result.passed, (task.task_id, result.detail)
    for task in tasks[::3]:
        assert not check_completion(task.problem, _mutants(task)[0]).passed
