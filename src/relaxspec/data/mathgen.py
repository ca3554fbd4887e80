"""Synthetic grade-school math word problems with step-by-step solutions (DESIGN §5).

Every problem is generated from one integer seed by ``random.Random(seed)``, so the corpus is
reproducible on any machine and the training and evaluation sets are simply disjoint seed ranges.

A problem is a short story over 2–5 arithmetic steps (addition, subtraction, multiplication,
exact division) on whole numbers up to three digits, sometimes with a distractor sentence whose
number plays no part. The solution writes one equation per line and ends with ``#### <answer>``::

    Question: Lena has 124 shells. She finds 3 bags with 15 shells in each. ...
    Answer:
    Shells found: 3 * 15 = 45
    Shells now: 124 + 45 = 169
    #### 169

Prompts end with ``"\\nAnswer:"``; the model continues with the solution lines. Several story
families (an inventory that changes, a shopping bill with change, work at a rate, people compared
to one another, batches packed into boxes) with varied names, objects, units and verbs keep a small
model from memorising one template, so accuracy depends on model size.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_VALUE = 999  # every number in a problem, given or computed, has at most three digits

# Seed ranges: training problems use seeds [0, EVAL_SEED_START); evaluation problems use
# seeds from EVAL_SEED_START on. The ranges never overlap, so the splits are disjoint by seed.
EVAL_SEED_START = 1_000_000_000

NAMES = [
    "Lena",
    "Omar",
    "Priya",
    "Jonas",
    "Mia",
    "Kofi",
    "Sofia",
    "Diego",
    "Hana",
    "Lucas",
    "Amara",
    "Ivan",
    "Chloe",
    "Ravi",
    "Nora",
    "Mateo",
    "Yuki",
    "Ben",
    "Zara",
    "Tom",
    "Elif",
    "Sam",
    "Aisha",
    "Felix",
    "Grace",
    "Hugo",
    "Ines",
    "Jamal",
    "Kira",
    "Leo",
    "Maya",
    "Noah",
    "Olga",
    "Pablo",
    "Rosa",
    "Theo",
    "Uma",
    "Victor",
    "Wendy",
    "Ali",
]

# (singular, plural, container, container plural)
ITEMS = [
    ("apple", "apples", "basket", "baskets"),
    ("marble", "marbles", "jar", "jars"),
    ("sticker", "stickers", "sheet", "sheets"),
    ("shell", "shells", "bag", "bags"),
    ("card", "cards", "pack", "packs"),
    ("pencil", "pencils", "box", "boxes"),
    ("cookie", "cookies", "tray", "trays"),
    ("stamp", "stamps", "album", "albums"),
    ("bead", "beads", "string", "strings"),
    ("egg", "eggs", "carton", "cartons"),
    ("book", "books", "shelf", "shelves"),
    ("flower", "flowers", "bunch", "bunches"),
    ("brick", "bricks", "pallet", "pallets"),
    ("candle", "candles", "crate", "crates"),
    ("seed", "seeds", "packet", "packets"),
    ("coin", "coins", "pouch", "pouches"),
]

GAIN_VERBS = ["finds", "gets", "receives", "is given", "collects", "picks up"]
LOSS_VERBS = ["gives away", "loses", "uses", "sells", "donates", "trades away"]
BUY_VERBS = ["buys", "orders", "brings home", "picks up"]

# (thing made, unit of work, maker)
RATES = [
    ("bolts", "hour", "machine"),
    ("pages", "day", "printer"),
    ("loaves", "hour", "bakery"),
    ("bottles", "minute", "filling line"),
    ("bricks", "day", "crew"),
    ("shirts", "hour", "workshop"),
    ("toys", "shift", "factory"),
    ("letters", "hour", "clerk"),
]

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

# (item, plural) bought in a shop, and a plausible unit price range
SHOP_ITEMS = [
    ("notebook", "notebooks", 2, 15),
    ("pen", "pens", 1, 9),
    ("sandwich", "sandwiches", 3, 12),
    ("ticket", "tickets", 5, 40),
    ("plant", "plants", 4, 30),
    ("shirt", "shirts", 8, 45),
    ("lamp", "lamps", 10, 80),
    ("puzzle", "puzzles", 6, 25),
    ("ball", "balls", 2, 20),
    ("mug", "mugs", 3, 18),
]
CURRENCIES = ["dollars", "euros", "pounds", "coins"]

DISTRACTORS = [
    "{other} is {n} years old.",
    "The shop is {n} meters from the school.",
    "{other} has read {n} pages of a novel.",
    "It is {n} degrees outside.",
    "The bus ride takes {n} minutes.",
    "{other} owns {n} comic books, but they do not matter here.",
    "There are {n} chairs in the hall.",
]

MULTIPLIER_WORDS = {2: "twice", 3: "three times", 4: "four times", 5: "five times"}


@dataclass(frozen=True)
class MathProblem:
    """One problem: ``prompt`` is what the model sees, ``solution`` what it should write."""

    seed: int
    question: str
    solution: str  # step lines then "#### <answer>"
    answer: int
    steps: int

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
        return MathProblem(seed, " ".join([*sentences, question]), solution, answer, len(steps.lines))
    raise RuntimeError(f"could not generate a math problem for seed {seed}")  # pragma: no cover


def train_problems(n: int, start: int = 0) -> list[MathProblem]:
    """Training problems: seeds ``start .. start+n-1`` (all below :data:`EVAL_SEED_START`)."""
    if start + n > EVAL_SEED_START:
        raise ValueError("training seeds would overlap the evaluation range")
    return [generate_problem(s) for s in range(start, start + n)]


def eval_problems(n: int) -> list[MathProblem]:
    """The held-out evaluation set: the first ``n`` seeds of the evaluation range."""
    return [generate_problem(EVAL_SEED_START + i) for i in range(n)]
