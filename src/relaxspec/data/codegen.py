"""Synthetic code tasks with unit tests, at the scale of the bundled models (issue 15).

A task is HumanEval-shaped: the prompt is a function signature and docstring, the model writes the
body, and the task's unit tests (``def check(candidate): assert ...``) decide pass@1 in the
sandbox (:func:`relaxspec.eval.sandbox.check_completion`)::

    def sum_evens(nums: list[int]) -> int:
        \"\"\"Return the sum of the even numbers in nums.

        >>> sum_evens([3, 8, 2, 5])
        10
        \"\"\"
        return sum(x for x in nums if x % 2 == 0)

Tasks come from template **families** (sum of evens, clamp, reverse words, running max, word
counts, ...): small integer, list, string and dict functions whose canonical bodies are 1–6 lines.
Each family draws, from one integer seed, its function name, argument names, docstring phrasing,
constants (a threshold, a divisor, a separator), whether the signature is annotated, zero to two
docstring examples and five or six test inputs (edge cases plus random ones). Expected outputs come
from a reference implementation written separately from the body template, so "every canonical
body passes its own tests" checks the two against each other.

Splits, all deterministic:

- **training** — :data:`TRAIN_FAMILIES`, seeds ``[0, EVAL_SEED_START)``, only tasks whose *spec*
  (signature + docstring sentence, without examples) is outside the held-out spec bucket;
- **held-out seeds** — the same families, seeds from :data:`EVAL_SEED_START` on, only tasks whose
  spec falls in the held-out bucket (one spec in :data:`HELDOUT_SPEC_BUCKETS`). No held-out prompt
  can appear in the training stream, whatever the sizes: the bucket is a function of the spec;
- **held-out families** — :data:`HELDOUT_FAMILIES`, never generated for training. Each has close
  training relatives (``sum_odds`` next to ``sum_evens`` and ``count_odds``, ``running_min`` next
  to ``running_max``), so it measures composition of learned pieces, not new knowledge.

**Pipelines** (generator version 2, end of this module): tasks composed of a filter, a map and an
aggregator over a list of integers or the words of a string (:data:`PIPELINE_COMBOS`, 641
combinations). :data:`HELDOUT_COMBOS` (68) are never generated for training, and every piece and
every pair of pieces they use is in some training combination (:data:`TRAIN_COMBOS`), so they
measure composition of seen pieces (:func:`train_pipeline_tasks`, :func:`heldout_combo_tasks`).

The training document is ``prompt + solution``; the solution starts with ``"\\n    "`` (the prompt
ends at the closing quotes, as the HumanEval prompts do in :mod:`relaxspec.eval.datasets`) and
ends at the last line of the body, where the next document's ``<|endoftext|>`` follows.
Adding or changing a family changes which task a seed gives: :data:`GENERATOR_VERSION` says which.
"""

from __future__ import annotations

import copy
import hashlib
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from relaxspec.errors import RelaxSpecError

GENERATOR_VERSION = 2  # 2: compositional pipeline combinations added (families unchanged)
EVAL_SEED_START = 1_000_000_000  # seeds below: training; from here on: evaluation
HELDOUT_SPEC_BUCKETS = 10  # one spec (signature + docstring sentence) in ten is held out


@dataclass(frozen=True)
class CodeTask:
    """One task: ``prompt`` (signature + docstring), ``solution`` (body) and ``test`` (``check``)."""

    seed: int
    family: str
    entry_point: str
    prompt: str  # ends with the docstring's closing quotes, no trailing newline
    solution: str  # "\n    <line>\n    <line>...": appended to the prompt it completes
    test: str  # "def check(candidate):\n    assert candidate(...) == ...\n..."
    spec: str  # signature + docstring sentence: the key of the held-out-seed split

    @property
    def text(self) -> str:
        """The training document: prompt followed by the canonical body."""
        return self.prompt + self.solution

    @property
    def task_id(self) -> str:
        return f"synthcode/{self.family}/{self.seed}"

    @property
    def problem(self) -> dict:
        """The HumanEval-shaped problem the sandbox scorer takes (``prompt``, ``test``, ...)."""
        return {
            "task_id": self.task_id,
            "prompt": self.prompt,
            "test": self.test,
            "entry_point": self.entry_point,
            "canonical_solution": self.solution,
        }


@dataclass
class _Spec:
    """What a family draws for one task; the generator picks the name, phrasing and examples."""

    names: tuple[str, ...]
    params: tuple[tuple[str, str], ...]  # (argument name, annotation)
    returns: str
    docs: tuple[str, ...]
    body: tuple[str, ...]
    ref: Callable[..., object]  # reference implementation, independent of the body template
    inputs: list[tuple]


class _Retry(Exception):
    """A draw broke a family's constraint; the generator draws again."""


_FAMILIES: dict[str, Callable[[random.Random], _Spec]] = {}


def _family(name: str) -> Callable[[Callable[[random.Random], _Spec]], Callable[[random.Random], _Spec]]:
    def register(fn: Callable[[random.Random], _Spec]) -> Callable[[random.Random], _Spec]:
        _FAMILIES[name] = fn
        return fn

    return register


# ---------------------------------------------------------------------------------------------
# Value and name pools

LIST_ARGS = ("nums", "numbers", "values", "items", "data", "xs", "arr", "seq")
STR_ARGS = ("s", "text", "phrase", "sentence", "line", "words")
WORD_ARGS = ("word", "s", "text", "token", "name")
INT_ARGS = ("n", "num", "x", "value", "number")
DICT_ARGS = ("d", "counts", "table", "mapping", "scores", "stock")
WORDS = (
    "apple", "river", "stone", "moon", "tree", "cat", "sky", "blue", "green", "door", "lamp",
    "bird", "fish", "code", "book", "sun", "rain", "wind", "road", "hill", "star", "ship", "bread",
    "cloud", "glass", "paper", "music", "table", "chair", "light", "grass", "snow", "fire", "sea",
    "map", "key", "box", "pen", "cup", "owl", "egg", "ice", "ant", "oak", "elm", "a", "an", "the",
)  # fmt: skip
PALINDROMES = ("level", "noon", "radar", "kayak", "racecar", "refer", "madam", "civic", "a", "")
KEYS = ("red", "blue", "green", "apples", "pears", "tea", "milk", "pens", "cups", "bob", "ann", "max")


def _ints(r: random.Random, n_lo: int = 3, n_hi: int = 8, lo: int = -9, hi: int = 30) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(n_lo, n_hi))]


def _sentence(r: random.Random, lo: int = 2, hi: int = 6) -> str:
    return " ".join(r.choice(WORDS) for _ in range(r.randint(lo, hi)))


def _dict(r: random.Random, lo: int = 2, hi: int = 5, vlo: int = 0, vhi: int = 40) -> dict[str, int]:
    return {k: r.randint(vlo, vhi) for k in r.sample(KEYS, r.randint(lo, hi))}


# ---------------------------------------------------------------------------------------------
# Families: integers


@_family("clamp")
def _clamp(r: random.Random) -> _Spec:
    x, lo, hi = r.choice([("x", "lo", "hi"), ("value", "low", "high"), ("n", "smallest", "largest")])
    a, b = sorted(r.sample(range(-20, 40), 2))
    return _Spec(
        names=("clamp", "clip", "bound", "limit_value"),
        params=((x, "int"), (lo, "int"), (hi, "int")),
        returns="int",
        docs=(
            f"Return {x} limited to the range from {lo} to {hi}.",
            f"Clamp {x} so that it is at least {lo} and at most {hi}.",
            f"If {x} is below {lo} return {lo}, if it is above {hi} return {hi}, otherwise return {x}.",
        ),
        body=(f"return max({lo}, min({x}, {hi}))",),
        ref=lambda v, low, high: low if v < low else high if v > high else v,
        inputs=[
            (a - 3, a, b),
            (b + 5, a, b),
            ((a + b) // 2, a, b),
            (a, a, b),
            (b, a, b),
            (r.randint(-30, 60), a, b),
        ],
    )


@_family("abs_diff")
def _abs_diff(r: random.Random) -> _Spec:
    a, b = r.choice([("a", "b"), ("x", "y"), ("first", "second"), ("m", "n")])
    return _Spec(
        names=("abs_diff", "distance", "gap", "difference"),
        params=((a, "int"), (b, "int")),
        returns="int",
        docs=(
            f"Return the absolute difference between {a} and {b}.",
            f"Return how far apart {a} and {b} are on the number line.",
            f"Return {a} minus {b} if that is not negative, else {b} minus {a}.",
        ),
        body=(f"return abs({a} - {b})",),
        ref=lambda p, q: p - q if p >= q else q - p,
        inputs=[(3, 10), (10, 3), (-4, 4), (7, 7), (r.randint(-50, 50), r.randint(-50, 50))],
    )


@_family("digit_sum")
def _digit_sum(r: random.Random) -> _Spec:
    n = r.choice(INT_ARGS)
    return _Spec(
        names=("digit_sum", "sum_digits", "sum_of_digits", "add_digits"),
        params=((n, "int"),),
        returns="int",
        docs=(
            f"Return the sum of the decimal digits of the non-negative integer {n}.",
            f"Add up the digits of {n} (which is at least 0) and return the total.",
            f"Given a whole number {n} >= 0, return the sum of its digits.",
        ),
        body=(f"return sum(int(c) for c in str({n}))",),
        ref=lambda v: _digits_total(v),
        inputs=[(0,), (7,), (305,), (r.randint(10, 99),), (r.randint(1000, 99999),)],
    )


def _digits_total(v: int) -> int:
    total = 0
    while v:
        total, v = total + v % 10, v // 10
    return total


@_family("max_digit")
def _max_digit(r: random.Random) -> _Spec:
    n = r.choice(INT_ARGS)
    return _Spec(
        names=("max_digit", "largest_digit", "biggest_digit"),
        params=((n, "int"),),
        returns="int",
        docs=(
            f"Return the largest decimal digit of the non-negative integer {n}.",
            f"Given a whole number {n} >= 0, return its biggest digit.",
            f"Return the highest digit that appears in {n} (which is at least 0).",
        ),
        body=(f"return max(int(c) for c in str({n}))",),
        ref=lambda v: max(int(c) for c in f"{v:d}"),
        inputs=[(0,), (5,), (291,), (r.randint(10, 99),), (r.randint(1000, 99999),)],
    )


@_family("count_digits")
def _count_digits(r: random.Random) -> _Spec:
    n = r.choice(INT_ARGS)
    return _Spec(
        names=("count_digits", "num_digits", "digit_count", "length_of_number"),
        params=((n, "int"),),
        returns="int",
        docs=(
            f"Return how many decimal digits {n} has, ignoring its sign.",
            f"Return the number of digits of the integer {n} (a minus sign does not count).",
            f"Count the digits in {n}; negative numbers count like positive ones.",
        ),
        body=(f"return len(str(abs({n})))",),
        ref=lambda v: len(f"{v:d}".lstrip("-")),
        inputs=[(0,), (-7,), (r.randint(10, 99),), (-r.randint(100, 999),), (r.randint(10000, 999999),)],
    )


@_family("is_multiple")
def _is_multiple(r: random.Random) -> _Spec:
    n = r.choice(INT_ARGS)
    k = r.randint(2, 9)
    return _Spec(
        names=("is_multiple", f"divisible_by_{k}", f"is_multiple_of_{k}", "check_divisible"),
        params=((n, "int"),),
        returns="bool",
        docs=(
            f"Return True if {n} is divisible by {k}, else False.",
            f"Return whether {n} is a multiple of {k}.",
            f"Check if {k} divides {n} exactly.",
        ),
        body=(f"return {n} % {k} == 0",),
        ref=lambda v: (v // k) * k == v,
        inputs=[(0,), (k,), (k + 1,), (k * r.randint(2, 20),), (k * r.randint(2, 20) + r.randint(1, k - 1),)],
    )


@_family("max_of_three")
def _max_of_three(r: random.Random) -> _Spec:
    a, b, c = r.choice([("a", "b", "c"), ("x", "y", "z"), ("first", "second", "third"), ("p", "q", "r")])
    return _Spec(
        names=("max_of_three", "largest_of_three", "biggest", "max3"),
        params=((a, "int"), (b, "int"), (c, "int")),
        returns="int",
        docs=(
            f"Return the largest of {a}, {b} and {c}.",
            f"Return the biggest value among the three numbers {a}, {b}, {c}.",
            "Given three integers, return the maximum one.",
        ),
        body=(f"return max({a}, {b}, {c})",),
        ref=lambda p, q, s: sorted([p, q, s])[2],
        inputs=[(1, 2, 3), (9, 4, 1), (2, 8, 5), (-3, -7, -1), tuple(r.randint(-20, 20) for _ in range(3))],
    )


@_family("min_of_three")
def _min_of_three(r: random.Random) -> _Spec:
    a, b, c = r.choice([("a", "b", "c"), ("x", "y", "z"), ("first", "second", "third"), ("p", "q", "r")])
    return _Spec(
        names=("min_of_three", "smallest_of_three", "smallest", "min3"),
        params=((a, "int"), (b, "int"), (c, "int")),
        returns="int",
        docs=(
            f"Return the smallest of {a}, {b} and {c}.",
            f"Return the lowest value among the three numbers {a}, {b}, {c}.",
            "Given three integers, return the minimum one.",
        ),
        body=(f"return min({a}, {b}, {c})",),
        ref=lambda p, q, s: sorted([p, q, s])[0],
        inputs=[(1, 2, 3), (9, 4, 1), (8, 2, 5), (-3, -7, -1), tuple(r.randint(-20, 20) for _ in range(3))],
    )


@_family("sign")
def _sign(r: random.Random) -> _Spec:
    n = r.choice(INT_ARGS)
    return _Spec(
        names=("sign", "sign_of", "signum"),
        params=((n, "int"),),
        returns="int",
        docs=(
            f"Return 1 if {n} is positive, -1 if it is negative and 0 if it is zero.",
            f"Return the sign of {n}: 1, -1 or 0.",
            f"Return -1, 0 or 1 depending on whether {n} is below, equal to or above zero.",
        ),
        body=(f"if {n} > 0:", "    return 1", f"if {n} < 0:", "    return -1", "return 0"),
        ref=lambda v: (v > 0) - (v < 0),
        inputs=[(0,), (r.randint(1, 99),), (-r.randint(1, 99),), (1,), (-1,)],
    )


@_family("linear")
def _linear(r: random.Random) -> _Spec:
    x = r.choice(INT_ARGS)
    a, b = r.randint(2, 9), r.randint(1, 20)
    return _Spec(
        names=("linear", "affine", "scale_and_shift", "transform"),
        params=((x, "int"),),
        returns="int",
        docs=(
            f"Return {a} times {x} plus {b}.",
            f"Multiply {x} by {a}, add {b} and return the result.",
            f"Compute {a} * {x} + {b}.",
        ),
        body=(f"return {a} * {x} + {b}",),
        ref=lambda v: sum([v] * a) + b,
        inputs=[(0,), (1,), (-2,), (r.randint(2, 50),), (r.randint(-50, -3),)],
    )


@_family("sum_to_n")
def _sum_to_n(r: random.Random) -> _Spec:
    n = r.choice(INT_ARGS)
    return _Spec(
        names=("sum_to_n", "triangle_number", "sum_up_to", "total_to"),
        params=((n, "int"),),
        returns="int",
        docs=(
            f"Return the sum of the integers from 1 to {n} inclusive (0 when {n} is 0).",
            f"Return 1 + 2 + ... + {n} for a non-negative integer {n}.",
            f"Add up every whole number from 1 up to and including {n}.",
        ),
        body=(f"return {n} * ({n} + 1) // 2",),
        ref=lambda v: sum(range(v + 1)),
        inputs=[(0,), (1,), (4,), (r.randint(5, 30),), (r.randint(31, 200),)],
    )


@_family("factorial")
def _factorial(r: random.Random) -> _Spec:
    n = r.choice(INT_ARGS)
    return _Spec(
        names=("factorial", "fact", "product_up_to"),
        params=((n, "int"),),
        returns="int",
        docs=(
            f"Return the factorial of the non-negative integer {n}.",
            f"Return {n}!, the product of the integers from 1 to {n} (1 when {n} is 0).",
            f"Multiply together all whole numbers from 1 to {n} and return the product.",
        ),
        body=("result = 1", f"for i in range(2, {n} + 1):", "    result *= i", "return result"),
        ref=lambda v: _product(range(1, v + 1)),
        inputs=[(0,), (1,), (3,), (r.randint(4, 7),), (r.randint(8, 12),)],
    )


def _product(values: Sequence[int] | range) -> int:
    out = 1
    for v in values:
        out = out * v
    return out


@_family("gcd")
def _gcd(r: random.Random) -> _Spec:
    a, b = r.choice([("a", "b"), ("x", "y"), ("m", "n")])
    pairs = [(12, 18), (7, 5), (r.randint(1, 60), r.randint(1, 60))]
    g = r.randint(2, 12)
    pairs.append((g * r.randint(1, 9), g * r.randint(1, 9)))
    pairs.append((r.randint(1, 99), 0))
    return _Spec(
        names=("gcd", "greatest_common_divisor", "common_factor", "highest_common_factor"),
        params=((a, "int"), (b, "int")),
        returns="int",
        docs=(
            f"Return the greatest common divisor of the non-negative integers {a} and {b}.",
            f"Return the largest integer that divides both {a} and {b}.",
            f"Compute the GCD of {a} and {b} with Euclid's algorithm.",
        ),
        body=(f"while {b}:", f"    {a}, {b} = {b}, {a} % {b}", f"return {a}"),
        ref=lambda p, q: max(d for d in range(1, max(p, q) + 1) if p % d == 0 and q % d == 0),
        inputs=pairs,
    )


@_family("round_down")
def _round_down(r: random.Random) -> _Spec:
    n = r.choice(INT_ARGS)
    k = r.choice([3, 4, 5, 6, 8, 10, 25, 100])
    return _Spec(
        names=("round_down", f"floor_to_{k}", "round_down_to_multiple", "truncate_to_step"),
        params=((n, "int"),),
        returns="int",
        docs=(
            f"Round the non-negative integer {n} down to the nearest multiple of {k}.",
            f"Return the largest multiple of {k} that is not greater than {n} ({n} >= 0).",
            f"Return {n} with its remainder modulo {k} removed.",
        ),
        body=(f"return {n} - {n} % {k}",),
        ref=lambda v: (v // k) * k,
        inputs=[(0,), (k,), (k - 1,), (k * r.randint(2, 9) + r.randint(1, k - 1),), (r.randint(1, 999),)],
    )


@_family("in_range")
def _in_range(r: random.Random) -> _Spec:
    x, lo, hi = r.choice([("x", "lo", "hi"), ("value", "low", "high"), ("n", "start", "stop")])
    a, b = sorted(r.sample(range(-20, 40), 2))
    return _Spec(
        names=("in_range", "between", "is_between", "within"),
        params=((x, "int"), (lo, "int"), (hi, "int")),
        returns="bool",
        docs=(
            f"Return True if {x} lies between {lo} and {hi}, both included.",
            f"Return whether {lo} <= {x} <= {hi}.",
            f"Check that {x} is at least {lo} and at most {hi}.",
        ),
        body=(f"return {lo} <= {x} <= {hi}",),
        ref=lambda v, low, high: not (v < low or v > high),
        inputs=[(a, a, b), (b, a, b), (a - 1, a, b), (b + 1, a, b), ((a + b) // 2, a, b)],
    )


# ---------------------------------------------------------------------------------------------
# Families: lists of integers


def _list_family(
    r: random.Random,
    names: tuple[str, ...],
    docs: Callable[[str], tuple[str, ...]],
    body: Callable[[str], tuple[str, ...]],
    ref: Callable[[list[int]], object],
    returns: str,
    edges: list[list[int]],
    n_random: int = 3,
    **ints: int,
) -> _Spec:
    xs = r.choice(LIST_ARGS)
    return _Spec(
        names=names,
        params=((xs, "list[int]"),),
        returns=returns,
        docs=docs(xs),
        body=body(xs),
        ref=ref,
        inputs=[(e,) for e in edges] + [(_ints(r, **ints),) for _ in range(n_random)],
    )


@_family("sum_evens")
def _sum_evens(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("sum_evens", "sum_of_evens", "even_total", "add_evens"),
        lambda xs: (
            f"Return the sum of the even numbers in {xs}.",
            f"Add up every even element of {xs} and return the total.",
            f"Return the total of the values in {xs} that are divisible by 2.",
        ),
        lambda xs: (f"return sum(x for x in {xs} if x % 2 == 0)",),
        lambda v: sum(x for x in v if not x & 1),
        "int",
        [[], [1, 3], [2, 3, 4]],
    )


@_family("sum_odds")
def _sum_odds(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("sum_odds", "sum_of_odds", "odd_total", "add_odds"),
        lambda xs: (
            f"Return the sum of the odd numbers in {xs}.",
            f"Add up every odd element of {xs} and return the total.",
            f"Return the total of the values in {xs} that are not divisible by 2.",
        ),
        lambda xs: (f"return sum(x for x in {xs} if x % 2 == 1)",),
        lambda v: sum(x for x in v if x & 1),
        "int",
        [[], [2, 4], [2, 3, 5]],
    )


@_family("count_odds")
def _count_odds(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("count_odds", "num_odd", "odd_count", "how_many_odd"),
        lambda xs: (
            f"Return how many numbers in {xs} are odd.",
            f"Count the odd elements of {xs}.",
            f"Return the number of values in {xs} that leave remainder 1 when divided by 2.",
        ),
        lambda xs: (f"return sum(1 for x in {xs} if x % 2 == 1)",),
        lambda v: len([x for x in v if x & 1]),
        "int",
        [[], [2, 4], [1, 2, 3]],
    )


def _threshold_family(
    r: random.Random,
    names: tuple[str, ...],
    docs: Callable[[str, int], tuple[str, ...]],
    body: Callable[[str, int], tuple[str, ...]],
    ref: Callable[[list[int], int], object],
    returns: str,
) -> _Spec:
    k = r.randint(0, 20)
    return _list_family(
        r,
        names,
        lambda xs: docs(xs, k),
        lambda xs: body(xs, k),
        lambda v: ref(v, k),
        returns,
        [[], [k - 1, k, k + 1], [k, k + 2, k - 3, k]],
        lo=-5,
        hi=35,
    )


@_family("count_above")
def _count_above(r: random.Random) -> _Spec:
    return _threshold_family(
        r,
        ("count_above", "count_greater", "num_above", "how_many_above"),
        lambda xs, k: (
            f"Return how many numbers in {xs} are greater than {k}.",
            f"Count the elements of {xs} that are strictly above {k}.",
            f"Return the number of values in {xs} larger than {k}.",
        ),
        lambda xs, k: (f"return sum(1 for x in {xs} if x > {k})",),
        lambda v, k: len([x for x in v if k < x]),
        "int",
    )


@_family("count_below")
def _count_below(r: random.Random) -> _Spec:
    return _threshold_family(
        r,
        ("count_below", "count_less", "num_below", "how_many_below"),
        lambda xs, k: (
            f"Return how many numbers in {xs} are less than {k}.",
            f"Count the elements of {xs} that are strictly below {k}.",
            f"Return the number of values in {xs} smaller than {k}.",
        ),
        lambda xs, k: (f"return sum(1 for x in {xs} if x < {k})",),
        lambda v, k: len([x for x in v if k > x]),
        "int",
    )


@_family("filter_above")
def _filter_above(r: random.Random) -> _Spec:
    return _threshold_family(
        r,
        ("filter_above", "keep_greater", "values_above", "select_above"),
        lambda xs, k: (
            f"Return the elements of {xs} that are greater than {k}, in their original order.",
            f"Keep only the numbers in {xs} larger than {k} and return them as a list.",
            f"Return a new list with every value from {xs} that exceeds {k}.",
        ),
        lambda xs, k: (f"return [x for x in {xs} if x > {k}]",),
        lambda v, k: [x for x in v if not x <= k],
        "list[int]",
    )


@_family("filter_at_most")
def _filter_at_most(r: random.Random) -> _Spec:
    return _threshold_family(
        r,
        ("filter_at_most", "keep_small", "values_up_to", "drop_above"),
        lambda xs, k: (
            f"Return the elements of {xs} that are at most {k}, in their original order.",
            f"Remove every number greater than {k} from {xs} and return what is left.",
            f"Return a new list with the values from {xs} that do not exceed {k}.",
        ),
        lambda xs, k: (f"return [x for x in {xs} if x <= {k}]",),
        lambda v, k: [x for x in v if not x > k],
        "list[int]",
    )


def _running(r: random.Random, op: str, names: tuple[str, ...], word: str, ref: Callable) -> _Spec:
    return _list_family(
        r,
        names,
        lambda xs: (
            f"Return a list whose i-th element is the {word} of the first i + 1 elements of {xs}.",
            f"Return the running {word} of {xs}.",
            f"For each position in {xs}, return the {word} value seen so far.",
        ),
        lambda xs: (
            "result = []",
            f"for x in {xs}:",
            "    if result:",
            f"        x = {op}(x, result[-1])",
            "    result.append(x)",
            "return result",
        ),
        ref,
        "list[int]",
        [[], [3, 1, 4, 1, 5], [5, 4, 3, 6]],
    )


@_family("running_max")
def _running_max(r: random.Random) -> _Spec:
    ref = lambda v: [max(v[: i + 1]) for i in range(len(v))]  # noqa: E731
    return _running(r, "max", ("running_max", "prefix_max", "cumulative_max", "max_so_far"), "largest", ref)


@_family("running_min")
def _running_min(r: random.Random) -> _Spec:
    ref = lambda v: [min(v[: i + 1]) for i in range(len(v))]  # noqa: E731
    return _running(r, "min", ("running_min", "prefix_min", "cumulative_min", "min_so_far"), "smallest", ref)


@_family("running_sum")
def _running_sum(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("running_sum", "prefix_sums", "cumulative_sum", "partial_sums"),
        lambda xs: (
            f"Return a list whose i-th element is the sum of the first i + 1 elements of {xs}.",
            f"Return the running totals of {xs}.",
            f"Return the cumulative sums of {xs}, one per element.",
        ),
        lambda xs: (
            "result = []",
            "total = 0",
            f"for x in {xs}:",
            "    total += x",
            "    result.append(total)",
            "return result",
        ),
        lambda v: [sum(v[: i + 1]) for i in range(len(v))],
        "list[int]",
        [[], [1, 2, 3], [5, -5, 5]],
    )


@_family("scale_list")
def _scale_list(r: random.Random) -> _Spec:
    k = r.randint(2, 9)
    return _list_family(
        r,
        ("scale_list", "multiply_all", f"times_{k}", "scaled"),
        lambda xs: (
            f"Return a new list with every element of {xs} multiplied by {k}.",
            f"Multiply each number in {xs} by {k} and return the results in order.",
            f"Return [{k} * x for each x in {xs}].",
        ),
        lambda xs: (f"return [x * {k} for x in {xs}]",),
        lambda v: [sum([x] * k) for x in v],
        "list[int]",
        [[], [1, 0, -2]],
    )


@_family("add_to_all")
def _add_to_all(r: random.Random) -> _Spec:
    k = r.randint(1, 25)
    return _list_family(
        r,
        ("add_to_all", "shift_all", f"plus_{k}", "increment_all"),
        lambda xs: (
            f"Return a new list with {k} added to every element of {xs}.",
            f"Increase each number in {xs} by {k} and return the new list.",
            f"Return [x + {k} for each x in {xs}].",
        ),
        lambda xs: (f"return [x + {k} for x in {xs}]",),
        lambda v: [x - (-k) for x in v],
        "list[int]",
        [[], [0, -1]],
    )


@_family("spread")
def _spread(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("spread", "value_range", "max_minus_min", "span"),
        lambda xs: (
            f"Return the difference between the largest and the smallest number in the non-empty list {xs}.",
            f"Return max({xs}) - min({xs}); {xs} is never empty.",
            f"Return how far apart the biggest and the smallest element of {xs} are.",
        ),
        lambda xs: (f"return max({xs}) - min({xs})",),
        lambda v: sorted(v)[-1] - sorted(v)[0],
        "int",
        [[4], [1, 9, 3], [-5, 5]],
        n_lo=2,
    )


@_family("index_of_max")
def _index_of_max(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("index_of_max", "argmax", "position_of_largest", "max_index"),
        lambda xs: (
            f"Return the index of the first occurrence of the largest element of the non-empty list {xs}.",
            f"Return the position of the maximum of {xs} (the first one if it repeats).",
            f"Return where the biggest number in {xs} first appears.",
        ),
        lambda xs: (f"return {xs}.index(max({xs}))",),
        lambda v: min(i for i, x in enumerate(v) if x == max(v)),
        "int",
        [[7], [1, 9, 3, 9], [5, 2]],
        n_lo=2,
    )


@_family("count_value")
def _count_value(r: random.Random) -> _Spec:
    xs = r.choice(LIST_ARGS)
    t = r.choice(["target", "value", "x0", "item", "needle"])
    lists = [_ints(r, lo=0, hi=6, n_lo=4, n_hi=10) for _ in range(3)]
    return _Spec(
        names=("count_value", "count_occurrences", "how_many_times", "frequency_of"),
        params=((xs, "list[int]"), (t, "int")),
        returns="int",
        docs=(
            f"Return how many times {t} occurs in {xs}.",
            f"Count the elements of {xs} equal to {t}.",
            f"Return the number of positions in {xs} holding {t}.",
        ),
        body=(f"return {xs}.count({t})",),
        ref=lambda v, w: len([x for x in v if x == w]),
        inputs=[([], 3), ([1, 2, 1], 1), ([1, 2, 1], 5)] + [(v, r.choice(v)) for v in lists],
    )


@_family("dedupe")
def _dedupe(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("dedupe", "unique", "remove_duplicates", "distinct"),
        lambda xs: (
            f"Return the elements of {xs} without repeats, keeping the first occurrence of each in order.",
            f"Remove duplicate values from {xs}, preserving the order of first appearance.",
            f"Return a list of the distinct numbers in {xs} in the order they first occur.",
        ),
        lambda xs: (
            "seen = []",
            f"for x in {xs}:",
            "    if x not in seen:",
            "        seen.append(x)",
            "return seen",
        ),
        lambda v: list(dict.fromkeys(v)),
        "list[int]",
        [[], [3, 1, 3, 2, 1], [4, 4, 4]],
        lo=0,
        hi=6,
    )


@_family("diffs")
def _diffs(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("diffs", "differences", "pairwise_diff", "steps_between"),
        lambda xs: (
            f"Return the differences between consecutive elements of {xs} (later minus earlier).",
            f"Return a list with {xs}[i + 1] - {xs}[i] for every adjacent pair.",
            f"Return how much each element of {xs} changes from the previous one.",
        ),
        lambda xs: (f"return [b - a for a, b in zip({xs}, {xs}[1:])]",),
        lambda v: [v[i + 1] - v[i] for i in range(len(v) - 1)],
        "list[int]",
        [[], [5], [1, 4, 2]],
    )


@_family("second_largest")
def _second_largest(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("second_largest", "runner_up", "second_max", "next_biggest"),
        lambda xs: (
            f"Return the second largest distinct value in {xs}, which has at least two distinct values.",
            f"Return the biggest number in {xs} that is smaller than its maximum.",
            f"Ignoring repeats, return the second highest value of {xs}.",
        ),
        lambda xs: (f"return sorted(set({xs}))[-2]",),
        lambda v: max(x for x in v if x != max(v)),
        "int",
        [[1, 2], [5, 5, 3], [9, 2, 9, 7]],
        n_lo=4,
    )


@_family("sum_squares")
def _sum_squares(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("sum_squares", "sum_of_squares", "square_total", "squared_sum"),
        lambda xs: (
            f"Return the sum of the squares of the numbers in {xs}.",
            f"Square every element of {xs} and return the total.",
            f"Return x*x summed over every x in {xs}.",
        ),
        lambda xs: (f"return sum(x * x for x in {xs})",),
        lambda v: sum(x**2 for x in v),
        "int",
        [[], [3], [1, -2]],
        lo=-9,
        hi=12,
    )


@_family("product")
def _product_family(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("product", "multiply_all_together", "list_product", "prod"),
        lambda xs: (
            f"Return the product of the numbers in {xs} (1 for an empty list).",
            f"Multiply all elements of {xs} together and return the result.",
            f"Return {xs}[0] * {xs}[1] * ... for every element, or 1 if there is none.",
        ),
        lambda xs: ("result = 1", f"for x in {xs}:", "    result *= x", "return result"),
        _product,
        "int",
        [[], [7], [2, 3, 4]],
        lo=-4,
        hi=9,
        n_hi=6,
    )


@_family("mean_floor")
def _mean_floor(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("mean_floor", "average", "floor_mean", "int_average"),
        lambda xs: (
            f"Return the average of the non-empty list {xs}, rounded down to an integer.",
            f"Return sum({xs}) divided by len({xs}) with floor division.",
            f"Return the whole-number mean of {xs} (floor of the exact mean).",
        ),
        lambda xs: (f"return sum({xs}) // len({xs})",),
        lambda v: int(sum(v) / len(v) // 1),
        "int",
        [[5], [1, 2], [3, 4, 8]],
        n_lo=2,
        lo=0,
    )


@_family("all_positive")
def _all_positive(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("all_positive", "only_positive", "is_all_positive", "no_nonpositive"),
        lambda xs: (
            f"Return True if every number in {xs} is greater than 0 (True for an empty list).",
            f"Return whether all elements of {xs} are positive.",
            f"Check that no value in {xs} is zero or negative.",
        ),
        lambda xs: (f"return all(x > 0 for x in {xs})",),
        lambda v: not [x for x in v if x <= 0],
        "bool",
        [[], [1, 2], [3, 0, 4], [5, -1]],
        n_random=2,
        lo=-3,
    )


@_family("any_negative")
def _any_negative(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("any_negative", "has_negative", "contains_negative", "some_negative"),
        lambda xs: (
            f"Return True if at least one number in {xs} is below 0.",
            f"Return whether any element of {xs} is negative.",
            f"Check if {xs} contains a value smaller than zero.",
        ),
        lambda xs: (f"return any(x < 0 for x in {xs})",),
        lambda v: bool([x for x in v if x < 0]),
        "bool",
        [[], [0, 2], [3, -1, 4]],
        n_random=2,
        lo=-3,
    )


def _pairwise(r: random.Random, op: str, names: tuple[str, ...], word: str, ref: Callable) -> _Spec:
    a, b = r.choice([("a", "b"), ("xs", "ys"), ("left", "right"), ("first", "second")])
    pairs = []
    for _ in range(3):
        n = r.randint(1, 6)
        pairs.append(([r.randint(-9, 20) for _ in range(n)], [r.randint(-9, 20) for _ in range(n)]))
    return _Spec(
        names=names,
        params=((a, "list[int]"), (b, "list[int]")),
        returns="list[int]",
        docs=(
            f"Return the element-wise {word} of the equally long lists {a} and {b}.",
            f"Return a list whose i-th element is the {word} of {a}[i] and {b}[i].",
            f"Combine {a} and {b} position by position, taking the {word} of each pair.",
        ),
        body=(f"return [x {op} y for x, y in zip({a}, {b})]",),
        ref=ref,
        inputs=[([], []), ([1, 2], [3, 4]), *pairs],
    )


@_family("pairwise_sum")
def _pairwise_sum(r: random.Random) -> _Spec:
    ref = lambda p, q: [p[i] + q[i] for i in range(len(p))]  # noqa: E731
    return _pairwise(r, "+", ("pairwise_sum", "add_lists", "elementwise_sum", "zip_add"), "sum", ref)


@_family("pairwise_product")
def _pairwise_product(r: random.Random) -> _Spec:
    ref = lambda p, q: [p[i] * q[i] for i in range(len(p))]  # noqa: E731
    names = ("pairwise_product", "multiply_lists", "elementwise_product", "zip_multiply")
    return _pairwise(r, "*", names, "product", ref)


@_family("rotate_left")
def _rotate_left(r: random.Random) -> _Spec:
    k = r.randint(1, 3)
    return _list_family(
        r,
        ("rotate_left", "rotate", f"shift_left_{k}", "move_front_to_back"),
        lambda xs: (
            f"Return {xs} rotated left by {k}: its first {k} elements move to the end.",
            f"Move the first {k} elements of {xs} to its end, keeping their order.",
            f"Rotate {xs} by {k} positions to the left and return the new list.",
        ),
        lambda xs: (f"return {xs}[{k}:] + {xs}[:{k}]",),
        lambda v: [v[(i + k) % len(v)] for i in range(len(v))],
        "list[int]",
        [list(range(1, k + 4))],
        n_random=3,
        n_lo=k + 1,
    )


@_family("every_other")
def _every_other(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("every_other", "even_positions", "take_alternate", "skip_every_second"),
        lambda xs: (
            f"Return the elements of {xs} at even indices (0, 2, 4, ...).",
            f"Return every second element of {xs}, starting with the first.",
            f"Return {xs}[0], {xs}[2], {xs}[4], ... as a list.",
        ),
        lambda xs: (f"return {xs}[::2]",),
        lambda v: [x for i, x in enumerate(v) if i % 2 == 0],
        "list[int]",
        [[], [7], [1, 2, 3, 4, 5]],
    )


@_family("last_or_default")
def _last_or_default(r: random.Random) -> _Spec:
    d = r.choice([0, -1, 99, None])
    returns = "int | None" if d is None else "int"
    return _list_family(
        r,
        ("last_or_default", "last_item", "final_element", "peek_last"),
        lambda xs: (
            f"Return the last element of {xs}, or {d} if {xs} is empty.",
            f"Return {xs}[-1] when {xs} has elements, otherwise {d}.",
            f"Return the final number of {xs}; an empty list gives {d}.",
        ),
        lambda xs: (f"return {xs}[-1] if {xs} else {d}",),
        lambda v: v[len(v) - 1] if len(v) else d,
        returns,
        [[], [4], [1, 2, 3]],
        n_random=2,
    )


@_family("sorted_desc")
def _sorted_desc(r: random.Random) -> _Spec:
    return _list_family(
        r,
        ("sorted_desc", "sort_descending", "largest_first", "reverse_sorted"),
        lambda xs: (
            f"Return the numbers of {xs} sorted from largest to smallest.",
            f"Return a copy of {xs} in descending order.",
            f"Sort {xs} so that the biggest value comes first and return the new list.",
        ),
        lambda xs: (f"return sorted({xs}, reverse=True)",),
        lambda v: sorted(v)[::-1],
        "list[int]",
        [[], [1, 3, 2]],
    )


# ---------------------------------------------------------------------------------------------
# Families: strings


def _str_family(
    r: random.Random,
    names: tuple[str, ...],
    docs: Callable[[str], tuple[str, ...]],
    body: Callable[[str], tuple[str, ...]],
    ref: Callable[[str], object],
    returns: str,
    edges: list[str],
    n_random: int = 3,
    args: tuple[str, ...] = STR_ARGS,
    lo: int = 2,
) -> _Spec:
    s = r.choice(args)
    return _Spec(
        names=names,
        params=((s, "str"),),
        returns=returns,
        docs=docs(s),
        body=body(s),
        ref=ref,
        inputs=[(e,) for e in edges] + [(_sentence(r, lo=lo),) for _ in range(n_random)],
    )


@_family("count_vowels")
def _count_vowels(r: random.Random) -> _Spec:
    return _str_family(
        r,
        ("count_vowels", "num_vowels", "vowel_count", "how_many_vowels"),
        lambda s: (
            f"Return the number of vowels (a, e, i, o, u, either case) in {s}.",
            f"Count the letters of {s} that are vowels, ignoring case.",
            f"Return how many characters of {s} are one of aeiouAEIOU.",
        ),
        lambda s: (f'return sum(1 for c in {s}.lower() if c in "aeiou")',),
        lambda v: len([c for c in v if c in "aeiouAEIOU"]),
        "int",
        ["", "sky", "Apple Pie"],
    )


@_family("count_consonants")
def _count_consonants(r: random.Random) -> _Spec:
    return _str_family(
        r,
        ("count_consonants", "num_consonants", "consonant_count", "how_many_consonants"),
        lambda s: (
            f"Return the number of letters in {s} that are not vowels (a, e, i, o, u), ignoring case.",
            f"Count the consonant letters of {s}; spaces and other symbols do not count.",
            f"Return how many alphabetic characters of {s} are not one of aeiouAEIOU.",
        ),
        lambda s: (f'return sum(1 for c in {s}.lower() if c.isalpha() and c not in "aeiou")',),
        lambda v: len([c for c in v if c.isalpha() and c not in "aeiouAEIOU"]),
        "int",
        ["", "aei", "Sky blue"],
    )


@_family("reverse_words")
def _reverse_words(r: random.Random) -> _Spec:
    return _str_family(
        r,
        ("reverse_words", "words_backwards", "flip_word_order", "reverse_sentence"),
        lambda s: (
            f"Return the words of {s} in reverse order, separated by single spaces.",
            f"Reverse the order of the space-separated words in {s}.",
            f"Return {s} with its last word first and its first word last.",
        ),
        lambda s: (f'return " ".join({s}.split()[::-1])',),
        lambda v: " ".join(reversed(v.split())),
        "str",
        ["", "one", "hello big world"],
    )


@_family("is_palindrome")
def _is_palindrome(r: random.Random) -> _Spec:
    spec = _str_family(
        r,
        ("is_palindrome", "palindrome", "reads_same_backwards", "check_palindrome"),
        lambda s: (
            f"Return True if {s} reads the same forwards and backwards.",
            f"Return whether {s} is a palindrome (exact characters, case-sensitive).",
            f"Check if reversing {s} gives the same string.",
        ),
        lambda s: (f"return {s} == {s}[::-1]",),
        lambda v: all(v[i] == v[len(v) - 1 - i] for i in range(len(v))),
        "bool",
        ["", "ab", "Noon", "abba", r.choice(PALINDROMES[:-2])],
        n_random=0,
        args=WORD_ARGS,
    )
    spec.inputs += [(r.choice(WORDS),), (r.choice(PALINDROMES),)]
    return spec


@_family("capitalize_words")
def _capitalize_words(r: random.Random) -> _Spec:
    return _str_family(
        r,
        ("capitalize_words", "title_case", "capitalize_each", "headline"),
        lambda s: (
            f"Return {s} with the first letter of every word in upper case and the rest in lower case.",
            f"Capitalize each space-separated word of {s} and join them with single spaces.",
            f"Return the words of {s}, each capitalized, separated by one space.",
        ),
        lambda s: (f'return " ".join(w.capitalize() for w in {s}.split())',),
        lambda v: " ".join(w[:1].upper() + w[1:].lower() for w in v.split()),
        "str",
        ["", "hELLO wORLD"],
    )


@_family("count_char")
def _count_char(r: random.Random) -> _Spec:
    s = r.choice(STR_ARGS)
    ch = r.choice(["ch", "c", "letter", "char"])
    texts = [_sentence(r) for _ in range(3)]
    return _Spec(
        names=("count_char", "count_letter", "char_count", "occurrences"),
        params=((s, "str"), (ch, "str")),
        returns="int",
        docs=(
            f"Return how many times the single character {ch} appears in {s}.",
            f"Count the occurrences of {ch} in {s}.",
            f"Return the number of positions of {s} that hold the character {ch}.",
        ),
        body=(f"return {s}.count({ch})",),
        ref=lambda v, c: len([x for x in v if x == c]),
        inputs=[("", "a"), ("banana", "a"), ("banana", "z")] + [(t, r.choice(t)) for t in texts],
    )


@_family("longest_word")
def _longest_word(r: random.Random) -> _Spec:
    return _str_family(
        r,
        ("longest_word", "longest", "biggest_word", "find_longest_word"),
        lambda s: (
            f"Return the longest word of {s} (the first one if several tie); {s} has at least one word.",
            f"Return the first word of maximal length among the space-separated words of {s}.",
            f"Split {s} on spaces and return the longest word, preferring the earliest on ties.",
        ),
        lambda s: (f"return max({s}.split(), key=len)",),
        lambda v: sorted(v.split(), key=lambda w: -len(w))[0],
        "str",
        ["sun", "ab abc abd", "tree oak sky"],
    )


@_family("shortest_word")
def _shortest_word(r: random.Random) -> _Spec:
    return _str_family(
        r,
        ("shortest_word", "shortest", "smallest_word", "find_shortest_word"),
        lambda s: (
            f"Return the shortest word of {s} (the first one if several tie); {s} has at least one word.",
            f"Return the first word of minimal length among the space-separated words of {s}.",
            f"Split {s} on spaces and return the shortest word, preferring the earliest on ties.",
        ),
        lambda s: (f"return min({s}.split(), key=len)",),
        lambda v: sorted(v.split(), key=len)[0],
        "str",
        ["sun", "abc ab ad", "tree oak sky"],
    )


@_family("initials")
def _initials(r: random.Random) -> _Spec:
    return _str_family(
        r,
        ("initials", "acronym", "first_letters", "abbreviate"),
        lambda s: (
            f"Return the upper-cased first letter of every word of {s}, joined together.",
            f"Return the acronym of {s}: the first character of each word, in capitals.",
            f"Build a string from the first letter of each space-separated word of {s}, upper case.",
        ),
        lambda s: (f'return "".join(w[0].upper() for w in {s}.split())',),
        lambda v: "".join(w[:1] for w in v.split()).upper(),
        "str",
        ["", "portable network graphics"],
    )


@_family("repeat_word")
def _repeat_word(r: random.Random) -> _Spec:
    k = r.randint(2, 5)
    sep = r.choice([" ", "-", ", ", ""])
    where = {" ": "single spaces", "-": "dashes", ", ": "a comma and a space", "": "nothing"}[sep]
    return _str_family(
        r,
        ("repeat_word", f"repeat_{k}_times", "echo", "say_again"),
        lambda s: (
            f"Return {s} repeated {k} times, separated by {where}.",
            f"Return a string with {k} copies of {s} joined by {sep!r}.",
            f"Join {k} copies of {s} with {where} between them.",
        ),
        lambda s: (f"return {sep!r}.join([{s}] * {k})",),
        lambda v: sep.join(v for _ in range(k)),
        "str",
        ["", "ha"],
        n_random=2,
        args=WORD_ARGS,
        lo=1,
    )


@_family("replace_spaces")
def _replace_spaces(r: random.Random) -> _Spec:
    sep = r.choice(["-", "_", "+", "."])
    return _str_family(
        r,
        ("replace_spaces", "slugify", "join_with", "fill_spaces"),
        lambda s: (
            f"Return {s} with every space replaced by {sep!r}.",
            f"Replace each ' ' in {s} with {sep!r} and return the result.",
            f"Return a copy of {s} where spaces become {sep!r}.",
        ),
        lambda s: (f'return {s}.replace(" ", {sep!r})',),
        lambda v: "".join(sep if c == " " else c for c in v),
        "str",
        ["", "a b  c"],
    )


@_family("word_count")
def _word_count(r: random.Random) -> _Spec:
    return _str_family(
        r,
        ("word_count", "count_words", "num_words", "how_many_words"),
        lambda s: (
            f"Return the number of space-separated words in {s}.",
            f"Count the words of {s}; runs of spaces separate words.",
            f"Return how many words {s} contains.",
        ),
        lambda s: (f"return len({s}.split())",),
        lambda v: len([w for w in v.split(" ") if w]),
        "int",
        ["", "one", " two  words "],
        lo=1,
    )


@_family("last_word")
def _last_word(r: random.Random) -> _Spec:
    return _str_family(
        r,
        ("last_word", "final_word", "get_last_word", "end_word"),
        lambda s: (
            f"Return the last space-separated word of {s}, which has at least one word.",
            f"Return the final word of {s}.",
            f"Split {s} into words and return the one at the end.",
        ),
        lambda s: (f"return {s}.split()[-1]",),
        lambda v: v.split()[len(v.split()) - 1],
        "str",
        ["one", "hello world "],
    )


@_family("first_word")
def _first_word(r: random.Random) -> _Spec:
    return _str_family(
        r,
        ("first_word", "leading_word", "get_first_word", "start_word"),
        lambda s: (
            f"Return the first space-separated word of {s}, which has at least one word.",
            f"Return the opening word of {s}.",
            f"Split {s} into words and return the one at the start.",
        ),
        lambda s: (f"return {s}.split()[0]",),
        lambda v: v.strip().split(" ")[0],
        "str",
        ["one", " hello world"],
    )


@_family("word_lengths")
def _word_lengths(r: random.Random) -> _Spec:
    return _str_family(
        r,
        ("word_lengths", "lengths_of_words", "measure_words", "word_sizes"),
        lambda s: (
            f"Return the length of each space-separated word of {s}, in order.",
            f"Return a list with the number of characters of every word in {s}.",
            f"Split {s} into words and return their lengths.",
        ),
        lambda s: (f"return [len(w) for w in {s}.split()]",),
        lambda v: list(map(len, v.split())),
        "list[int]",
        ["", "a bb ccc"],
    )


@_family("char_frequency")
def _char_frequency(r: random.Random) -> _Spec:
    return _str_family(
        r,
        ("char_frequency", "letter_counts", "count_chars", "histogram"),
        lambda s: (
            f"Return a dict mapping each character of {s} to the number of times it occurs.",
            f"Count how often every character appears in {s} and return the counts as a dict.",
            f"Return a dictionary of character frequencies for {s}.",
        ),
        lambda s: (
            "counts = {}",
            f"for c in {s}:",
            "    counts[c] = counts.get(c, 0) + 1",
            "return counts",
        ),
        lambda v: {c: v.count(c) for c in v},
        "dict[str, int]",
        ["", "aab"],
        args=WORD_ARGS,
        lo=1,
    )


@_family("word_counts")
def _word_counts(r: random.Random) -> _Spec:
    spec = _str_family(
        r,
        ("word_counts", "count_each_word", "word_frequency", "tally_words"),
        lambda s: (
            f"Return a dict mapping each space-separated word of {s} to how many times it occurs.",
            f"Count how often every word appears in {s} and return the counts as a dict.",
            f"Return a dictionary of word frequencies for {s}.",
        ),
        lambda s: (
            "counts = {}",
            f"for w in {s}.split():",
            "    counts[w] = counts.get(w, 0) + 1",
            "return counts",
        ),
        lambda v: {w: v.split().count(w) for w in v.split()},
        "dict[str, int]",
        ["", "a b a"],
        n_random=0,
    )
    spec.inputs += [(" ".join(r.choice(WORDS[:8]) for _ in range(r.randint(3, 8))),) for _ in range(3)]
    return spec


# ---------------------------------------------------------------------------------------------
# Families: dicts


def _dict_family(
    r: random.Random,
    names: tuple[str, ...],
    docs: Callable[[str], tuple[str, ...]],
    body: Callable[[str], tuple[str, ...]],
    ref: Callable[[dict], object],
    returns: str,
    edges: list[dict],
    n_random: int = 3,
    **kw: int,
) -> _Spec:
    d = r.choice(DICT_ARGS)
    return _Spec(
        names=names,
        params=((d, "dict[str, int]"),),
        returns=returns,
        docs=docs(d),
        body=body(d),
        ref=ref,
        inputs=[(e,) for e in edges] + [(_dict(r, **kw),) for _ in range(n_random)],
    )


@_family("invert_dict")
def _invert_dict(r: random.Random) -> _Spec:
    spec = _dict_family(
        r,
        ("invert_dict", "invert", "swap_keys_values", "reverse_mapping"),
        lambda d: (
            f"Return a new dict that maps each value of {d} to its key (the values are distinct).",
            f"Swap the keys and values of {d} and return the result.",
            f"Return the inverse of the one-to-one mapping {d}.",
        ),
        lambda d: (f"return {{v: k for k, v in {d}.items()}}",),
        lambda v: dict(zip(v.values(), v.keys(), strict=True)),
        "dict[int, str]",
        [{}, {"a": 1}],
        n_random=0,
    )
    for _ in range(3):
        keys = r.sample(KEYS, r.randint(2, 5))
        spec.inputs.append((dict(zip(keys, r.sample(range(50), len(keys)), strict=True)),))
    return spec


@_family("sum_values")
def _sum_values(r: random.Random) -> _Spec:
    return _dict_family(
        r,
        ("sum_values", "total", "total_count", "add_up_values"),
        lambda d: (
            f"Return the sum of all values in {d}.",
            f"Add up the numbers stored in {d} and return the total.",
            f"Return the total of {d}'s values (0 for an empty dict).",
        ),
        lambda d: (f"return sum({d}.values())",),
        lambda v: sum(v[k] for k in v),
        "int",
        [{}, {"a": 3}],
    )


@_family("key_of_max")
def _key_of_max(r: random.Random) -> _Spec:
    spec = _dict_family(
        r,
        ("key_of_max", "best_key", "argmax_key", "top_item"),
        lambda d: (
            f"Return the key of {d} whose value is largest (the values are distinct, {d} is not empty).",
            f"Return the key that maps to the maximum value in {d}.",
            f"Find the entry of {d} with the biggest value and return its key.",
        ),
        lambda d: (f"return max({d}, key={d}.get)",),
        lambda v: sorted(v.items(), key=lambda kv: kv[1])[-1][0],
        "str",
        [{"a": 3}, {"x": 1, "y": 7, "z": 2}],
        n_random=0,
    )
    for _ in range(3):
        keys = r.sample(KEYS, r.randint(2, 5))
        spec.inputs.append((dict(zip(keys, r.sample(range(50), len(keys)), strict=True)),))
    return spec


@_family("filter_dict")
def _filter_dict(r: random.Random) -> _Spec:
    k = r.randint(5, 30)
    return _dict_family(
        r,
        ("filter_dict", "keep_large", "entries_above", "prune_small"),
        lambda d: (
            f"Return a new dict with only the entries of {d} whose value is greater than {k}.",
            f"Drop every entry of {d} with a value of {k} or less and return the rest.",
            f"Return the items of {d} with values above {k}, as a dict.",
        ),
        lambda d: (f"return {{key: v for key, v in {d}.items() if v > {k}}}",),
        lambda v: {key: v[key] for key in v if not v[key] <= k},
        "dict[str, int]",
        [{}, {"a": k, "b": k + 1, "c": k - 1}],
    )


@_family("keys_above")
def _keys_above(r: random.Random) -> _Spec:
    k = r.randint(5, 30)
    return _dict_family(
        r,
        ("keys_above", "keys_with_large_values", "names_above", "select_keys"),
        lambda d: (
            f"Return a list of the keys of {d} whose value is greater than {k}, in insertion order.",
            f"Return the keys of {d} that map to a number above {k}.",
            f"List, in order, every key of {d} with a value larger than {k}.",
        ),
        lambda d: (f"return [key for key, v in {d}.items() if v > {k}]",),
        lambda v: [key for key in v if not v[key] <= k],
        "list[str]",
        [{}, {"a": k, "b": k + 1, "c": k - 1}],
    )


@_family("lookup_default")
def _lookup_default(r: random.Random) -> _Spec:
    d = r.choice(DICT_ARGS)
    key = r.choice(["key", "name", "k", "item"])
    default = r.choice([0, -1, 1, 100])
    tables = [_dict(r) for _ in range(2)]
    return _Spec(
        names=("lookup_default", "get_or_default", "safe_get", "lookup"),
        params=((d, "dict[str, int]"), (key, "str")),
        returns="int",
        docs=(
            f"Return {d}[{key}] if {key} is in {d}, otherwise {default}.",
            f"Look up {key} in {d}; return {default} when it is missing.",
            f"Return the value stored under {key} in {d}, or {default} if there is none.",
        ),
        body=(f"return {d}.get({key}, {default})",),
        ref=lambda t, k: t.get(k, default),
        inputs=[({}, "a"), ({"a": 5}, "a"), ({"a": 5}, "b")]
        + [(t, r.choice(list(t))) for t in tables]
        + [(tables[0], "zzz")],
    )


@_family("sorted_keys")
def _sorted_keys(r: random.Random) -> _Spec:
    return _dict_family(
        r,
        ("sorted_keys", "keys_in_order", "alphabetical_keys", "list_keys"),
        lambda d: (
            f"Return the keys of {d} as a list sorted alphabetically.",
            f"Return a sorted list of {d}'s keys.",
            f"List the keys of {d} in ascending order.",
        ),
        lambda d: (f"return sorted({d})",),
        lambda v: sorted(v.keys()),
        "list[str]",
        [{}, {"b": 1, "a": 2}],
    )


# ---------------------------------------------------------------------------------------------
# Splits

FAMILIES: tuple[str, ...] = tuple(sorted(_FAMILIES))
# Never generated for training. Each has close relatives among the training families.
HELDOUT_FAMILIES: tuple[str, ...] = (
    "any_negative",
    "char_frequency",
    "count_below",
    "count_consonants",
    "keys_above",
    "last_word",
    "max_digit",
    "min_of_three",
    "pairwise_product",
    "running_min",
    "shortest_word",
    "sum_odds",
)
TRAIN_FAMILIES: tuple[str, ...] = tuple(f for f in FAMILIES if f not in HELDOUT_FAMILIES)


def is_heldout_spec(spec: str) -> bool:
    """Whether a task's spec (signature + docstring sentence) belongs to the held-out-seed split."""
    digest = hashlib.sha1(spec.encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_SPEC_BUCKETS == 0


def _signature(name: str, params: tuple[tuple[str, str], ...], returns: str, annotated: bool) -> str:
    if annotated:
        args = ", ".join(f"{p}: {t}" for p, t in params)
        return f"def {name}({args}) -> {returns}:"
    return f"def {name}({', '.join(p for p, _ in params)}):"


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def generate_task(seed: int, families: Sequence[str] = TRAIN_FAMILIES) -> CodeTask:
    """The task for ``seed`` drawn from ``families``: deterministic."""
    unknown = set(families) - set(FAMILIES)
    if unknown or not families:
        raise RelaxSpecError(f"unknown code task families: {sorted(unknown)}" if unknown else "no families")
    rng = random.Random(seed)
    family = rng.choice(list(families))
    return _build_task(seed, family, rng, _FAMILIES[family])


def _build_task(
    seed: int, family: str, rng: random.Random, make_spec: Callable[[random.Random], _Spec]
) -> CodeTask:
    """Draw a spec with ``make_spec`` (again while it breaks a constraint) and render the task."""
    for _ in range(100):
        try:
            spec = make_spec(rng)
            expected = [spec.ref(*copy.deepcopy(args)) for args in spec.inputs]
        except _Retry:
            continue
        if len({repr(e) for e in expected}) < 2:  # a constant body must not pass
            continue
        name = rng.choice(spec.names)
        doc = rng.choice(spec.docs)
        signature = _signature(name, spec.params, spec.returns, annotated=rng.random() < 0.75)
        n_examples = rng.choice([0, 1, 1, 2])
        shown = [(args, out) for args, out in zip(spec.inputs, expected, strict=True) if args[0]]
        examples = shown[-n_examples:]
        if n_examples == 0 or not examples:
            docstring = f'    """{doc}"""'
        else:
            lines = [f'    """{doc}', ""]
            for args, out in examples:
                lines += [f"    >>> {_call(name, args)}", f"    {out!r}"]
            docstring = "\n".join([*lines, '    """'])
        test = "\n".join(
            ["def check(candidate):"]
            + [
                f"    assert {_call('candidate', args)} == {out!r}"
                for args, out in zip(spec.inputs, expected, strict=True)
            ]
        )
        return CodeTask(
            seed=seed,
            family=family,
            entry_point=name,
            prompt=f"{signature}\n{docstring}",
            solution="".join(f"\n    {line}" for line in spec.body),
            test=test + "\n",
            spec=f"{signature}\n{doc}",
        )
    raise RuntimeError(f"could not generate a code task for seed {seed}")  # pragma: no cover


def train_tasks(n: int, start: int = 0) -> list[CodeTask]:
    """``n`` training tasks: training families, seeds from ``start`` up, held-out specs skipped."""
    out, seed = [], start
    while len(out) < n:
        if seed >= EVAL_SEED_START:
            raise ValueError("training seeds would overlap the evaluation range")
        task = generate_task(seed, TRAIN_FAMILIES)
        if not is_heldout_spec(task.spec):
            out.append(task)
        seed += 1
    return out


def eval_tasks(n: int) -> list[CodeTask]:
    """Held-out seeds: training families, evaluation seeds, only specs of the held-out bucket."""
    out, seed = [], EVAL_SEED_START
    while len(out) < n:
        task = generate_task(seed, TRAIN_FAMILIES)
        if is_heldout_spec(task.spec):
            out.append(task)
        seed += 1
    return out


def heldout_family_tasks(n: int) -> list[CodeTask]:
    """Held-out families: :data:`HELDOUT_FAMILIES` on the evaluation seeds."""
    return [generate_task(EVAL_SEED_START + i, HELDOUT_FAMILIES) for i in range(n)]


# =============================================================================================
# Compositional pipelines (generator version 2)
#
# A pipeline task is one combination of three pieces: a *filter* (which elements to keep), a
# *map* (what to do with each kept element) and an *aggregator* (what to return), over a list of
# integers or over the words of a string. Its docstring sentence is composed from the pieces'
# phrases ("Return the sum of the squares of the even numbers in nums."), its canonical body from
# the pieces' code, and its expected outputs from the pieces' reference functions (written apart
# from the code strings). The held-out split is a set of *combinations*: every filter, map and
# aggregator, and every pair of them that a held-out combination uses, also appears in training
# combinations, so a held-out combination measures composition of seen pieces.

PIPELINE_HELDOUT_BUCKETS = 8  # about one combination in eight is a held-out candidate


@dataclass(frozen=True)
class _Piece:
    """One filter, map or aggregator: phrases, code and a reference function.

    ``phrases`` are templates: a filter's take ``{xs}`` (the argument) and give a plural noun
    phrase; a map's take ``{F}`` (that noun phrase); an aggregator's take ``{M}`` (the mapped
    phrase) and ``{F}`` and give the docstring sentence. ``{c}`` is the piece's drawn constant.
    ``code`` is the filter's condition or the map's expression over the loop variable (empty for
    "none"); ``fn(value, c)`` is the reference (a predicate, a map, or an aggregator of a list).
    """

    key: str
    word: str  # the piece's fragment of the function name ("" for none)
    phrases: tuple[str, ...]
    code: str
    fn: Callable[..., object]
    const: tuple[int, int] | tuple[str, ...] | None = None  # range of c, or choices of c


def _draw_const(r: random.Random, piece: _Piece) -> object:
    if piece.const is None:
        return None
    if isinstance(piece.const[0], int):
        return r.randint(*piece.const)
    return r.choice(piece.const)


# --- pieces over lists of integers (loop variable x) -------------------------------------------

LIST_FILTERS: tuple[_Piece, ...] = (
    _Piece("all", "", ("the numbers in {xs}", "the elements of {xs}"), "", lambda x, c: True),
    _Piece(
        "even",
        "evens",
        ("the even numbers in {xs}", "the elements of {xs} that are even"),
        "x % 2 == 0",
        lambda x, c: not x & 1,
    ),
    _Piece(
        "odd",
        "odds",
        ("the odd numbers in {xs}", "the elements of {xs} that are odd"),
        "x % 2 == 1",
        lambda x, c: bool(x & 1),
    ),
    _Piece(
        "positive",
        "positives",
        ("the positive numbers in {xs}", "the elements of {xs} that are greater than zero"),
        "x > 0",
        lambda x, c: not x <= 0,
    ),
    _Piece(
        "negative",
        "negatives",
        ("the negative numbers in {xs}", "the elements of {xs} that are below zero"),
        "x < 0",
        lambda x, c: not x >= 0,
    ),
    _Piece(
        "above",
        "above",
        ("the numbers in {xs} greater than {c}", "the elements of {xs} that are above {c}"),
        "x > {c}",
        lambda x, c: not x <= c,
        (1, 20),
    ),
    _Piece(
        "below",
        "below",
        ("the numbers in {xs} less than {c}", "the elements of {xs} that are below {c}"),
        "x < {c}",
        lambda x, c: not x >= c,
        (1, 20),
    ),
    _Piece(
        "multiple",
        "multiples",
        ("the multiples of {c} in {xs}", "the elements of {xs} that are divisible by {c}"),
        "x % {c} == 0",
        lambda x, c: x - (x // c) * c == 0,
        (3, 7),
    ),
)

LIST_MAPS: tuple[_Piece, ...] = (
    _Piece("same", "", ("{F}",), "x", lambda x, c: x),
    _Piece("double", "doubled", ("{F}, each doubled", "the doubles of {F}"), "x * 2", lambda x, c: x + x),
    _Piece("square", "squared", ("{F}, each squared", "the squares of {F}"), "x * x", lambda x, c: x**2),
    _Piece("negate", "negated", ("{F}, each negated", "the negatives of {F}"), "-x", lambda x, c: 0 - x),
    _Piece(
        "add",
        "plus",
        ("{F}, each increased by {c}", "{F} with {c} added to each"),
        "x + {c}",
        lambda x, c: x - (-c),
        (1, 9),
    ),
    _Piece(
        "subtract",
        "minus",
        ("{F}, each decreased by {c}", "{F} with {c} subtracted from each"),
        "x - {c}",
        lambda x, c: x + (-c),
        (1, 9),
    ),
    _Piece(
        "abs",
        "abs",
        ("{F}, each replaced by its absolute value", "the absolute values of {F}"),
        "abs(x)",
        lambda x, c: x if x >= 0 else -x,
    ),
    _Piece(
        "mod",
        "mod",
        ("{F}, each taken modulo {c}", "the remainders of {F} divided by {c}"),
        "x % {c}",
        lambda x, c: x - (x // c) * c,
        (3, 9),
    ),
)


def _first(values: list) -> object:
    return values[0] if len(values) > 0 else None


def _last(values: list) -> object:
    return values[len(values) - 1] if len(values) > 0 else None


# Counting what passes the filter reads the same over numbers and words: one piece for both.
_COUNT = _Piece(
    "count",
    "count",
    ("Return how many of {F} there are.", "Count {F} and return the count."),
    "int",
    lambda v, c: len(v),
)
LIST_AGGS: tuple[_Piece, ...] = (
    _Piece(
        "sum",
        "sum",
        ("Return the sum of {M}.", "Add up {M} and return the total."),
        "int",
        lambda v, c: _total(v),
    ),
    _COUNT,
    _Piece(
        "max",
        "max",
        (
            "Return the largest of {M}, or 0 if there are none.",
            "Return the maximum of {M} (0 when there are none).",
        ),
        "int",
        lambda v, c: sorted(v)[-1] if v else 0,
    ),
    _Piece(
        "min",
        "min",
        (
            "Return the smallest of {M}, or 0 if there are none.",
            "Return the minimum of {M} (0 when there are none).",
        ),
        "int",
        lambda v, c: sorted(v)[0] if v else 0,
    ),
    _Piece(
        "list",
        "list",
        ("Return a list of {M}, in their original order.", "Return {M} as a new list, keeping their order."),
        "list[int]",
        lambda v, c: list(v),
    ),
    _Piece(
        "first",
        "first",
        (
            "Return the first of {M}, or None if there are none.",
            "Return the earliest of {M} (None when there are none).",
        ),
        "int | None",
        lambda v, c: _first(v),
    ),
    _Piece(
        "last",
        "last",
        (
            "Return the last of {M}, or None if there are none.",
            "Return the final one of {M} (None when there are none).",
        ),
        "int | None",
        lambda v, c: _last(v),
    ),
    _Piece(
        "product",
        "product",
        (
            "Return the product of {M} (1 if there are none).",
            "Multiply {M} together and return the result (1 when there are none).",
        ),
        "int",
        lambda v, c: _product(v),
    ),
)


def _total(values: list[int]) -> int:
    out = 0
    for v in values:
        out += v
    return out


# --- pieces over the words of a string (loop variable w) ---------------------------------------

STR_FILTERS: tuple[_Piece, ...] = (
    _Piece("all", "", ("the words of {xs}", "the words in {xs}"), "", lambda w, c: True),
    _Piece(
        "long",
        "long",
        ("the words of {xs} longer than {c} letters", "the words in {xs} with more than {c} letters"),
        "len(w) > {c}",
        lambda w, c: not len(w) <= c,
        (2, 4),  # WORDS has words of 2 to 5 letters: every boundary is testable
    ),
    _Piece(
        "short",
        "short",
        ("the words of {xs} shorter than {c} letters", "the words in {xs} with fewer than {c} letters"),
        "len(w) < {c}",
        lambda w, c: not len(w) >= c,
        (3, 5),
    ),
    _Piece(
        "vowel",
        "vowel",
        ("the words of {xs} that start with a vowel", "the words in {xs} beginning with a vowel"),
        'w[0] in "aeiou"',
        lambda w, c: w[:1] in ("a", "e", "i", "o", "u"),
    ),
    _Piece(
        "letter",
        "with",
        ('the words of {xs} that contain the letter "{c}"', 'the words in {xs} containing "{c}"'),
        '"{c}" in w',
        lambda w, c: w.find(c) >= 0,
        ("a", "e", "i", "o", "r", "s", "t", "n"),
    ),
)

STR_MAPS: tuple[_Piece, ...] = (
    _Piece("same", "", ("{F}",), "w", lambda w, c: w),
    _Piece(
        "upper",
        "upper",
        ("{F}, in upper case", "{F}, each upper-cased"),
        "w.upper()",
        lambda w, c: w.swapcase(),
    ),
    _Piece(
        "reverse",
        "reversed",
        ("{F}, each reversed", "{F}, each spelled backwards"),
        "w[::-1]",
        lambda w, c: "".join(reversed(w)),
    ),
    _Piece(
        "initial",
        "initials",
        ("the first letters of {F}", "{F}, each cut to its first letter"),
        "w[0]",
        lambda w, c: w[:1],
    ),
    _Piece(
        "final",
        "finals",
        ("the last letters of {F}", "{F}, each cut to its last letter"),
        "w[-1]",
        lambda w, c: w[len(w) - 1 :],
    ),
    _Piece(
        "capitalize",
        "capitalized",
        ("{F}, each capitalized", "{F}, each with its first letter in upper case"),
        "w.capitalize()",
        lambda w, c: w[:1].upper() + w[1:],
    ),
)

STR_AGGS: tuple[_Piece, ...] = (
    _Piece(
        "list",
        "list",
        ("Return a list of {M}, in order.", "Return {M} as a list, keeping their order."),
        "list[str]",
        lambda v, c: list(v),
    ),
    _COUNT,
    _Piece(
        "join",
        "join",
        ("Return {M}, joined with single spaces.", "Return one string of {M}, separated by spaces."),
        "str",
        lambda v, c: _joined(v, " "),
    ),
    _Piece(
        "sep",
        "join",
        ('Return {M}, joined with "{c}".', 'Return one string of {M}, separated by "{c}".'),
        "str",
        lambda v, c: _joined(v, c),
        ("-", ",", "_", "/", "+"),
    ),
    _Piece(
        "concat",
        "concat",
        ("Return {M} glued together into one string.", "Return the concatenation of {M}, with no separator."),
        "str",
        lambda v, c: _joined(v, ""),
    ),
    _Piece(
        "first",
        "first",
        (
            'Return the first of {M}, or "" if there are none.',
            'Return the earliest of {M} ("" when there are none).',
        ),
        "str",
        lambda v, c: v[0] if v else "",
    ),
    _Piece(
        "last",
        "last",
        (
            'Return the last of {M}, or "" if there are none.',
            'Return the final one of {M} ("" when there are none).',
        ),
        "str",
        lambda v, c: v[-1] if v else "",
    ),
)


def _joined(values: list[str], sep: str) -> str:
    out = ""
    for i, v in enumerate(values):
        out += (sep if i else "") + v
    return out


_PIECES = {
    "list": (LIST_FILTERS, LIST_MAPS, LIST_AGGS),
    "str": (STR_FILTERS, STR_MAPS, STR_AGGS),
}


def _combo_name(kind: str, f: str, m: str, a: str) -> str:
    return f"pipe.{kind}.{f}.{m}.{a}"


def _all_combos() -> tuple[str, ...]:
    """Every valid combination (a count ignores the map, so it goes with "same" only)."""
    out = []
    for kind, (filters, maps, aggs) in _PIECES.items():
        for f in filters:
            for m in maps:
                for a in aggs:
                    if a.key == "count" and m.key != "same":
                        continue
                    out.append(_combo_name(kind, f.key, m.key, a.key))
    return tuple(out)


def _parts(combo: str) -> tuple[str, str, str, str]:
    _, kind, f, m, a = combo.split(".")
    return kind, f, m, a


def _pairs(combo: str) -> set[tuple[str, ...]]:
    kind, f, m, a = _parts(combo)
    return {(kind, "f", f, "m", m), (kind, "f", f, "a", a), (kind, "m", m, "a", a)}


def _choose_heldout(combos: tuple[str, ...]) -> tuple[str, ...]:
    """Held-out combinations: candidates by hash bucket, taken in hash order only while every
    pair of pieces they use (filter-map, filter-aggregator, map-aggregator) stays in training.

    A candidate must also do something beyond a single piece (a real filter or a real map).
    """

    def h(c: str) -> int:
        return int.from_bytes(hashlib.sha1(c.encode()).digest()[:4], "big")

    train_pairs: Counter[tuple[str, ...]] = Counter(p for c in combos for p in _pairs(c))
    held: list[str] = []
    for combo in sorted(combos, key=h):
        _, f, m, _ = _parts(combo)
        if h(combo) % PIPELINE_HELDOUT_BUCKETS or (f == "all" and m == "same"):
            continue
        if all(train_pairs[p] > 1 for p in _pairs(combo)):
            held.append(combo)
            train_pairs.subtract(_pairs(combo))
    return tuple(sorted(held))


PIPELINE_COMBOS: tuple[str, ...] = _all_combos()
HELDOUT_COMBOS: tuple[str, ...] = _choose_heldout(PIPELINE_COMBOS)
TRAIN_COMBOS: tuple[str, ...] = tuple(c for c in PIPELINE_COMBOS if c not in set(HELDOUT_COMBOS))


def _piece(pieces: tuple[_Piece, ...], key: str) -> _Piece:
    return next(p for p in pieces if p.key == key)


def _pipeline_spec(r: random.Random, combo: str) -> _Spec:
    """The spec of one pipeline combination: constants, argument name, docs, body and inputs."""
    kind, fk, mk, ak = _parts(combo)
    filters, maps, aggs = _PIECES[kind]
    f, m, a = _piece(filters, fk), _piece(maps, mk), _piece(aggs, ak)
    fc, mc, ac = _draw_const(r, f), _draw_const(r, m), _draw_const(r, a)
    var = "x" if kind == "list" else "w"
    xs = r.choice(LIST_ARGS if kind == "list" else STR_ARGS)
    source = xs if kind == "list" else f"{xs}.split()"
    cond = f.code.format(c=fc)
    expr = m.code.format(c=mc)
    docs = tuple(
        ap.format(M=mp.format(F=fp.format(xs=xs, c=fc), c=mc), F=fp.format(xs=xs, c=fc), c=ac)
        for ap in a.phrases
        for mp in m.phrases
        for fp in f.phrases
    )
    body = _pipeline_body(kind, a.key, ac, var, source, cond, expr, identity=not cond and expr == var)

    def ref(value: object) -> object:
        items = value if kind == "list" else str(value).split()
        kept = [it for it in items if f.fn(it, fc)]
        return a.fn([m.fn(it, mc) for it in kept], ac)

    word = "_".join(p for p in (a.word, f.word + (f"_{fc}" if fk == "letter" else ""), m.word) if p)
    # "_words" / "_values" keep a bare aggregator name from shadowing a builtin (sum, max, list)
    word += "_words" if kind == "str" else "" if "_" in word else "_values"
    names = (word, word, word, r.choice(("solve", "compute", "process", "transform")))
    return _Spec(
        names=names,
        params=((xs, "list[int]" if kind == "list" else "str"),),
        returns=a.code,
        docs=docs,
        body=body,
        ref=ref,
        inputs=_pipeline_inputs(r, kind, fk, fc, ak),
    )


def _pipeline_body(
    kind: str, agg: str, const: object, var: str, source: str, cond: str, expr: str, identity: bool
) -> tuple[str, ...]:
    """The canonical body: a comprehension or generator for most aggregators, a loop for a product."""
    gen = f"{expr} for {var} in {source}" + (f" if {cond}" if cond else "")
    empty = "None" if kind == "list" else '""'
    if agg == "count":
        return (f"return len({source})",) if identity else (f"return sum(1 for {var} in {source} if {cond})",)
    if agg == "sum":
        return (f"return sum({source})",) if identity else (f"return sum({gen})",)
    if agg in ("max", "min"):
        return (f"return {agg}({source}, default=0)",) if identity else (f"return {agg}(({gen}), default=0)",)
    if agg == "list":
        return (
            (f"return list({source})",)
            if identity and kind == "list"
            else ((f"return {source}",) if identity else (f"return [{gen}]",))
        )
    if agg == "first":
        return (f"return next(({gen}), {empty})",)
    if agg == "last":
        return (f"values = [{gen}]", f"return values[-1] if values else {empty}")
    if agg == "product":
        lines = ["result = 1", f"for {var} in {source}:"]
        lines += [f"    if {cond}:", f"        result *= {expr}"] if cond else [f"    result *= {expr}"]
        return (*lines, "return result")
    sep = {"join": " ", "concat": ""}.get(agg, const)
    return (f'return "{sep}".join({gen})',)


def _pipeline_inputs(r: random.Random, kind: str, fk: str, fc: object, agg: str) -> list[tuple]:
    """Edge cases that pin the filter's boundary and the empty case, then random inputs."""
    if kind == "list":
        small = {"lo": -9, "hi": 12, "n_hi": 5} if agg == "product" else {}
        inputs: list[tuple] = [([],)]
        if fk in ("above", "below"):
            inputs += [([fc],), ([fc + 1, fc - 1],), ([fc - 2, fc, fc + 3],)]
        elif fk == "multiple":
            inputs += [([fc],), ([fc + 1, fc * 2, 1],)]
        else:  # sign and parity boundaries: 0, 1 and -1 each first, last and alone
            inputs += [([r.choice([-3, -1, 1, 2, 4, 5, 7])],), ([-4, -1, 0, 1, 3, 6],), ([0, 1],), ([-1, 0],)]
        return inputs + [(_ints(r, **small),) for _ in range(3)]
    inputs = [("",)]
    if fk in ("long", "short"):
        c = int(fc)  # words of the boundary lengths c - 1, c and c + 1
        inputs += [(" ".join([w for w in WORDS if len(w) == n][:2]),) for n in (c - 1, c, c + 1)]
    elif fk == "letter":
        inputs += [(" ".join(w for w in WORDS[:12] if str(fc) in w) or str(fc),)]
    else:
        inputs += [("owl egg tree ice",)]
    return inputs + [(_sentence(r),) for _ in range(3)]


def generate_pipeline_task(seed: int, combos: Sequence[str] = TRAIN_COMBOS) -> CodeTask:
    """The pipeline task for ``seed`` drawn from ``combos``: deterministic."""
    unknown = set(combos) - set(PIPELINE_COMBOS)
    if unknown or not combos:
        raise RelaxSpecError(
            f"unknown pipeline combinations: {sorted(unknown)[:3]}" if unknown else "no combinations"
        )
    rng = random.Random(seed)
    combo = rng.choice(list(combos))
    return _build_task(seed, combo, rng, lambda r: _pipeline_spec(r, combo))


def train_pipeline_tasks(n: int, start: int = 0) -> list[CodeTask]:
    """``n`` training pipeline tasks: training combinations, seeds ``start .. start + n - 1``."""
    if start + n > EVAL_SEED_START:
        raise ValueError("training seeds would overlap the evaluation range")
    return [generate_pipeline_task(seed, TRAIN_COMBOS) for seed in range(start, start + n)]


def heldout_combo_tasks(n: int) -> list[CodeTask]:
    """Held-out combinations (:data:`HELDOUT_COMBOS`) on the evaluation seeds."""
    return [generate_pipeline_task(EVAL_SEED_START + i, HELDOUT_COMBOS) for i in range(n)]
