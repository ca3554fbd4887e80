"""The bench's grid: the command line's lists, ``--set`` sweeps and ``--model`` roles parsed, and
every (runner, parameters, dataset, seed) cell expanded and validated before any model loads."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from relaxspec.errors import RelaxSpecError
from relaxspec.eval.peers import is_peer, peer_names, resolve_runner, runner_params
from relaxspec.eval.rows import Cell
from relaxspec.integrations.vllm import runners as vllm_runners
from relaxspec.methods import get_method


def split_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_seeds(text: str) -> list[int]:
    try:
        return [int(x) for x in split_list(text)]
    except ValueError:
        raise RelaxSpecError(f"--seeds expects comma-separated integers, got {text!r}") from None


def parse_temperatures(text: str, option: str = "--temperature") -> list[float]:
    """``1,0.9`` -> [1.0, 0.9]; ``option`` names the flag in the one-line error."""
    try:
        temps = [float(x) for x in split_list(text)]
    except ValueError:
        raise RelaxSpecError(f"{option} expects comma-separated numbers, got {text!r}") from None
    if not temps:
        raise RelaxSpecError(f"{option} expects a number")
    return temps


def parse_peers(text: str) -> list[str] | None:
    """``auto`` (None: every peer whose models exist), ``none`` or a comma-separated list."""
    if text.strip() == "auto":
        return None
    return [] if text.strip() == "none" else split_list(text)


def parse_models(
    target: str | Path | None, draft: str | Path | None, items: Sequence[str]
) -> dict[str, str | None]:
    """Model directories by role from ``--target``, ``--draft`` and ``--model role=DIR``."""
    models = {"target": str(target) if target else None, "draft": str(draft) if draft else None}
    for item in items:
        role, sep, path = item.partition("=")
        if not sep or not role.strip() or not path.strip():
            raise RelaxSpecError(f"--model expects role=DIR, got {item!r}")
        models[role.strip()] = path.strip()
    return models


def parse_value(text: str) -> Any:
    """A ``--set`` value: a JSON scalar (number, true/false, null) as such, anything else a string."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if value is None or isinstance(value, int | float | bool | str) else text


def parse_sets(items: Sequence[str]) -> dict[str | None, dict[str, list[Any]]]:
    """``["nsd.theta=0.9,0.95", "k=4,8"]`` -> ``{"nsd": {"theta": [0.9, 0.95]}, None: {"k": [4, 8]}}``.

    ``method.name=values`` sweeps one method's parameter; ``name=values`` every method that has it.
    """
    out: dict[str | None, dict[str, list[Any]]] = {}
    for item in items:
        lhs, sep, rhs = item.partition("=")
        values = [v.strip() for v in rhs.split(",")]
        if not sep or not lhs.strip() or not all(values):
            raise RelaxSpecError(f"--set expects [method.]name=value[,value...], got {item!r}")
        method, _, name = lhs.strip().rpartition(".")
        out.setdefault(method or None, {})[name] = [parse_value(v) for v in values]
    return out


def _sweepable(name: str, engine: str) -> Iterable[str]:
    """The names ``--set`` may give ``name``: a vLLM row's parameters and options (e.g. ``proposer``,
    ``prompt_lookup_min``), a preset's or peer's parameters otherwise."""
    if vllm_runners.is_peer(name) or (engine == "vllm" and not is_peer(name)):
        return vllm_runners.row_names(name)
    return runner_params(name)


def _grid_params(
    name: str, sets: dict[str | None, dict[str, list[Any]]], engine: str = "relaxspec"
) -> list[dict[str, Any]]:
    """Every combination of the swept values of ``name``'s parameters, validated."""
    in_vllm = engine == "vllm" and not is_peer(name)
    known = _sweepable(name, engine)
    swept = {k: v for k, v in sets.get(None, {}).items() if k in known}
    swept.update(sets.get(name, {}))
    names = sorted(swept)
    combos = [
        dict(zip(names, values, strict=True)) for values in itertools.product(*(swept[n] for n in names))
    ]
    if in_vllm:
        return [vllm_runners.resolve(name, combo) for combo in combos]
    return [resolve_runner(name, combo) for combo in combos]


def expand_grid(
    methods: Sequence[str],
    peers: Sequence[str],
    sets: dict[str | None, dict[str, list[Any]]],
    datasets: Sequence[str],
    seeds: Sequence[int],
    sampling: dict[str, Any],
    engine: str = "relaxspec",
) -> list[Cell]:
    """All cells, ``ar`` first; unknown methods, peers or parameter names fail with one message.

    ``hf-assisted`` follows the ``k`` values of ``sd`` unless its own ``k`` is swept, so that our
    speculative decoding and Hugging Face's run with the same draft length.
    """
    for name in methods:
        if engine == "vllm":
            vllm_runners.resolve(name, {})
        else:
            get_method(name)
    for name in peers:
        if not is_peer(name):
            raise RelaxSpecError(f"unknown peer {name!r}; choose from {', '.join(peer_names())}")
    runners = list(dict.fromkeys(["ar", *methods, *peers]))
    for method in sets:
        if method is not None and method not in runners:
            raise RelaxSpecError(f"--set names {method!r}, which is not in --methods or --peers")
    for name in sets.get(None, {}):
        if not any(name in _sweepable(r, engine) for r in runners):
            raise RelaxSpecError(f"--set {name}=...: no method in the grid has a parameter {name!r}")
    params = {r: _grid_params(r, sets, engine) for r in runners}
    if "hf-assisted" in params and "k" not in {**sets.get(None, {}), **sets.get("hf-assisted", {})}:
        ks = sorted({p["k"] for p in params.get("sd", [])}) or [get_method("sd").defaults["k"]]
        confidence = {**sets.get(None, {}), **sets.get("hf-assisted", {})}.get("confidence", [0.0])
        params["hf-assisted"] = [
            resolve_runner("hf-assisted", {"k": k, "confidence": c}) for k in ks for c in confidence
        ]
    return [
        Cell(r, p, d, s, dict(sampling)) for d in datasets for s in seeds for r in runners for p in params[r]
    ]
