"""Families over dicts of counts (invert, key of max, filter by value, ...)."""

from __future__ import annotations

import random
from collections.abc import Callable

from relaxspec.data.codegen.pools import DICT_ARGS, KEYS, _dict
from relaxspec.data.codegen.task import _family, _Spec


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
