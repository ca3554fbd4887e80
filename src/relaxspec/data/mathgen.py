"""Synthetic grade-school math word problems with step-by-step solutions (docs/design.md §5).

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

The **broadened generator** (:func:`generate_family_problem`, issue 15) keeps that format and adds
1–6 steps, 20 more story families (:data:`MATH_FAMILIES`: a diary of changes, savings, recipes,
travel legs, a garden, classrooms, reading, wages, sports scores, a fundraiser, a party, notes and
coins, sharing, a car park, and the held-out bus, legs, orchard, tank, ages and timing), more
names, objects, verbs, distractors and question forms. Its splits: training families on training
seeds (:func:`train_family_problems`), held-out seeds of the same families
(:func:`eval_family_seed_problems`; a question is held out by its hash, so the two can never
share a question), and held-out scenario families (new story types) never generated for training
(:func:`heldout_family_problems`). ``generate_problem`` and the seed ranges above are unchanged:
the original problems stay byte-identical (tests/test_mathgen_families.py pins them).

**Phrasing styles** (:func:`generate_styled_problem`, end of this module) render the training
scenarios' stories in six styles (as written, question first, numbered facts, connectives, small
numbers spelled out, semicolons). A held-out *phrasing family* is a (scenario, style) pair never
trained (:data:`HELDOUT_PHRASINGS`, one per scenario), while the scenario is trained in its other
styles and the style with other scenarios (:func:`train_styled_problems`,
:func:`heldout_phrasing_problems`).
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from relaxspec.errors import RelaxSpecError

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


# =============================================================================================
# The broadened generator (issue 15): 1–6 steps, more story families, names, objects, verbs and
# question forms, split into training and held-out families. It draws from its own functions so
# that the original generator above (``generate_problem`` and the five families) stays
# byte-identical: figures in the docs were measured on it.

MIN_STEPS, MAX_STEPS = 1, 6
HELDOUT_QUESTION_BUCKETS = 20  # broadened generator: one question in twenty is a held-out seed

MORE_NAMES = [
    "Adam", "Bea", "Carlos", "Dana", "Emeka", "Fatima", "Gus", "Hiro", "Isla", "Jin", "Kemal",
    "Lara", "Milo", "Nadia", "Oscar", "Paula", "Quinn", "Rhea", "Sven", "Tara", "Ugo", "Vera",
    "Will", "Xena", "Yara", "Zeke",
]  # fmt: skip
ALL_NAMES = NAMES + MORE_NAMES

# (singular, plural): the original items plus new ones
OBJECTS = [(s, p) for s, p, _, _ in ITEMS] + [
    ("balloon", "balloons"), ("button", "buttons"), ("crayon", "crayons"), ("cupcake", "cupcakes"),
    ("feather", "feathers"), ("pebble", "pebbles"), ("muffin", "muffins"), ("comic", "comics"),
    ("ribbon", "ribbons"), ("orange", "oranges"), ("toy car", "toy cars"), ("postcard", "postcards"),
    ("paper clip", "paper clips"), ("sock", "socks"), ("acorn", "acorns"), ("magnet", "magnets"),
]  # fmt: skip
MORE_GAIN_VERBS = [*GAIN_VERBS, "wins", "buys", "gathers", "is handed", "earns"]
MORE_LOSS_VERBS = [*LOSS_VERBS, "eats", "breaks", "misplaces", "hands out", "throws away"]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh"]
MORE_DISTRACTORS = [
    *DISTRACTORS,
    "{other} painted the fence {n} days ago.",
    "The library has {n} tables.",
    "{other} lives {n} kilometers away.",
    "A film lasts {n} minutes.",
]

Story = tuple[list[str], _Steps, str]


def _pick_question(rng: random.Random, *forms: str) -> str:
    return rng.choice(forms)


def _diary(rng: random.Random, n_steps: int) -> Story:
    """A week of changes to one collection, one day per step."""
    name = rng.choice(ALL_NAMES)
    _obj, objs = rng.choice(OBJECTS)
    cap = objs.capitalize()
    steps = _Steps()
    value = rng.randint(5, 300)
    start = rng.randint(0, 7 - min(n_steps, 7))
    days = DAYS[start : start + n_steps]
    sentences = [f"{name} starts the week with {value} {objs}."]
    for day in days:
        kind = rng.choice(["gain", "gain", "loss", "loss", "double"])
        if kind == "gain":
            n = rng.randint(2, 200)
            sentences.append(f"On {day}, {name} {rng.choice(MORE_GAIN_VERBS)} {n} {objs}.")
            value = steps.add(f"{cap} after {day}", value, "+", n)
        elif kind == "loss":
            n = rng.randint(1, max(1, value - 1))
            sentences.append(f"On {day}, {name} {rng.choice(MORE_LOSS_VERBS)} {n} of them.")
            value = steps.add(f"{cap} after {day}", value, "-", n)
        else:
            sentences.append(f"On {day}, the number of {objs} doubles.")
            value = steps.add(f"{cap} after {day}", value, "*", 2)
    question = _pick_question(
        rng,
        f"How many {objs} does {name} have at the end of {days[-1]}?",
        f"How many {objs} does {name} have after {days[-1]}?",
        f"What is the number of {objs} {name} has at the end of {days[-1]}?",
    )
    return sentences, steps, question


def _bus(rng: random.Random, n_steps: int) -> Story:
    """Passengers get on and off at stops, one stop per step (held out)."""
    vehicle = rng.choice(["bus", "train", "tram", "ferry"])
    steps = _Steps()
    value = rng.randint(5, 120)
    sentences = [f"A {vehicle} leaves the station with {value} passengers."]
    for i in range(n_steps):
        stop = ORDINALS[i]
        if rng.random() < 0.5:
            n = rng.randint(1, 60)
            verb = rng.choice(["get on", "board", "climb aboard"])
            sentences.append(f"At the {stop} stop, {n} people {verb}.")
            value = steps.add(f"Passengers after stop {i + 1}", value, "+", n)
        else:
            n = rng.randint(1, max(1, value - 1))
            verb = rng.choice(["get off", "leave", "step off"])
            sentences.append(f"At the {stop} stop, {n} people {verb}.")
            value = steps.add(f"Passengers after stop {i + 1}", value, "-", n)
    question = _pick_question(
        rng,
        f"How many passengers are on the {vehicle} after the {ORDINALS[n_steps - 1]} stop?",
        f"How many people are riding the {vehicle} now?",
        f"How many passengers does the {vehicle} carry when it leaves the {ORDINALS[n_steps - 1]} stop?",
    )
    return sentences, steps, question


def _savings(rng: random.Random, n_steps: int) -> Story:
    """Save a fixed amount each week, then gifts, purchases and a split (one step each)."""
    name = rng.choice(ALL_NAMES)
    currency = rng.choice(CURRENCIES)
    steps = _Steps()
    weekly, weeks = rng.randint(2, 40), rng.randint(2, 12)
    sentences = [f"{name} saves {weekly} {currency} every week for {weeks} weeks."]
    value = steps.add("Money saved", weekly, "*", weeks)
    question = f"How many {currency} does {name} save?"
    for i in range(n_steps - 1):
        last = i == n_steps - 2
        kind = rng.choice(["gift", "spend", "spend"] + (["split"] if last else []))
        if kind == "gift":
            n = rng.randint(5, 150)
            giver = rng.choice(["grandmother", "uncle", "aunt", "neighbour", "older sister"])
            sentences.append(f"{name}'s {giver} adds {n} {currency}.")
            value = steps.add("Money after the gift", value, "+", n)
        elif kind == "spend":
            n = rng.randint(1, max(1, value - 1))
            thing = rng.choice(
                ["a game", "a jacket", "a book", "a present", "a bike lock", "concert tickets"]
            )
            sentences.append(f"Then {name} spends {n} {currency} on {thing}.")
            value = steps.add("Money left", value, "-", n)
        else:
            divisors = _divisors(value)
            if not divisors:
                raise _Retry
            k = rng.choice(divisors)
            sentences.append(f"{name} splits the money equally into {k} envelopes.")
            value = steps.add("Money per envelope", value, "/", k)
            return sentences, steps, f"How many {currency} go into each envelope?"
        question = _pick_question(
            rng,
            f"How many {currency} does {name} have now?",
            f"How much money, in {currency}, does {name} have left?",
        )
    return sentences, steps, question


def _recipe(rng: random.Random, n_steps: int) -> Story:
    """Scale a recipe by batches; then what is already there, extras and packs."""
    name = rng.choice(ALL_NAMES)
    food = rng.choice(["pancakes", "cookies", "muffins", "bread rolls", "waffles", "scones"])
    unit, ingredient = rng.choice(
        [
            ("eggs", "eggs"),
            ("cups of flour", "flour"),
            ("spoons of sugar", "sugar"),
            ("grams of butter", "butter"),
        ]
    )
    steps = _Steps()
    per, batches = rng.randint(2, 30), rng.randint(2, 9)
    sentences = [f"One batch of {food} needs {per} {unit}.", f"{name} wants to make {batches} batches."]
    value = steps.add(f"{unit.capitalize()} needed", per, "*", batches)
    question = f"How many {unit} does {name} need?"
    for i in range(n_steps - 1):
        last = i == n_steps - 2
        kind = rng.choice(["extra", "extra"] + (["have", "packs"] if last else []))
        if kind == "extra":
            n = rng.randint(1, 40)
            dish = rng.choice(["a cake", "a pie", "a sauce", "some biscuits"])
            sentences.append(f"{name} also needs {n} {unit} for {dish}.")
            value = steps.add(f"{unit.capitalize()} needed in total", value, "+", n)
            question = f"How many {unit} does {name} need altogether?"
        elif kind == "have":
            n = rng.randint(1, max(1, value - 1))
            sentences.append(f"{name} already has {n} {unit} at home.")
            value = steps.add(f"{unit.capitalize()} still to buy", value, "-", n)
            question = f"How many more {unit} must {name} buy?"
        else:
            divisors = _divisors(value, 2, 12)
            if not divisors:
                raise _Retry
            k = rng.choice(divisors)
            sentences.append(f"The {ingredient} comes in packs of {k} {unit}.")
            value = steps.add("Packs needed", value, "/", k)
            question = f"How many packs of {ingredient} does {name} need?"
    return sentences, steps, question


def _travel(rng: random.Random, n_steps: int) -> Story:
    """Legs at a speed for some hours (one product each), their sum, and the distance left."""
    name = rng.choice(ALL_NAMES)
    vehicle = rng.choice(["car", "bike", "boat", "van", "scooter"])
    unit = rng.choice(["kilometers", "miles"])
    legs = (n_steps + 1) // 2
    left = n_steps % 2 == 0
    steps = _Steps()
    sentences, dists = [], []
    for i in range(legs):
        speed, hours = rng.randint(5, 90), rng.randint(1, 6)
        then = "" if i == 0 else "Then "
        who = f"{name} rides a {vehicle}" if i == 0 else f"{name}"
        sentences.append(f"{then}{who} at {speed} {unit} per hour for {hours} hours.")
        dists.append(steps.add(f"Distance of leg {i + 1}", speed, "*", hours))
    total = dists[0]
    for d in dists[1:]:
        total = steps.add("Distance so far", total, "+", d)
    question = _pick_question(
        rng, f"How many {unit} does {name} travel?", f"How far, in {unit}, does {name} go in total?"
    )
    if left:
        trip = rng.randint(total + 1, min(MAX_VALUE, total + 400)) if total < MAX_VALUE else None
        if trip is None:
            raise _Retry
        sentences.insert(0, f"{name} plans a trip of {trip} {unit}.")
        steps.add(f"{unit.capitalize()} still to go", trip, "-", total)
        question = f"How many {unit} of the trip are left?"
    return sentences, steps, question


def _garden(rng: random.Random, n_steps: int) -> Story:
    """Rows of plants, losses, a harvest per plant, gifts, baskets."""
    name = rng.choice(ALL_NAMES)
    plant, crop = rng.choice(
        [("tomato plants", "tomatoes"), ("bean plants", "beans"), ("pepper plants", "peppers"),
         ("strawberry plants", "strawberries"), ("pumpkin vines", "pumpkins")]
    )  # fmt: skip
    steps = _Steps()
    rows, per = rng.randint(2, 12), rng.randint(2, 20)
    sentences = [f"{name} plants {rows} rows of {plant} with {per} in each row."]
    value = steps.add(f"{plant.capitalize()} planted", rows, "*", per)
    question = f"How many {plant} does {name} plant?"
    rest = n_steps - 1
    harvest = rest >= 1 and rng.random() < 0.7
    basket = harvest and rest >= 2 and rng.random() < 0.5
    others = rest - harvest - basket
    before = rng.randint(0, others) if harvest else others
    for i in range(before):
        n = rng.randint(2, max(2, value // 3))
        if i == 0:
            sentences.append(f"{n} of the {plant} do not survive.")
        else:
            sentences.append(f"Later, {n} more of them dry out.")
        value = steps.add(f"{plant.capitalize()} left", value, "-", n)
        question = f"How many {plant} are left?"
    if harvest:
        k = rng.randint(2, 9)
        sentences.append(f"Each of the {plant} gives {k} {crop}.")
        value = steps.add(f"{crop.capitalize()} picked", value, "*", k)
        question = f"How many {crop} does {name} pick?"
        for _ in range(others - before):
            n = rng.randint(1, max(1, value - 1))
            who = rng.choice(["the neighbours", "a friend", "the school kitchen", "the food bank"])
            sentences.append(f"{name} gives {n} {crop} to {who}.")
            value = steps.add(f"{crop.capitalize()} kept", value, "-", n)
            question = f"How many {crop} does {name} keep?"
    if basket:
        divisors = _divisors(value, 2, 12)
        if not divisors:
            raise _Retry
        k = rng.choice(divisors)
        sentences.append(f"The {crop} are packed {k} to a basket.")
        steps.add("Baskets filled", value, "/", k)
        question = "How many baskets are filled?"
    return sentences, steps, question


def _classroom(rng: random.Random, n_steps: int) -> Story:
    """Groups of children, absences and newcomers, teams, equipment per team."""
    place = rng.choice(["A school", "A summer camp", "A sports club", "A music academy"])
    steps = _Steps()
    groups, per = rng.randint(2, 9), rng.randint(10, 32)
    sentences = [f"{place} has {groups} groups with {per} children in each group."]
    value = steps.add("Children in total", groups, "*", per)
    question = "How many children are there?"
    rest = n_steps - 1
    teams = rest >= 1 and rng.random() < 0.6
    items = teams and rest >= 2 and rng.random() < 0.6
    for _ in range(rest - teams - items):
        if rng.random() < 0.5:
            n = rng.randint(1, max(1, value // 4))
            sentences.append(f"On the day of the trip, {n} children are ill and stay home.")
            value = steps.add("Children present", value, "-", n)
            question = "How many children go on the trip?"
        else:
            n = rng.randint(1, 30)
            sentences.append(f"Then {n} new children join.")
            value = steps.add("Children now", value, "+", n)
            question = "How many children are there now?"
    if teams:
        divisors = _divisors(value, 2, 12)
        if not divisors:
            raise _Retry
        k = rng.choice(divisors)
        sentences.append(f"The children form teams of {k}.")
        value = steps.add("Teams", value, "/", k)
        question = "How many teams are there?"
    if items:
        k = rng.randint(2, 6)
        thing = rng.choice(["balls", "maps", "whistles", "ropes"])
        sentences.append(f"Each team gets {k} {thing}.")
        steps.add(f"{thing.capitalize()} needed", value, "*", k)
        question = f"How many {thing} are needed?"
    return sentences, steps, question


def _reading(rng: random.Random, n_steps: int) -> Story:
    """Pages read on several days, then the pages still to read."""
    name = rng.choice(ALL_NAMES)
    book = rng.choice(["book", "novel", "comic album", "science book", "diary of a sailor"])
    steps = _Steps()
    days = DAYS[:n_steps]
    amounts = [rng.randint(5, 80) for _ in days]
    pages = rng.randint(sum(amounts) + 1, min(MAX_VALUE, sum(amounts) + 300))
    sentences = [f"{name}'s {book} has {pages} pages."]
    for day, n in zip(days, amounts, strict=True):
        sentences.append(f"On {day}, {name} reads {n} pages.")
    total = amounts[0]
    for day, n in zip(days[1:], amounts[1:], strict=True):
        total = steps.add(f"Pages read by {day}", total, "+", n)
    steps.add("Pages left", pages, "-", total)
    question = _pick_question(
        rng,
        f"How many pages does {name} still have to read?",
        f"How many pages of the {book} are left?",
        f"How many pages remain after {days[-1]}?",
    )
    return sentences, steps, question


def _wages(rng: random.Random, n_steps: int) -> Story:
    """Pay per hour times hours, a bonus, spending, a second job."""
    name = rng.choice(ALL_NAMES)
    currency = rng.choice(CURRENCIES)
    job = rng.choice(["at a cafe", "in a bookshop", "as a dog walker", "at the market", "in a garden"])
    steps = _Steps()
    rate, hours = rng.randint(3, 25), rng.randint(2, 30)
    sentences = [f"{name} works {job} for {hours} hours and earns {rate} {currency} an hour."]
    value = steps.add("Pay", rate, "*", hours)
    question = f"How many {currency} does {name} earn?"
    remaining = n_steps - 1
    while remaining:
        kind = rng.choice(["bonus", "spend"] + (["second job"] if remaining >= 2 else []))
        if kind == "bonus":
            n = rng.randint(5, 100)
            sentences.append(f"{name} also gets a bonus of {n} {currency}.")
            value = steps.add("Pay with bonus", value, "+", n)
            question = f"How many {currency} does {name} get in total?"
            remaining -= 1
        elif kind == "spend":
            n = rng.randint(1, max(1, value - 1))
            sentences.append(f"{name} spends {n} {currency} on lunch and bus fares.")
            value = steps.add("Money left", value, "-", n)
            question = f"How many {currency} does {name} have left?"
            remaining -= 1
        else:
            r2, h2 = rng.randint(3, 25), rng.randint(1, 10)
            sentences.append(f"On the weekend {name} babysits for {h2} hours at {r2} {currency} an hour.")
            extra = steps.add("Babysitting pay", r2, "*", h2)
            value = steps.add("Money now", value, "+", extra)
            question = f"How many {currency} does {name} have now?"
            remaining -= 2
    return sentences, steps, question


def _sports(rng: random.Random, n_steps: int) -> Story:
    """Points from several kinds of scores; sometimes the margin over the other team."""
    team = rng.choice(["The Tigers", "The Hawks", "Our team", "The home side", "The Comets"])
    scores = rng.sample(
        [("goals", 3), ("tries", 5), ("free throws", 1), ("baskets", 2), ("penalties", 2), ("home runs", 4)],
        k=min(3, (n_steps + 1) // 2),
    )
    margin = (n_steps + 1) // 2 * 2 - 1 < n_steps
    steps = _Steps()
    parts, points = [], []
    for kind, worth in scores:
        n = rng.randint(1, 15)
        worth = rng.randint(1, 7) if rng.random() < 0.3 else worth
        parts.append(f"{n} {kind} worth {worth} points each")
        points.append(steps.add(f"Points from {kind}", n, "*", worth))
    sentences = [
        f"{team} score " + ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1] + "."
    ]
    total = points[0]
    for p in points[1:]:
        total = steps.add("Points so far", total, "+", p)
    question = _pick_question(
        rng, f"How many points do {team.lower()} score?", f"What is the final score of {team.lower()}?"
    )
    if margin:
        other = rng.randint(1, max(1, total - 1))
        sentences.append(f"The other team scores {other} points.")
        steps.add("Winning margin", total, "-", other)
        question = f"By how many points do {team.lower()} win?"
    return sentences, steps, question


def _fundraiser(rng: random.Random, n_steps: int) -> Story:
    """Tickets times price, donations, costs, shares for charities."""
    club = rng.choice(["The chess club", "A choir", "The school band", "A football team", "The drama club"])
    currency = rng.choice(CURRENCIES)
    event = rng.choice(["a bake sale", "a concert", "a raffle", "a quiz night", "a car wash"])
    steps = _Steps()
    tickets, price = rng.randint(5, 90), rng.randint(2, 12)
    sentences = [f"{club} holds {event} and sells {tickets} tickets at {price} {currency} each."]
    value = steps.add("Ticket money", tickets, "*", price)
    question = f"How many {currency} does {club.lower()} raise?"
    for i in range(n_steps - 1):
        last = i == n_steps - 2
        kind = rng.choice(["donation", "cost"] + (["share"] if last else []))
        if kind == "donation":
            n = rng.randint(5, 150)
            sentences.append(f"A local shop donates {n} {currency}.")
            value = steps.add("Money raised", value, "+", n)
            question = f"How many {currency} does {club.lower()} have in total?"
        elif kind == "cost":
            n = rng.randint(1, max(1, value - 1))
            sentences.append(
                f"The {rng.choice(['posters', 'decorations', 'prizes', 'hall'])} cost {n} {currency}."
            )
            value = steps.add("Money after costs", value, "-", n)
            question = f"How many {currency} are left after the costs?"
        else:
            divisors = _divisors(value)
            if not divisors:
                raise _Retry
            k = rng.choice(divisors)
            sentences.append(f"The money is shared equally between {k} charities.")
            value = steps.add("Money per charity", value, "/", k)
            question = f"How many {currency} does each charity get?"
    return sentences, steps, question


def _party(rng: random.Random, n_steps: int) -> Story:
    """Guests times items per guest, spares, packs, and the price of the packs."""
    name = rng.choice(ALL_NAMES)
    _obj, objs = rng.choice(OBJECTS)
    currency = rng.choice(CURRENCIES)
    steps = _Steps()
    guests, per = rng.randint(3, 30), rng.randint(2, 8)
    sentences = [f"{name} invites {guests} guests to a party and wants to give each guest {per} {objs}."]
    value = steps.add(f"{objs.capitalize()} for the guests", guests, "*", per)
    question = f"How many {objs} does {name} need?"
    rest = n_steps - 1
    packs = rest >= 1 and rng.random() < 0.6
    price = packs and rest >= 2 and rng.random() < 0.6
    for i in range(rest - packs - price):
        n = rng.randint(1, 20)
        why = ["as spares", "for the neighbours", "for the party games", "for the hosts"][i % 4]
        sentences.append(f"{name} wants {n} more {objs} {why}.")
        value = steps.add(f"{objs.capitalize()} needed", value, "+", n)
        question = f"How many {objs} does {name} need in total?"
    if packs:
        divisors = _divisors(value, 2, 12)
        if not divisors:
            raise _Retry
        k = rng.choice(divisors)
        sentences.append(f"The {objs} are sold in packs of {k}.")
        value = steps.add("Packs to buy", value, "/", k)
        question = f"How many packs of {objs} does {name} buy?"
    if price:
        cost = rng.randint(2, 15)
        sentences.append(f"Each pack costs {cost} {currency}.")
        steps.add("Cost of the packs", value, "*", cost)
        question = f"How many {currency} does {name} pay for the {objs}?"
    return sentences, steps, question


ANIMALS = [
    ("cows", 4), ("chickens", 2), ("spiders", 8), ("ducks", 2), ("horses", 4), ("goats", 4),
    ("ants", 6), ("geese", 2), ("beetles", 6), ("sheep", 4), ("crabs", 10), ("pigs", 4),
]  # fmt: skip


def _legs(rng: random.Random, n_steps: int) -> Story:
    """Counting legs of several kinds of animals (held out)."""
    place = rng.choice(["On a farm", "In a zoo", "At a petting park", "In a field"])
    species = rng.sample(ANIMALS, k=min(3, (n_steps + 1) // 2))
    steps = _Steps()
    counts = [rng.randint(2, 40) for _ in species]
    listed = [f"{n} {a}" for n, (a, _) in zip(counts, species, strict=True)]
    sentences = [
        f"{place} there are "
        + ", ".join(listed[:-1])
        + (" and " if len(listed) > 1 else "")
        + listed[-1]
        + "."
    ]
    if n_steps % 2 == 0:
        extra = rng.randint(1, 20)
        sentences.append(f"Then {extra} more {species[0][0]} arrive.")
        counts[0] = steps.add(f"{species[0][0].capitalize()} now", counts[0], "+", extra)
    legs = [steps.add(f"Legs of the {a}", n, "*", k) for n, (a, k) in zip(counts, species, strict=True)]
    total = legs[0]
    for n in legs[1:]:
        total = steps.add("Legs so far", total, "+", n)
    question = _pick_question(
        rng, "How many legs do the animals have in total?", "How many animal legs are there altogether?"
    )
    return sentences, steps, question


def _coins(rng: random.Random, n_steps: int) -> Story:
    """Notes of several values, their total, and a purchase."""
    name = rng.choice(ALL_NAMES)
    currency = rng.choice(["dollar", "euro", "pound"])
    kinds = rng.sample([2, 5, 10, 20, 50], k=min(3, (n_steps + 1) // 2))
    spend = (n_steps + 1) // 2 * 2 - 1 < n_steps
    steps = _Steps()
    parts, values = [], []
    for v in kinds:
        n = rng.randint(2, 12)
        parts.append(f"{n} {v}-{currency} notes")
        values.append(steps.add(f"Value of the {v}-{currency} notes", n, "*", v))
    sentences = [
        f"{name} has " + ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1] + "."
    ]
    total = values[0]
    for v in values[1:]:
        total = steps.add("Money so far", total, "+", v)
    question = f"How many {currency}s does {name} have?"
    if spend:
        n = rng.randint(1, max(1, total - 1))
        sentences.append(
            f"{name} buys a {rng.choice(['kite', 'watch', 'backpack', 'lamp'])} for {n} {currency}s."
        )
        steps.add("Money left", total, "-", n)
        question = f"How many {currency}s does {name} have left?"
    return sentences, steps, question


def _orchard(rng: random.Random, n_steps: int) -> Story:
    """Trees times fruit per tree, bad fruit, bags, the price of the bags (held out)."""
    fruit = rng.choice(["apples", "pears", "plums", "peaches", "lemons", "cherries"])
    farmer = rng.choice(ALL_NAMES)
    currency = rng.choice(CURRENCIES)
    steps = _Steps()
    trees, per = rng.randint(2, 15), rng.randint(3, 40)
    sentences = [f"{farmer}'s orchard has {trees} trees, and each tree gives {per} {fruit}."]
    value = steps.add(f"{fruit.capitalize()} picked", trees, "*", per)
    question = f"How many {fruit} does {farmer} pick?"
    rest = n_steps - 1
    bags = rest >= 1 and rng.random() < 0.7
    price = bags and rest >= 2 and rng.random() < 0.6
    kept = rng.randint(0, rest - bags - price) if bags else 0
    for _ in range(rest - bags - price - kept):
        if rng.random() < 0.5:
            n = rng.randint(1, max(1, value // 4))
            sentences.append(f"{n} of the {fruit} are bruised and thrown away.")
            value = steps.add(f"Good {fruit}", value, "-", n)
            question = f"How many good {fruit} are left?"
        else:
            n = rng.randint(2, 90)
            sentences.append(f"A neighbour brings another {n} {fruit}.")
            value = steps.add(f"{fruit.capitalize()} in total", value, "+", n)
            question = f"How many {fruit} does {farmer} have?"
    if bags:
        divisors = _divisors(value, 2, 12)
        if not divisors:
            raise _Retry
        k = rng.choice(divisors)
        sentences.append(f"{farmer} puts the {fruit} into bags of {k}.")
        value = steps.add("Bags", value, "/", k)
        question = f"How many bags of {fruit} are there?"
    for _ in range(kept):
        n = rng.randint(1, max(1, value - 1))
        sentences.append(f"{farmer} keeps {n} of the bags for the family.")
        value = steps.add("Bags to sell", value, "-", n)
        question = "How many bags are left to sell?"
    if price:
        cost = rng.randint(2, 12)
        sentences.append(f"Each bag sells for {cost} {currency}.")
        steps.add("Money from the bags", value, "*", cost)
        question = f"How many {currency} does {farmer} get?"
    return sentences, steps, question


def _tank(rng: random.Random, n_steps: int) -> Story:
    """A tank used up day by day, refilled, shared out (held out)."""
    what, unit = rng.choice([("water tank", "liters"), ("fuel tank", "liters"), ("rain barrel", "liters"),
                              ("milk churn", "liters"), ("grain silo", "sacks")])  # fmt: skip
    steps = _Steps()
    cap = rng.randint(100, 900)
    sentences = [f"A {what} holds {cap} {unit} when it is full."]
    value = cap
    used = rng.randint(2, 40)
    days = rng.randint(2, 9)
    question = f"How many {unit} are left in the {what}?"
    if n_steps >= 2:
        sentences.append(f"Every day {used} {unit} are taken out, for {days} days.")
        total = steps.add(f"{unit.capitalize()} taken out", used, "*", days)
        value = steps.add(f"{unit.capitalize()} left", value, "-", total)
    for _ in range(n_steps - len(steps.lines)):
        if rng.random() < 0.5:
            n = rng.randint(1, max(1, value - 1))
            sentences.append(f"Then {n} {unit} leak out.")
            value = steps.add(f"{unit.capitalize()} left", value, "-", n)
        else:
            n = rng.randint(1, 200)
            sentences.append(f"Then {n} {unit} are poured in.")
            value = steps.add(f"{unit.capitalize()} now", value, "+", n)
    if value > cap:
        raise _Retry
    return sentences, steps, question


def _ages(rng: random.Random, n_steps: int) -> Story:
    """Ages defined relative to each other, some years later (held out)."""
    people = rng.sample(ALL_NAMES, k=n_steps + 1)
    steps = _Steps()
    base = rng.randint(3, 30)
    sentences = [f"{people[0]} is {base} years old."]
    ages = [base]
    remaining = n_steps
    later = remaining >= 2 and rng.random() < 0.5
    if later:
        remaining -= 1
    for prev, person in itertools.pairwise(people[: remaining + 1]):
        v = ages[-1]
        kind = rng.choice(["older", "younger", "twice"])
        if kind == "older":
            n = rng.randint(1, 30)
            sentences.append(f"{person} is {n} years older than {prev}.")
            ages.append(steps.add(f"{person}'s age", v, "+", n))
        elif kind == "younger":
            if v < 2:
                raise _Retry
            n = rng.randint(1, v - 1)
            sentences.append(f"{person} is {n} years younger than {prev}.")
            ages.append(steps.add(f"{person}'s age", v, "-", n))
        else:
            sentences.append(f"{person} is twice as old as {prev}.")
            ages.append(steps.add(f"{person}'s age", v, "*", 2))
        if ages[-1] > 99:
            raise _Retry
    if len(steps.lines) < remaining:  # fewer people than steps: a sum of two ages
        raise _Retry
    last = people[len(ages) - 1]
    question = f"How old is {last}?"
    if later:
        n = rng.randint(2, 20)
        if steps.add(f"{last}'s age in {n} years", ages[-1], "+", n) > 99:
            raise _Retry
        question = f"How old will {last} be in {n} years?"
    if not steps.lines:
        raise _Retry
    return sentences, steps, question


def _timing(rng: random.Random, n_steps: int) -> Story:
    """Minutes per task times tasks, breaks, a second activity (held out)."""
    name = rng.choice(ALL_NAMES)
    steps = _Steps()
    _task, tasks = rng.choice([("math problem", "math problems"), ("song", "songs"), ("lap", "laps"),
                              ("letter", "letters"), ("drawing", "drawings")])  # fmt: skip
    per, n = rng.randint(2, 15), rng.randint(2, 12)
    sentences = [f"{name} spends {per} minutes on each of {n} {tasks}."]
    value = steps.add("Minutes on the " + tasks, per, "*", n)
    remaining = n_steps - 1
    while remaining:
        kind = rng.choice(["break", "less"] + (["other"] if remaining >= 2 else []))
        if kind == "break":
            b = rng.randint(3, 30)
            sentences.append(f"{name} also takes a {b}-minute break.")
            value = steps.add("Minutes so far", value, "+", b)
            remaining -= 1
        elif kind == "less":
            b = rng.randint(1, max(1, value - 1))
            sentences.append(f"A friend helps, which saves {b} minutes.")
            value = steps.add("Minutes needed", value, "-", b)
            remaining -= 1
        else:
            p2, n2 = rng.randint(2, 10), rng.randint(2, 8)
            sentences.append(f"Afterwards {name} spends {p2} minutes on each of {n2} chores.")
            extra = steps.add("Minutes on chores", p2, "*", n2)
            value = steps.add("Minutes in total", value, "+", extra)
            remaining -= 2
    question = _pick_question(
        rng, f"How many minutes does {name} spend in total?", f"How many minutes does it all take {name}?"
    )
    return sentences, steps, question


def _sharing(rng: random.Random, n_steps: int) -> Story:
    """Collections put together, given away, and shared equally."""
    people = rng.sample(ALL_NAMES, k=rng.randint(2, min(4, n_steps + 1)))
    _obj, objs = rng.choice(OBJECTS)
    steps = _Steps()
    counts = [rng.randint(2, 150) for _ in people]
    listed = [f"{p} has {c} {objs}" for p, c in zip(people, counts, strict=True)]
    sentences = [", ".join(listed[:-1]) + " and " + listed[-1] + "."]
    total = counts[0]
    for c in counts[1:]:
        total = steps.add("Together so far", total, "+", c)
    question = f"How many {objs} do they have together?"
    rest = n_steps - len(steps.lines)
    share = rest >= 1 and rng.random() < 0.6
    for _ in range(rest - share):
        n = rng.randint(1, max(1, total - 1))
        sentences.append(
            f"They give {n} {objs} to the {rng.choice(['school', 'library', 'hospital', 'club'])}."
        )
        total = steps.add(f"{objs.capitalize()} left", total, "-", n)
        question = f"How many {objs} do they have left?"
    if share:
        divisors = _divisors(total, 2, 9)
        if not divisors:
            raise _Retry
        k = rng.choice(divisors)
        sentences.append(f"They share the {objs} equally among {k} children.")
        steps.add(f"{objs.capitalize()} per child", total, "/", k)
        question = f"How many {objs} does each child get?"
    return sentences, steps, question


def _parking(rng: random.Random, n_steps: int) -> Story:
    """Cars arriving and leaving a car park; the empty spaces."""
    size = rng.randint(50, 600)
    cars = rng.randint(1, size // 2)
    steps = _Steps()
    where = rng.choice(["A car park", "A parking garage", "The lot behind the station"])
    sentences = [f"{where} has {size} spaces, and {cars} cars are parked there."]
    for i in range(n_steps - 1):
        if rng.random() < 0.6:
            n = rng.randint(1, max(1, (size - cars) // 2))
            sentences.append(f"{'Then ' if i else ''}{n} more cars arrive.")
            cars = steps.add("Cars parked", cars, "+", n)
        else:
            if cars < 2:
                raise _Retry
            n = rng.randint(1, cars - 1)
            sentences.append(f"{'Then ' if i else ''}{n} cars drive away.")
            cars = steps.add("Cars parked", cars, "-", n)
    steps.add("Empty spaces", size, "-", cars)
    question = _pick_question(rng, "How many spaces are empty now?", "How many free spaces are left?")
    return sentences, steps, question


MATH_FAMILIES: dict[str, Callable[[random.Random, int], Story]] = {
    # the original five (unchanged functions; here they also get 1 and 6 steps)
    "inventory": _inventory,
    "shopping": _shopping,
    "rate": _rate,
    "compare": _compare,
    "batches": _batches,
    # new
    "diary": _diary,
    "savings": _savings,
    "recipe": _recipe,
    "travel": _travel,
    "garden": _garden,
    "classroom": _classroom,
    "reading": _reading,
    "wages": _wages,
    "sports": _sports,
    "fundraiser": _fundraiser,
    "party": _party,
    "coins": _coins,
    "sharing": _sharing,
    "parking": _parking,
    # held out (below)
    "bus": _bus,
    "legs": _legs,
    "orchard": _orchard,
    "tank": _tank,
    "ages": _ages,
    "timing": _timing,
}
# Never generated for training; each has relatives among the training families (bus: diary and
# parking; legs: coins; orchard: garden and batches; tank: savings; ages: compare; timing: wages).
HELDOUT_MATH_FAMILIES: tuple[str, ...] = ("ages", "bus", "legs", "orchard", "tank", "timing")
TRAIN_MATH_FAMILIES: tuple[str, ...] = tuple(f for f in MATH_FAMILIES if f not in HELDOUT_MATH_FAMILIES)


def is_heldout_question(question: str) -> bool:
    """Broadened generator: whether a question belongs to the held-out-seed split (by its hash)."""
    digest = hashlib.sha1(question.encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_QUESTION_BUCKETS == 0


def _maybe_distract(rng: random.Random, sentences: list[str]) -> None:
    """With probability 0.3, insert a distractor sentence (its number plays no part) after the first."""
    if rng.random() < 0.3:
        template = rng.choice(MORE_DISTRACTORS)
        other = rng.choice(ALL_NAMES)
        sentences.insert(rng.randint(1, len(sentences)), template.format(other=other, n=rng.randint(2, 99)))


def _draw_scenario(rng: random.Random, family: str, n_steps: int) -> tuple[list[str], _Steps, str] | None:
    """One draw of ``family``'s story with ``n_steps`` steps, a distractor maybe inserted:
    ``(sentences, steps, question)``, or None when the draw must be retried."""
    try:
        sentences, steps, question = MATH_FAMILIES[family](rng, n_steps)
    except _Retry:
        return None
    if not MIN_STEPS <= len(steps.lines) <= MAX_STEPS:
        return None
    _maybe_distract(rng, sentences)
    return sentences, steps, question


def generate_family_problem(seed: int, families: Sequence[str] = TRAIN_MATH_FAMILIES) -> MathProblem:
    """The broadened generator's problem for ``seed``: 1–6 steps, a family from ``families``."""
    unknown = set(families) - set(MATH_FAMILIES)
    if unknown or not families:
        raise RelaxSpecError(f"unknown math families: {sorted(unknown)}" if unknown else "no families")
    rng = random.Random(seed)
    for _ in range(1000):
        n_steps = rng.randint(MIN_STEPS, MAX_STEPS)
        family = rng.choice(list(families))
        drawn = _draw_scenario(rng, family, n_steps)
        if drawn is None:
            continue
        sentences, steps, question = drawn
        answer = int(steps.lines[-1].rsplit("= ", 1)[1])
        solution = "\n".join([*steps.lines, f"#### {answer}"])
        text = " ".join([*sentences, question])
        return MathProblem(seed, text, solution, answer, len(steps.lines), family=family)
    raise RuntimeError(f"could not generate a math problem for seed {seed}")  # pragma: no cover


def train_family_problems(n: int, start: int = 0) -> list[MathProblem]:
    """Broadened training problems: training families, seeds from ``start``, held-out questions skipped."""
    out, seed = [], start
    while len(out) < n:
        if seed >= EVAL_SEED_START:
            raise ValueError("training seeds would overlap the evaluation range")
        p = generate_family_problem(seed, TRAIN_MATH_FAMILIES)
        if not is_heldout_question(p.question):
            out.append(p)
        seed += 1
    return out


def eval_family_seed_problems(n: int) -> list[MathProblem]:
    """Held-out seeds of the broadened generator: training families, held-out questions only."""
    out, seed = [], EVAL_SEED_START
    while len(out) < n:
        p = generate_family_problem(seed, TRAIN_MATH_FAMILIES)
        if is_heldout_question(p.question):
            out.append(p)
        seed += 1
    return out


def heldout_family_problems(n: int) -> list[MathProblem]:
    """Held-out scenario families (:data:`HELDOUT_MATH_FAMILIES`: new story types) on the evaluation seeds."""
    return [generate_family_problem(EVAL_SEED_START + i, HELDOUT_MATH_FAMILIES) for i in range(n)]


# =============================================================================================
# Phrasing styles: held-out *phrasing* families (issue 15)
#
# The same story (training scenario, same arithmetic, same vocabulary) can be rendered in several
# phrasing styles: as written, question first, numbered facts, linked by connectives, small
# numbers spelled out as words, or one sentence joined by semicolons. A *phrasing family* is one
# (scenario, style) pair. Each training scenario has one style held out (:data:`HELDOUT_PHRASINGS`)
# and is trained in all the others, and each style is trained with most scenarios, so a held-out
# phrasing family is seen arithmetic and seen wording in a combination never seen in training.

PHRASING_STYLES: tuple[str, ...] = (
    "plain",
    "question_first",
    "numbered",
    "connectors",
    "number_words",
    "semicolons",
)
NUMBER_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
_LEAD_INS = ("Here is what happened:", "Use these facts:", "The story:", "What we know:")
_CONNECTORS = ("Then", "After that,", "Next,", "Later,")
# first words that are not names: lower-cased when a sentence continues another
_COMMON_STARTS = frozenset(
    [
        "A",
        "An",
        "The",
        "They",
        "On",
        "At",
        "In",
        "Each",
        "Every",
        "It",
        "There",
        "Afterwards",
        "After",
        "Later",
        "Next",
        "Her",
        "His",
        "Their",
        "One",
        "Some",
        "All",
        "Both",
        "When",
        "During",
        "By",
        "For",
        "To",
        "If",
        "Finally",
        "Half",
        "Twice",
        "Everyone",
        "Nobody",
    ]
)
_SMALL_NUMBER = re.compile(r"\b(1?\d|20)\b")


def _continue(sentence: str) -> str:
    """A sentence as it reads after a connective: its first word lower-cased unless it is a name."""
    first = sentence.split(" ", 1)[0]
    return sentence[:1].lower() + sentence[1:] if first in _COMMON_STARTS else sentence


def render_style(style: str, sentences: list[str], question: str, rng: random.Random) -> str | None:
    """The question text of a story in ``style``, or None where the style would not change it
    (one sentence to number or link, no number up to twenty to spell out)."""
    if style == "plain":
        return " ".join([*sentences, question])
    if style == "question_first":
        return " ".join([question, rng.choice(_LEAD_INS), *sentences])
    if len(sentences) < 2 and style in ("numbered", "connectors", "semicolons"):
        return None
    if style == "numbered":
        return " ".join([*(f"({i}) {s}" for i, s in enumerate(sentences, 1)), question])
    if style == "connectors":
        linked = [sentences[0]]
        for sentence in sentences[1:]:
            if sentence.startswith("Then "):
                linked.append(sentence)
            else:
                linked.append(f"{rng.choice(_CONNECTORS)} {_continue(sentence)}")
        return " ".join([*linked, question])
    if style == "semicolons":
        parts = [sentences[0].rstrip(".")] + [_continue(s).rstrip(".") for s in sentences[1:]]
        return "; ".join(parts) + ". " + question
    if style == "number_words":
        text = " ".join([*sentences, question])
        spelled = _SMALL_NUMBER.sub(lambda m: NUMBER_WORDS[int(m.group())], text)
        return spelled if spelled != text else None
    raise RelaxSpecError(f"unknown phrasing style {style!r}; choose from {', '.join(PHRASING_STYLES)}")


def _phrasing(family: str, style: str) -> str:
    return f"{family}/{style}"


# One held-out style per training scenario, rotating over the non-plain styles in scenario order.
HELDOUT_PHRASINGS: tuple[str, ...] = tuple(
    _phrasing(family, PHRASING_STYLES[1 + i % (len(PHRASING_STYLES) - 1)])
    for i, family in enumerate(sorted(TRAIN_MATH_FAMILIES))
)
TRAIN_PHRASINGS: tuple[str, ...] = tuple(
    _phrasing(family, style)
    for family in sorted(TRAIN_MATH_FAMILIES)
    for style in PHRASING_STYLES
    if _phrasing(family, style) not in HELDOUT_PHRASINGS
)


def generate_styled_problem(seed: int, phrasings: Sequence[str] = TRAIN_PHRASINGS) -> MathProblem:
    """The problem for ``seed`` from one (scenario, style) phrasing family of ``phrasings``.

    ``family`` of the result is ``"<scenario>/<style>"``; the solution is the scenario's own.
    """
    valid = {_phrasing(f, st) for f in MATH_FAMILIES for st in PHRASING_STYLES}
    unknown = set(phrasings) - valid
    if unknown or not phrasings:
        raise RelaxSpecError(f"unknown phrasing families: {sorted(unknown)}" if unknown else "no phrasings")
    rng = random.Random(seed)
    phrasing = rng.choice(list(phrasings))
    family, style = phrasing.split("/")
    for _ in range(1000):
        n_steps = rng.randint(MIN_STEPS, MAX_STEPS)
        drawn = _draw_scenario(rng, family, n_steps)
        if drawn is None:
            continue
        sentences, steps, question = drawn
        text = render_style(style, sentences, question, rng)
        if text is None:
            continue
        answer = int(steps.lines[-1].rsplit("= ", 1)[1])
        solution = "\n".join([*steps.lines, f"#### {answer}"])
        return MathProblem(seed, text, solution, answer, len(steps.lines), family=phrasing)
    raise RuntimeError(f"could not generate a styled math problem for seed {seed}")  # pragma: no cover


def train_styled_problems(n: int, start: int = 0) -> list[MathProblem]:
    """Training problems over :data:`TRAIN_PHRASINGS`, seeds ``start .. start + n - 1``."""
    if start + n > EVAL_SEED_START:
        raise ValueError("training seeds would overlap the evaluation range")
    return [generate_styled_problem(seed, TRAIN_PHRASINGS) for seed in range(start, start + n)]


def heldout_phrasing_problems(n: int) -> list[MathProblem]:
    """Held-out phrasing families (:data:`HELDOUT_PHRASINGS`) on the evaluation seeds."""
    return [generate_styled_problem(EVAL_SEED_START + i, HELDOUT_PHRASINGS) for i in range(n)]
