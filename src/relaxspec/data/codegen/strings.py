"""Families over strings and their words (count vowels, reverse words, initials, ...)."""

from __future__ import annotations

import random
from collections.abc import Callable

from relaxspec.data.codegen.pools import PALINDROMES, STR_ARGS, WORD_ARGS, WORDS, _sentence
from relaxspec.data.codegen.task import _family, _Spec


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
