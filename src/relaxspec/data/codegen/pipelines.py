"""Compositional pipelines (generator version 2).

A pipeline task is one combination of three pieces (:mod:`.pieces`): a *filter* (which elements to
keep), a *map* (what to do with each kept element) and an *aggregator* (what to return), over a
list of integers or over the words of a string (:data:`PIPELINE_COMBOS`). Its docstring sentence is
composed from the pieces' phrases ("Return the sum of the squares of the even numbers in nums."),
its canonical body from the pieces' code, and its expected outputs from the pieces' reference
functions (written apart from the code strings). The held-out split is a set of *combinations*
(:data:`HELDOUT_COMBOS`): every filter, map and aggregator, and every pair of them that a held-out
combination uses, also appears in training combinations (:data:`TRAIN_COMBOS`), so a held-out
combination measures composition of seen pieces.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Sequence

from relaxspec.data.codegen.pieces import _PIECES, _draw_const, _Piece
from relaxspec.data.codegen.pools import LIST_ARGS, STR_ARGS, WORDS, _ints, _sentence
from relaxspec.data.codegen.task import EVAL_SEED_START, CodeTask, _build_task, _Spec
from relaxspec.errors import RelaxSpecError

PIPELINE_HELDOUT_BUCKETS = 8  # about one combination in eight is a held-out candidate


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
