"""The pieces of a pipeline task (generator version 2): filters, maps and aggregators over a
list of integers (loop variable ``x``) or the words of a string (loop variable ``w``)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from relaxspec.data.codegen.pools import _product


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
