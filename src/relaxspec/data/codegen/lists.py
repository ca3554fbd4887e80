"""Families over lists of integers (sum of evens, running max, dedupe, ...)."""

from __future__ import annotations

import random
from collections.abc import Callable

from relaxspec.data.codegen.pools import LIST_ARGS, _ints, _product
from relaxspec.data.codegen.task import _family, _Spec


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
