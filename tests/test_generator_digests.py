"""Every generator family gives the same bytes as before the split of ``data/codegen.py`` and
``data/mathgen.py`` into packages (issue 30): one digest per family group, computed on main first.

A digest covers every field of each task or problem (``dataclasses.asdict``) of a seeded sample:
each single-function code family, every pipeline combination's generator, each math story family
and each phrasing style, plus the public split functions and the variant generators built on them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict

import pytest

from relaxspec.data import codegen, codevartasks, mathgen, mathquotes, mathvariants

S = codegen.EVAL_SEED_START


def digest(items: Iterable) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(json.dumps(asdict(item), sort_keys=True).encode())
    return h.hexdigest()[:16]


def _code_families() -> list:
    return [
        codegen.generate_task(S + i * 7 + j, [f]) for j, f in enumerate(codegen.FAMILIES) for i in range(3)
    ]


def _math_families() -> list:
    fams = mathgen.MATH_FAMILIES
    return [mathgen.generate_family_problem(S + i * 5 + j, [f]) for j, f in enumerate(fams) for i in range(3)]


def _math_phrasings() -> list:
    styles = mathgen.TRAIN_PHRASINGS + mathgen.HELDOUT_PHRASINGS
    return [
        mathgen.generate_styled_problem(S + i * 3 + j, [p]) for j, p in enumerate(styles) for i in range(2)
    ]


SAMPLES: dict[str, tuple[Callable[[], Iterable], str]] = {
    "codegen.families": (_code_families, "ba2d5b1d3f9c2450"),
    "codegen.splits": (
        lambda: codegen.train_tasks(40) + codegen.eval_tasks(5) + codegen.heldout_family_tasks(5),
        "ea226cb44f83610f",
    ),
    "codegen.pipelines": (
        lambda: [codegen.generate_pipeline_task(s, codegen.PIPELINE_COMBOS) for s in range(120)],
        "407f23659d2b63d2",
    ),
    "codegen.pipeline_splits": (
        lambda: codegen.train_pipeline_tasks(20) + codegen.heldout_combo_tasks(5),
        "53734049018582ae",
    ),
    "mathgen.original": (lambda: mathgen.train_problems(60) + mathgen.eval_problems(20), "f32df1a99a21393c"),
    "mathgen.families": (_math_families, "f235c007794d466f"),
    "mathgen.family_splits": (
        lambda: (
            mathgen.train_family_problems(30)
            + mathgen.eval_family_seed_problems(5)
            + mathgen.heldout_family_problems(5)
        ),
        "7b9247a44eb0baa0",
    ),
    "mathgen.phrasings": (_math_phrasings, "f05d59247b5ec56b"),
    "mathgen.phrasing_splits": (
        lambda: mathgen.train_styled_problems(30) + mathgen.heldout_phrasing_problems(5),
        "4f208cd3fa034d0e",
    ),
    "codevartasks": (
        lambda: (
            codevartasks.train_variant_tasks(15)
            + codevartasks.heldout_seed_variant_tasks(3)
            + codevartasks.heldout_combo_variant_tasks(3)
            + codevartasks.heldout_phrasing_variant_tasks(3)
        ),
        "544e781ff88f8f3e",
    ),
    "mathvariants": (
        lambda: (
            mathvariants.train_variant_problems(15)
            + mathvariants.heldout_seed_variant_problems(3)
            + mathvariants.heldout_family_variant_problems(3)
            + mathvariants.heldout_phrasing_variant_problems(3)
        ),
        "884f13cc9ca424ec",
    ),
    "mathquotes": (lambda: mathquotes.train_quote_problems(20), "8d8b3b982d54fd61"),
    "mathorder": (lambda: mathquotes.train_ordered_problems(20), "a2de84d805e5fc9a"),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_generated_sample_is_byte_identical(name):
    make, expected = SAMPLES[name]
    assert digest(make()) == expected


def test_pipeline_combination_lists_unchanged():
    text = json.dumps([codegen.PIPELINE_COMBOS, codegen.HELDOUT_COMBOS]).encode()
    assert hashlib.sha256(text).hexdigest()[:16] == "cd8045691286c7ca"
