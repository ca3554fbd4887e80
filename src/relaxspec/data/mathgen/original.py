"""The original generator: five story families, 2–5 steps (docs/design.md §5). Its problems are
pinned byte-for-byte: figures in the docs were measured on them.

A problem is a short story over 2–5 arithmetic steps (addition, subtraction, multiplication,
exact division) on whole numbers up to three digits, sometimes with a distractor sentence whose
number plays no part. The solution writes one equation per line and ends with ``#### <answer>``::

    Question: Lena has 124 shells. She finds 3 bags with 15 shells in each. ...
    Answer:
    Shells found: 3 * 15 = 45
    Shells now: 124 + 45 = 169
    #### 169

The families (an inventory that changes, a shopping bill with change, work at a rate, people
compared to one another, batches packed into boxes) with varied names, objects, units and verbs
keep a small model from memorising one template, so accuracy depends on model size.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from relaxspec.data.mathgen.problem import EVAL_SEED_START, MathProblem, _divisors, _Retry, _Steps
from relaxspec.data.mathgen.words import (
    BUY_VERBS,
    CURRENCIES,
    DAYS,
    DISTRACTORS,
    GAIN_VERBS,
    ITEMS,
    LOSS_VERBS,
    MULTIPLIER_WORDS,
    NAMES,
    RATES,
    SHOP_ITEMS,
)


def _inventory(rng: random.Random, n_steps: int) -> tuple[list[str], _Steps, str]:
    """A person's stock of one item changes step by step; ask for the final count."""
    name = rng.choice(NAMES)
    _item, items, box, boxes = rng.choice(ITEMS)
    cap = items.capitalize()
    steps = _Steps()
    value = rng.randint(10, 400)
    sentences = [f"{name} has {value} {items}."]
    question = f"How many {items} does {name} have now?"
    for i in range(n_steps):
        last = i == n_steps - 1
        kind = rng.choice(["gain", "loss", "groups", "times", "share"])
        if kind == "gain":
            n = rng.randint(2, 300)
            sentences.append(f"{'Then ' if i else ''}{name} {rng.choice(GAIN_VERBS)} {n} more {items}.")
            value = steps.add(f"{cap} after getting more", value, "+", n)
        elif kind == "loss":
            n = rng.randint(1, max(1, value - 1))
            sentences.append(f"{name} {rng.choice(LOSS_VERBS)} {n} {items}.")
            value = steps.add(f"{cap} left", value, "-", n)
        elif kind == "groups":
            n, m = rng.randint(2, 12), rng.randint(2, 60)
            verb = rng.choice(BUY_VERBS)
            sentences.append(f"{name} {verb} {n} {boxes} with {m} {items} in each {box}.")
            extra = steps.add(f"{cap} in the {boxes}", n, "*", m)
            value = steps.add(f"{cap} in total", value, "+", extra)
        elif kind == "times":
            k = rng.choice([2, 3, 4, 5])
            sentences.append(f"By the end of the month {name} has {MULTIPLIER_WORDS[k]} as many {items}.")
            value = steps.add(f"{cap} at the end of the month", value, "*", k)
        else:
            divisors = _divisors(value)
            if not divisors:
                raise _Retry
            k = rng.choice(divisors)
            if last:
                sentences.append(f"{name} shares all the {items} equally among {k} friends.")
                question = f"How many {items} does each friend get?"
                value = steps.add(f"{cap} per friend", value, "/", k)
            else:
                sentences.append(f"{name} keeps only one of {k} equal piles of {items}.")
                value = steps.add(f"{cap} kept", value, "/", k)
    return sentences, steps, question


def _shopping(rng: random.Random, n_steps: int) -> tuple[list[str], _Steps, str]:
    """Buy several kinds of items at unit prices; ask for the total or the change."""
    name = rng.choice(NAMES)
    currency = rng.choice(CURRENCIES)
    kinds = rng.sample(SHOP_ITEMS, k=min(3, max(1, (n_steps + 1) // 2)))
    steps = _Steps()
    parts, costs = [], []
    for _singular, plural, lo, hi in kinds:
        count, price = rng.randint(2, 9), rng.randint(lo, hi)
        parts.append(f"{count} {plural} at {price} {currency} each")
        costs.append(steps.add(f"Cost of the {plural}", count, "*", price))
    sentences = [
        f"{name} {rng.choice(BUY_VERBS)} "
        + ", ".join(parts[:-1])
        + (" and " if len(parts) > 1 else "")
        + parts[-1]
        + "."
    ]
    total = costs[0]
    for cost in costs[1:]:
        total = steps.add("Total so far", total, "+", cost)
    if len(steps.lines) < n_steps:
        paid = rng.choice([b for b in (50, 100, 200, 500, 999) if b >= total] or [None])
        if paid is None:
            raise _Retry
        sentences.append(f"{name} pays with {paid} {currency}.")
        steps.add("Change", paid, "-", total)
        question = f"How much change, in {currency}, does {name} get back?"
    else:
        question = f"How many {currency} does {name} spend in total?"
    return sentences, steps, question


def _rate(rng: random.Random, n_steps: int) -> tuple[list[str], _Steps, str]:
    """Work at a fixed rate over several periods; ask for the total made (or per-period share)."""
    things, unit, maker = rng.choice(RATES)
    rate = rng.randint(3, 60)
    days = rng.sample(DAYS, k=min(4, max(2, n_steps - 1)))
    steps = _Steps()
    sentences = [f"A {maker} makes {rate} {things} per {unit}."]
    totals = []
    for day in days:
        n = rng.randint(2, 12)
        sentences.append(f"On {day} it works for {n} {unit}s.")
        totals.append(steps.add(f"{things.capitalize()} on {day}", rate, "*", n))
    total = totals[0]
    for made in totals[1:]:
        total = steps.add("Total so far", total, "+", made)
    question = f"How many {things} does the {maker} make in total?"
    if len(steps.lines) < n_steps:
        divisors = _divisors(total, 2, 12)
        if not divisors:
            raise _Retry
        k = rng.choice(divisors)
        sentences.append(f"The {things} are packed equally into {k} crates.")
        steps.add(f"{things.capitalize()} per crate", total, "/", k)
        question = f"How many {things} go into each crate?"
    return sentences, steps, question


def _compare(rng: random.Random, n_steps: int) -> tuple[list[str], _Steps, str]:
    """People's amounts defined relative to each other; ask for the total of all of them."""
    _item, items, _, _ = rng.choice(ITEMS)
    people = rng.sample(NAMES, k=min(4, max(2, (n_steps + 2) // 2)))
    steps = _Steps()
    base = rng.randint(5, 150)
    sentences = [f"{people[0]} has {base} {items}."]
    values = [base]
    for prev, person in itertools.pairwise(people):
        kind = rng.choice(["more", "fewer", "times", "half"])
        v = values[-1]
        if kind == "more":
            n = rng.randint(2, 200)
            sentences.append(f"{person} has {n} more {items} than {prev}.")
            values.append(steps.add(f"{person}'s {items}", v, "+", n))
        elif kind == "fewer":
            n = rng.randint(1, max(1, v - 1))
            sentences.append(f"{person} has {n} fewer {items} than {prev}.")
            values.append(steps.add(f"{person}'s {items}", v, "-", n))
        elif kind == "times":
            k = rng.choice([2, 3, 4, 5])
            sentences.append(f"{person} has {MULTIPLIER_WORDS[k]} as many {items} as {prev}.")
            values.append(steps.add(f"{person}'s {items}", v, "*", k))
        else:
            if v % 2:
                raise _Retry
            sentences.append(f"{person} has half as many {items} as {prev}.")
            values.append(steps.add(f"{person}'s {items}", v, "/", 2))
    if len(steps.lines) + len(values) - 1 <= n_steps + 1:
        total = values[0]
        for v in values[1:]:
            total = steps.add("Together so far", total, "+", v)
        question = f"How many {items} do they have altogether?"
    else:
        question = f"How many {items} does {people[-1]} have?"
    return sentences, steps, question


def _batches(rng: random.Random, n_steps: int) -> tuple[list[str], _Steps, str]:
    """Make batches, pack them into boxes, sell the boxes; ask for boxes or money."""
    name = rng.choice(NAMES)
    _item, items, box, boxes = rng.choice(ITEMS)
    currency = rng.choice(CURRENCIES)
    steps = _Steps()
    trays, per_tray = rng.randint(2, 20), rng.randint(2, 40)
    sentences = [f"{name} prepares {trays} batches of {per_tray} {items}."]
    total = steps.add(f"{items.capitalize()} made", trays, "*", per_tray)
    question = f"How many {items} does {name} make?"
    if n_steps >= 3 and rng.random() < 0.5:
        broken = rng.randint(1, max(1, total // 4))
        sentences.append(f"{broken} of them are damaged and thrown away.")
        total = steps.add(f"Good {items}", total, "-", broken)
        question = f"How many good {items} are left?"
    divisors = _divisors(total, 2, 12)
    if len(steps.lines) < n_steps and divisors:
        k = rng.choice(divisors)
        sentences.append(f"{name} packs them into {boxes} of {k}.")
        n_boxes = steps.add(f"{boxes.capitalize()} filled", total, "/", k)
        question = f"How many {boxes} does {name} fill?"
        if len(steps.lines) < n_steps:
            price = rng.randint(2, 30)
            sentences.append(f"Each {box} sells for {price} {currency}.")
            steps.add("Money earned", n_boxes, "*", price)
            question = f"How many {currency} does {name} earn?"
    return sentences, steps, question


FAMILIES: list[Callable[[random.Random, int], tuple[list[str], _Steps, str]]] = [
    _inventory,
    _shopping,
    _rate,
    _compare,
    _batches,
]


def generate_problem(seed: int) -> MathProblem:
    """The problem for ``seed``: deterministic, 2–5 steps, all numbers ≤ 999."""
    rng = random.Random(seed)
    for _ in range(1000):
        n_steps = rng.randint(2, 5)
        family = rng.choice(FAMILIES)
        try:
            sentences, steps, question = family(rng, n_steps)
        except _Retry:
            continue
        if not 2 <= len(steps.lines) <= 5:
            continue
        if rng.random() < 0.35:  # a distractor sentence with a number that plays no part
            template = rng.choice(DISTRACTORS)
            other = rng.choice(NAMES)
            sentences.insert(
                rng.randint(1, len(sentences)), template.format(other=other, n=rng.randint(2, 99))
            )
        answer = int(steps.lines[-1].rsplit("= ", 1)[1])
        solution = "\n".join([*steps.lines, f"#### {answer}"])
        question = " ".join([*sentences, question])
        return MathProblem(seed, question, solution, answer, len(steps.lines), family.__name__[1:])
    raise RuntimeError(f"could not generate a math problem for seed {seed}")  # pragma: no cover


def train_problems(n: int, start: int = 0) -> list[MathProblem]:
    """Training problems: seeds ``start .. start+n-1`` (all below :data:`EVAL_SEED_START`)."""
    if start + n > EVAL_SEED_START:
        raise ValueError("training seeds would overlap the evaluation range")
    return [generate_problem(s) for s in range(start, start + n)]


def eval_problems(n: int) -> list[MathProblem]:
    """The held-out evaluation set: the first ``n`` seeds of the evaluation range."""
    return [generate_problem(EVAL_SEED_START + i) for i in range(n)]
