"""The broadened generator's held-out scenario families (bus, legs, orchard, tank, ages, timing):
never generated for training; each has relatives among the training families."""

from __future__ import annotations

import itertools
import random

from relaxspec.data.mathgen.problem import Story, _divisors, _Retry, _Steps
from relaxspec.data.mathgen.stories import _pick_question
from relaxspec.data.mathgen.words import ALL_NAMES, CURRENCIES, ORDINALS


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
