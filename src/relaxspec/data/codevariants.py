"""Code tasks rendered with one of several equivalent correct solutions (issue 29).

Relaxed verification (NSD, top-k, typical acceptance) pays where a target is *competent and
uncertain*: several continuations are all correct. :mod:`relaxspec.data.codegen` writes one
canonical body per task; here each compositional pipeline task (:data:`codegen.PIPELINE_COMBOS`)
is rendered with one solution drawn per example from :func:`solutions` (:data:`STRATEGIES`:
builtin + generator, comprehension, explicit loop with an accumulator, early return, filter then
map in two steps, a nested helper; drawn names, optional guard, comment and blank line), under a
broader prompt (name styles, annotations, the five docstring styles of :data:`DOC_STYLES`).

Splits (deterministic): a *phrasing family* is (docstring style, aggregator of a kind);
:data:`HELDOUT_PHRASINGS` are never trained. Training: :data:`codegen.TRAIN_COMBOS` in training
phrasings on seeds below :data:`EVAL_SEED_START`, held-out specs skipped; held out: seeds,
combinations (:data:`codegen.HELDOUT_COMBOS`) and phrasings. Models: docs/models.md (issue 29).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from relaxspec.data.codegen import _pipeline_body

DOC_STYLES = ("oneline", "examples", "google", "sphinx", "given")
_AGGS = {"list": ("sum", "count", "max", "min", "list", "first", "last", "product"),
         "str": ("list", "count", "join", "sep", "concat", "first", "last")}  # fmt: skip
# One held-out (style, aggregator) pair per kind and non-plain style, rotating over the aggregators.
HELDOUT_PHRASINGS: tuple[str, ...] = tuple(
    f"{style}/{kind}.{_AGGS[kind][(2 * i + j) % len(_AGGS[kind])]}"
    for i, style in enumerate(DOC_STYLES[1:])
    for j, kind in enumerate(("list", "str"))
)
LOOP_VARS = {"list": ("x", "n", "num", "v", "value", "item"), "str": ("w", "word", "token", "part")}
HELPERS = {"cond": ("keep", "is_wanted", "wanted", "matches", "ok"), "map": ("transform", "convert", "f")}
_ACC = {
    "sum": ("total", "result", "acc", "running"),
    "count": ("count", "n_kept", "counter", "total"),
    "max": ("best", "largest", "top", "result"),
    "min": ("best", "smallest", "low", "result"),
    "product": ("result", "prod", "acc", "total"),
}
_LISTS = ("values", "kept", "result", "selected", "out", "picked")
_COMMENTS = ("# go through {xs} one by one", "# check each element", "# collect what we need", "# main loop")


@dataclass(frozen=True)
class Pipeline:
    """What every solution of one task needs: the argument, the aggregator and the code pieces.

    ``cond`` and ``expr`` are templates over the loop variable ``{v}`` (``cond`` empty: keep all).
    """

    kind: str  # "list" or "str"
    agg: str
    const: object  # the aggregator's constant (a separator), or None
    arg: str
    cond: str
    expr: str

    @property
    def empty(self) -> str:
        """The result for an input with nothing to aggregate."""
        if self.agg in ("first", "last"):
            return "None" if self.kind == "list" else '""'
        return {"sum": "0", "count": "0", "max": "0", "min": "0", "list": "[]", "product": "1"}.get(
            self.agg, '""'
        )

    @property
    def identity(self) -> bool:
        return not self.cond and self.expr == "{v}"

    @property
    def sep(self) -> str:
        return {"join": " ", "concat": ""}.get(self.agg, str(self.const))


def _template(code: str) -> str:
    """A piece's code over ``x`` / ``w`` as a template over ``{v}`` (constants already in)."""
    return re.sub(r"\b[xw]\b", "{v}", code)


def _pick(r: random.Random, options: Sequence[str], *avoid: str) -> str:
    return r.choice([o for o in options if o not in avoid])


def _loop(var: str, src: str, cond: str, inner: list[str], use_continue: bool) -> list[str]:
    """``for var in src:`` around ``inner``, guarded by ``cond`` with ``if`` or ``if not: continue``."""
    if not cond:
        return [f"for {var} in {src}:", *(f"    {line}" for line in inner)]
    if use_continue:
        return [
            f"for {var} in {src}:",
            f"    if not {cond}:",
            "        continue",
            *(f"    {x}" for x in inner),
        ]
    return [f"for {var} in {src}:", f"    if {cond}:", *(f"        {line}" for line in inner)]


def _from_list(p: Pipeline, name: str, r: random.Random) -> list[str]:
    """Lines that return the aggregate of an already built list ``name``."""
    if p.agg == "sum":
        return [f"return sum({name})"]
    if p.agg == "count":
        return [f"return len({name})"]
    if p.agg in ("max", "min"):
        return [r.choice([f"return {p.agg}({name}) if {name} else 0", f"return {p.agg}({name}, default=0)"])]
    if p.agg == "list":
        return [f"return {name}"]
    if p.agg in ("first", "last"):
        return [f"return {name}[{0 if p.agg == 'first' else -1}] if {name} else {p.empty}"]
    if p.agg == "product":
        acc = _pick(r, _ACC["product"], name)
        return [f"{acc} = 1", f"for y in {name}:", f"    {acc} *= y", f"return {acc}"]
    return [f'return "{p.sep}".join({name})']


def _builtin(p: Pipeline, var: str, src: str, r: random.Random, cond: str = "", expr: str = "") -> list[str]:
    """The generator + builtin body (codegen's canonical one), optionally with helper calls."""
    cond, expr = cond or p.cond.format(v=var), expr or p.expr.format(v=var)
    return list(
        _pipeline_body(p.kind, p.agg, p.const, var, src, cond, expr, identity=not cond and expr == var)
    )


def _comprehension(p: Pipeline, var: str, src: str, r: random.Random) -> list[str]:
    """Build the mapped list in a local, then aggregate it."""
    name = _pick(r, _LISTS, p.arg)
    cond, expr = p.cond.format(v=var), p.expr.format(v=var)
    if p.identity:
        first = f"{name} = list({src})" if p.kind == "list" else f"{name} = {src}"
    else:
        first = f"{name} = [{expr} for {var} in {src}" + (f" if {cond}]" if cond else "]")
    return [first, *_from_list(p, name, r)]


def _two_steps(p: Pipeline, var: str, src: str, r: random.Random) -> list[str] | None:
    """Filter into one list, map into another, then aggregate (only for a real filter and map)."""
    if not p.cond or p.expr == "{v}":
        return None
    kept, mapped = r.sample([n for n in _LISTS if n != p.arg], 2)
    return [
        f"{kept} = [{var} for {var} in {src} if {p.cond.format(v=var)}]",
        f"{mapped} = [{p.expr.format(v=var)} for {var} in {kept}]",
        *_from_list(p, mapped, r),
    ]


def _accumulate(p: Pipeline, var: str, src: str, r: random.Random) -> list[str]:
    """An explicit loop: accumulator, early return (first), overwrite (last), best-so-far (max/min)."""
    cond, expr, cont = p.cond.format(v=var), p.expr.format(v=var), r.random() < 0.35
    if p.agg == "first":
        return [*_loop(var, src, cond, [f"return {expr}"], False), f"return {p.empty}"]
    if p.agg == "last" and r.random() < 0.5:
        return [*_loop(var, f"reversed({src})", cond, [f"return {expr}"], False), f"return {p.empty}"]
    acc = _pick(r, _ACC.get(p.agg, _LISTS), p.arg, var)
    if p.agg in ("max", "min"):
        op = ">" if p.agg == "max" else "<"
        inner = [f"if {acc} is None or {expr} {op} {acc}:", f"    {acc} = {expr}"]
        return [f"{acc} = None", *_loop(var, src, cond, inner, cont), f"return 0 if {acc} is None else {acc}"]
    init, inner, ret = {
        "sum": ("0", [f"{acc} += {expr}"], acc),
        "count": ("0", [f"{acc} += 1"], acc),
        "product": ("1", [f"{acc} *= {expr}"], acc),
        "list": ("[]", [f"{acc}.append({expr})"], acc),
        "last": (p.empty, [f"{acc} = {expr}"], acc),
    }.get(p.agg, ("[]", [f"{acc}.append({expr})"], f'"{p.sep}".join({acc})'))
    if p.agg == "concat" and r.random() < 0.5:  # a string accumulator
        init, inner, ret = '""', [f"{acc} += {expr}"], acc
    return [f"{acc} = {init}", *_loop(var, src, cond, inner, cont), f"return {ret}"]


def _with_helper(p: Pipeline, var: str, src: str, r: random.Random) -> list[str] | None:
    """A nested helper for the condition (or the map), called from the builtin body."""
    part = "cond" if p.cond and (p.expr == "{v}" or r.random() < 0.5) else "map" if p.expr != "{v}" else None
    if part is None:
        return None
    name, hv = r.choice(HELPERS[part]), r.choice(LOOP_VARS[p.kind])
    code = (p.cond if part == "cond" else p.expr).format(v=hv)
    helper = [f"def {name}({hv}):", f"    return {code}", ""]
    call = f"{name}({var})"
    return helper + _builtin(p, var, src, r, **({"cond": call} if part == "cond" else {"expr": call}))


STRATEGIES = {
    "builtin": _builtin,
    "comprehension": _comprehension,
    "loop": _accumulate,
    "two_steps": _two_steps,
    "helper": _with_helper,
}


def _independent_init(line: str, src: str) -> bool:
    """Whether ``line`` is a plain initialisation (``total = 0``) that does not read ``src``."""
    return bool(re.fullmatch(r"\w+ = (0|1|None|\[\]|\"\")", line)) and src not in line


def render_solution(p: Pipeline, strategy: str, r: random.Random) -> tuple[str, ...] | None:
    """One solution body (lines without the function's indentation), or None where ``strategy``
    does not apply; names, guard, statement order, comment and blank line drawn from ``r``."""
    var = _pick(r, LOOP_VARS[p.kind], p.arg)
    src, head = (p.arg, []) if p.kind == "list" else (f"{p.arg}.split()", [])
    if p.kind == "str" and r.random() < 0.4:  # split once into a local
        src = _pick(r, ("words", "parts", "tokens"), p.arg)
        head = [f"{src} = {p.arg}.split()"]
    body = STRATEGIES[strategy](p, var, src, r)
    if body is None:
        return None
    if head and r.random() < 0.5 and _independent_init(body[0], src):
        body = [body[0], *head, *body[1:]]  # the split and an accumulator's init are independent
    else:
        body = head + body
    if r.random() < 0.2:
        body = [f"if not {p.arg}:", f"    return {p.empty}", *body]
    if r.random() < 0.25:
        at = next((i for i, line in enumerate(body) if line.startswith(("for ", "return "))), 0)
        body.insert(at, r.choice(_COMMENTS).format(xs=p.arg))
    if len(body) >= 3 and r.random() < 0.3 and body[-2].strip():
        body.insert(len(body) - 1, "")
    return tuple(body)


def solutions(p: Pipeline, seed: int, tries: int = 4) -> list[tuple[str, ...]]:
    """Several solutions of one task (each strategy ``tries`` times with other draws), distinct."""
    r = random.Random(seed)
    out: list[tuple[str, ...]] = []
    for strategy in STRATEGIES:
        for _ in range(tries):
            body = render_solution(p, strategy, r)
            if body is not None and body not in out:
                out.append(body)
    return out


def indent(body: Sequence[str]) -> str:
    """Lines as a completion after the prompt: ``"\\n    line"`` each (blank lines stay empty)."""
    return "".join(f"\n    {line}" if line else "\n" for line in body)
