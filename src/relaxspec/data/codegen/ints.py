"""Families over integers (clamp, digit sums, gcd, ...): one spec-drawing function each."""

from __future__ import annotations

import random

from relaxspec.data.codegen.pools import INT_ARGS, _product
from relaxspec.data.codegen.task import _family, _Spec


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
