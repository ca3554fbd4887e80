"""Prompts and splits of the code tasks with equivalent solutions (issue 29).

A task is one pipeline combination (:mod:`relaxspec.data.codegen`) in one *phrasing family*
(docstring style, kind and aggregator; :data:`codevariants.HELDOUT_PHRASINGS`), with a function
name style, annotations (none, builtin generics, or ``typing`` with its import line) and zero to
two doctest examples drawn from the seed, and one solution drawn per example from
:func:`codevariants.render_solution`. Expected outputs come from the pieces' reference functions,
never from a solution, so "every solution passes its tests" checks the two against each other.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence

from relaxspec.data import codegen
from relaxspec.data.codegen import EVAL_SEED_START, HELDOUT_COMBOS, TRAIN_COMBOS, CodeTask
from relaxspec.data.codevariants import (
    DOC_STYLES,
    HELDOUT_PHRASINGS,
    STRATEGIES,
    Pipeline,
    _template,
    indent,
    render_solution,
)
from relaxspec.errors import RelaxSpecError

_TYPING = {"list[int]": "List[int]", "list[str]": "List[str]", "int | None": "Optional[int]"}
_RETURNS = {
    "int": "an integer",
    "str": "a string",
    "list[int]": "a list of integers",
    "list[str]": "a list of strings",
    "int | None": "an integer, or None",
}
_VERBS = ("get", "compute", "find", "make")


def phrasing_of(style: str, combo: str) -> str:
    """The phrasing family of a task: ``"<style>/<kind>.<aggregator>"``."""
    _, kind, _, _, agg = combo.split(".")
    return f"{style}/{kind}.{agg}"


def _names(r: random.Random, word: str, agg_word: str, rest: str) -> str:
    """One function name: the pipeline's own, with a verb, ``<agg>_of_<rest>``, or generic."""
    style = r.choice(("own", "own", "verb", "of", "generic"))
    if style == "verb":
        return f"{r.choice(_VERBS)}_{word}"
    if style == "of" and agg_word:
        return f"{agg_word}_of_{rest or 'values'}"
    if style == "generic":
        return r.choice(("solve", "compute", "process", "transform", "answer"))
    return word


def _signature(name: str, arg: str, arg_type: str, returns: str, hints: str) -> tuple[str, str]:
    """(import header, def line) for annotations ``none``, ``builtin`` or ``typing``."""
    if hints == "none":
        return "", f"def {name}({arg}):"
    if hints == "builtin":
        return "", f"def {name}({arg}: {arg_type}) -> {returns}:"
    arg_t, ret_t = _TYPING.get(arg_type, arg_type), _TYPING.get(returns, returns)
    needed = sorted({t.split("[")[0] for t in (arg_t, ret_t) if t[:1].isupper()})
    header = f"from typing import {', '.join(needed)}\n\n\n" if needed else ""
    return header, f"def {name}({arg}: {arg_t}) -> {ret_t}:"


def _docstring(style: str, doc: str, arg: str, kind: str, returns: str, examples: list[str]) -> str:
    """The indented docstring of ``style`` with ``examples`` (``>>>`` call and result lines)."""
    what = "a list of integers" if kind == "list" else "a string of words separated by spaces"
    if style == "given":
        doc = f"Given {what} {arg}, {doc[:1].lower()}{doc[1:]}"
    lines = [doc]
    if style == "google":
        lines += ["", "Args:", f"    {arg}: {what[:1].upper()}{what[1:]}.", "", "Returns:"]
        lines += [f"    {_RETURNS[returns][:1].upper()}{_RETURNS[returns][1:]}."]
    elif style == "sphinx":
        lines += ["", f":param {arg}: {what}", f":return: {_RETURNS[returns]}"]
    if examples:
        lines += ["", *examples]
    if len(lines) == 1:
        return f'    """{doc}"""'
    return "\n".join([f'    """{lines[0]}', *(f"    {x}" if x else "" for x in lines[1:]), '    """'])


def _draw(r: random.Random, combo: str) -> tuple[Pipeline, list[tuple], list[object], str, tuple[str, ...]]:
    """Constants, argument and reference outputs of one combination: (pipeline, inputs,
    expected, name word, docstring sentences)."""
    kind, fk, mk, ak = combo.split(".")[1:]
    filters, maps, aggs = codegen._PIECES[kind]
    f, m, a = codegen._piece(filters, fk), codegen._piece(maps, mk), codegen._piece(aggs, ak)
    fc, mc, ac = codegen._draw_const(r, f), codegen._draw_const(r, m), codegen._draw_const(r, a)
    arg = r.choice(codegen.LIST_ARGS if kind == "list" else codegen.STR_ARGS)
    inputs = codegen._pipeline_inputs(r, kind, fk, fc, ak)

    def ref(value: object) -> object:
        items = value if kind == "list" else str(value).split()
        return a.fn([m.fn(it, mc) for it in items if f.fn(it, fc)], ac)

    expected = [ref(copy.deepcopy(args[0])) for args in inputs]
    docs = tuple(
        ap.format(M=mp.format(F=fp.format(xs=arg, c=fc), c=mc), F=fp.format(xs=arg, c=fc), c=ac)
        for ap in a.phrases
        for mp in m.phrases
        for fp in f.phrases
    )
    rest = "_".join(p for p in (f.word + (f"_{fc}" if fk == "letter" else ""), m.word) if p)
    pipe = Pipeline(
        kind, ak, ac, arg, _template(f.code.format(c=fc)), _template(m.code.format(c=mc)) or "{v}"
    )
    return pipe, inputs, expected, f"{a.word}|{rest}", docs


def build_task(seed: int, combo: str, style: str, r: random.Random) -> tuple[CodeTask, Pipeline] | None:
    """The task of ``combo`` in docstring ``style``, names and solution drawn from ``r`` (None:
    the draw has outputs that a constant body would pass, draw again)."""
    pipe, inputs, expected, words, docs = _draw(r, combo)
    if len({repr(e) for e in expected}) < 2:
        return None
    agg_word, rest = words.split("|")
    word = "_".join(p for p in (agg_word, rest) if p)
    word += "_words" if pipe.kind == "str" else "" if "_" in word else "_values"
    name = _names(r, word, agg_word, rest)
    returns = codegen._piece(codegen._PIECES[pipe.kind][2], pipe.agg).code
    arg_type = "list[int]" if pipe.kind == "list" else "str"
    header, signature = _signature(name, pipe.arg, arg_type, returns, r.choice(("none", "builtin", "typing")))
    doc = r.choice(docs)
    n_examples = 0 if style == "oneline" else r.choice([1, 2]) if style == "examples" else r.choice([0, 0, 1])
    shown = [(args, out) for args, out in zip(inputs, expected, strict=True) if args[0]][-n_examples:]
    examples = [
        x for args, out in shown[:n_examples] for x in (f">>> {codegen._call(name, args)}", repr(out))
    ]
    body = None
    while body is None:
        body = render_solution(pipe, r.choice(list(STRATEGIES)), r)
    test = "\n".join(
        ["def check(candidate):"]
        + [
            f"    assert {codegen._call('candidate', args)} == {out!r}"
            for args, out in zip(inputs, expected, strict=True)
        ]
    )
    task = CodeTask(
        seed=seed,
        family=f"{combo}/{style}",
        entry_point=name,
        prompt=f"{header}{signature}\n{_docstring(style, doc, pipe.arg, pipe.kind, returns, examples)}",
        solution=indent(body),
        test=test + "\n",
        spec=f"{signature}\n{doc}",
    )
    return task, pipe


def generate_variant_task(
    seed: int, combos: Sequence[str] = TRAIN_COMBOS, heldout_phrasing: bool = False
) -> CodeTask:
    """The task for ``seed``: a combination of ``combos`` in a training phrasing family (or, with
    ``heldout_phrasing``, in a held-out one): deterministic."""
    return variant_task_and_pipeline(seed, combos, heldout_phrasing)[0]


def variant_task_and_pipeline(
    seed: int, combos: Sequence[str] = TRAIN_COMBOS, heldout_phrasing: bool = False
) -> tuple[CodeTask, Pipeline]:
    """:func:`generate_variant_task` and the task's :class:`Pipeline` (for :func:`solutions`)."""
    unknown = set(combos) - set(codegen.PIPELINE_COMBOS)
    if unknown or not combos:
        raise RelaxSpecError(
            f"unknown pipeline combinations: {sorted(unknown)[:3]}" if unknown else "no combinations"
        )
    r = random.Random(f"codevar-{seed}")
    for _ in range(1000):
        combo = r.choice(list(combos))
        styles = [s for s in DOC_STYLES if (phrasing_of(s, combo) in HELDOUT_PHRASINGS) == heldout_phrasing]
        if not styles:
            continue
        built = build_task(seed, combo, r.choice(styles), r)
        if built is not None:
            return built
    raise RelaxSpecError(f"no task for seed {seed} in these combinations and phrasings")


def train_variant_tasks(n: int, start: int = 0) -> list[CodeTask]:
    """``n`` training tasks: training combinations and phrasings, held-out specs skipped."""
    out, seed = [], start
    while len(out) < n:
        if seed >= EVAL_SEED_START:
            raise ValueError("training seeds would overlap the evaluation range")
        task = generate_variant_task(seed)
        if not codegen.is_heldout_spec(task.spec):
            out.append(task)
        seed += 1
    return out


def heldout_seed_variant_tasks(n: int) -> list[CodeTask]:
    """Held-out seeds: training combinations and phrasings, evaluation seeds, held-out specs only."""
    out, seed = [], EVAL_SEED_START
    while len(out) < n:
        task = generate_variant_task(seed)
        if codegen.is_heldout_spec(task.spec):
            out.append(task)
        seed += 1
    return out


def heldout_combo_variant_tasks(n: int) -> list[CodeTask]:
    """Held-out combinations (:data:`codegen.HELDOUT_COMBOS`) in training phrasings."""
    return [generate_variant_task(EVAL_SEED_START + i, HELDOUT_COMBOS) for i in range(n)]


def heldout_phrasing_variant_tasks(n: int) -> list[CodeTask]:
    """Training combinations in held-out phrasing families (:data:`HELDOUT_PHRASINGS`)."""
    return [generate_variant_task(EVAL_SEED_START + i, TRAIN_COMBOS, heldout_phrasing=True) for i in range(n)]
