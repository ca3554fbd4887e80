"""Value and name pools the families draw from (argument names, words, keys, random values), and
the one reference helper several generators share."""

from __future__ import annotations

import random
from collections.abc import Sequence

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


def _product(values: Sequence[int] | range) -> int:
    out = 1
    for v in values:
        out = out * v
    return out
