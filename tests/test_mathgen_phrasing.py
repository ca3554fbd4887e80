"""Math phrasing styles: held-out (scenario, style) pairs, determinism, disjoint splits."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter

import pytest

from relaxspec.data.mathgen import (
    EVAL_SEED_START,
    HELDOUT_MATH_FAMILIES,
    HELDOUT_PHRASINGS,
    NUMBER_WORDS,
    PHRASING_STYLES,
    TRAIN_MATH_FAMILIES,
    TRAIN_PHRASINGS,
    eval_family_seed_problems,
    generate_styled_problem,
    heldout_family_problems,
    heldout_phrasing_problems,
    render_style,
    train_family_problems,
    train_styled_problems,
)
from relaxspec.errors import RelaxSpecError
from test_mathgen_families import _check_arithmetic  # the broadened generator's well-formedness

# The broadened generator's first problems before the phrasing styles were added (its distractor
# step was factored out for reuse; the problems must not change), and the styled generator's.
BROAD_DIGEST = "fcd3b2c623150ae80e71f1eb60a3352e2623f80253b1faffda3c08351249e62d"
STYLED_DIGEST = "018075189118354a006a1ffacbb3ce981b9f827da9ec69939d28da38b6b6156f"


def _digest(problems) -> str:
    rows = [[p.seed, p.question, p.solution, p.answer, p.steps, p.family] for p in problems]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


@pytest.fixture(scope="module")
def train_rows():
    return train_styled_problems(4000)


@pytest.fixture(scope="module")
def held_rows():
    return heldout_phrasing_problems(600)


def test_pinned_generators():
    broad = train_family_problems(300) + heldout_family_problems(100) + eval_family_seed_problems(50)
    assert _digest(broad) == BROAD_DIGEST
    assert _digest(train_styled_problems(100) + heldout_phrasing_problems(100)) == STYLED_DIGEST


def test_phrasing_split_composes_seen_pieces():
    pairs = [p.split("/") for p in TRAIN_PHRASINGS]
    held = [p.split("/") for p in HELDOUT_PHRASINGS]
    assert not set(TRAIN_PHRASINGS) & set(HELDOUT_PHRASINGS)
    assert len(TRAIN_PHRASINGS) + len(HELDOUT_PHRASINGS) == len(TRAIN_MATH_FAMILIES) * len(PHRASING_STYLES)
    # one held-out style per training scenario, never "plain"; scenario-level held-out families
    # (new story types) are not part of this split
    assert sorted(f for f, _ in held) == sorted(TRAIN_MATH_FAMILIES)
    assert "plain" not in {s for _, s in held}
    assert not {f for f, _ in pairs + held} & set(HELDOUT_MATH_FAMILIES)
    trained_styles = Counter(s for _, s in pairs)
    for family, style in held:
        assert sum(f == family for f, _ in pairs) == len(PHRASING_STYLES) - 1  # scenario seen
        assert trained_styles[style] >= 10  # style seen with many other scenarios
    with pytest.raises(RelaxSpecError, match="unknown phrasing"):
        generate_styled_problem(0, ["garden/limerick"])


def test_deterministic_by_seed():
    for seed in (0, 3, 77_777, EVAL_SEED_START + 9):
        assert generate_styled_problem(seed) == generate_styled_problem(seed)
    assert train_styled_problems(40) == train_styled_problems(40)
    assert train_styled_problems(10, start=20) == train_styled_problems(30)[20:]
    assert heldout_phrasing_problems(20) == heldout_phrasing_problems(20)


def test_splits_are_disjoint(train_rows, held_rows):
    assert {p.family for p in train_rows} == set(TRAIN_PHRASINGS)
    assert {p.family for p in held_rows} == set(HELDOUT_PHRASINGS)
    assert max(p.seed for p in train_rows) < EVAL_SEED_START <= min(p.seed for p in held_rows)
    assert not {p.prompt for p in train_rows} & {p.prompt for p in held_rows}
    # the plain broadened stream never holds a styled held-out question either
    assert not {p.prompt for p in train_family_problems(2000)} & {p.prompt for p in held_rows}


def test_every_problem_is_well_formed(train_rows, held_rows):
    for p in train_rows[:1500] + held_rows:
        lines = p.solution.splitlines()
        assert lines[-1] == f"#### {p.answer}" and 1 <= p.steps == len(lines) - 1 <= 6
        if not p.family.endswith("/number_words"):
            _check_arithmetic(p)


def test_styles_render_the_same_story():
    sentences = ["Lena has 12 shells.", "On Monday she finds 40 more.", "The shop is 7 meters away."]
    question = "How many shells does Lena have now?"
    rng = random.Random(0)
    plain = render_style("plain", sentences, question, rng)
    assert plain == " ".join([*sentences, question])
    numbered = render_style("numbered", sentences, question, rng)
    assert numbered.startswith("(1) Lena has 12 shells. (2) On Monday") and numbered.endswith(question)
    linked = render_style("connectors", sentences, question, rng)
    assert linked.startswith("Lena has 12 shells. ") and " on Monday she finds 40 more." in linked
    semi = render_style("semicolons", sentences, question, rng)
    assert semi == f"Lena has 12 shells; on Monday she finds 40 more; the shop is 7 meters away. {question}"
    first = render_style("question_first", sentences, question, rng)
    assert first.startswith(question) and first.endswith(sentences[-1])
    words = render_style("number_words", sentences, question, rng)
    assert "twelve shells" in words and "40 more" in words and "seven meters" in words
    # a style that would not change the story is refused (the generator draws again)
    assert render_style("numbered", sentences[:1], question, rng) is None
    assert render_style("number_words", ["Omar has 45 cards."], question, rng) is None
    with pytest.raises(RelaxSpecError, match="unknown phrasing style"):
        render_style("haiku", sentences, question, rng)


def test_number_words_keep_the_numbers(held_rows):
    """Spelled-out numbers are the operands: every operand of the solution is in the question."""
    spelled = {w: str(i) for i, w in enumerate(NUMBER_WORDS)}
    for p in held_rows:
        if not p.family.endswith("/number_words"):
            continue
        text = re.sub(r"\b[a-z]+\b", lambda m: spelled.get(m.group(), m.group()), p.question)
        given = set(re.findall(r"\d+", text))
        operands = {
            b for line in p.solution.splitlines()[:-1] for b in re.findall(r" (\d+) [-+*/] (\d+) =", line)[0]
        }
        results = {line.rsplit("= ", 1)[1] for line in p.solution.splitlines()[:-1]}
        assert operands <= given | results | {"2"}, (p.question, p.solution)  # 2: "doubles", "twice"
