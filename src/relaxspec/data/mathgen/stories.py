"""The broadened generator's training story families (a diary of changes, savings, recipes, travel
legs, a garden, classrooms, reading, wages, sports, a fundraiser, a party, coins, sharing, a car
park); the original five are reused as they are."""

from __future__ import annotations

import random

from relaxspec.data.mathgen.problem import MAX_VALUE, Story, _divisors, _Retry, _Steps
from relaxspec.data.mathgen.words import (
    ALL_NAMES,
    CURRENCIES,
    DAYS,
    MORE_GAIN_VERBS,
    MORE_LOSS_VERBS,
    OBJECTS,
)


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
