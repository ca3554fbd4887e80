"""vLLM rows for ``relaxspec bench`` / ``generate`` / ``loadtest`` (``--engine vllm``; DESIGN §6, §8).

- our methods through vLLM + the plugin: ``ar``, ``sd``, ``nsd``, ``topk``, ``typical``,
  ``lenience`` (parameters as in :mod:`relaxspec.methods`: ``k``, ``theta``, ``accept_k``, ...);
- peers = stock vLLM, plugin out: ``vllm-ar`` and ``vllm-sd`` (``k``; vLLM's default greedy
  drafting, i.e. what a user of stock vLLM gets).

Engines are shared: every rule at one ``k`` runs on the same vLLM engine (the rule is a
per-request argument), so a θ grid costs one engine. Benchmark engines run in their own processes
(``multiprocessing=True``) so that several stay alive side by side and prompts can be interleaved
across cells; a runner records, per generation, the same counters as our engine
(:class:`relaxspec.engine.stats.GenerationStats` field names).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from relaxspec.errors import RelaxSpecError
from relaxspec.integrations.vllm.offline import VLLMEngine, VLLMResult
from relaxspec.integrations.vllm.rules import PARAM_KEYS, canonical

# Our method presets that run inside vLLM, with their parameters and defaults (methods.py's names).
METHODS: dict[str, dict[str, Any]] = {
    "ar": {},
    "sd": {"k": 4},
    "nsd": {"k": 4, "theta": 0.95},
    "topk": {"k": 4, "accept_k": 2},
    "typical": {"k": 4, "epsilon": 0.09, "delta": 0.3},
    "lenience": {"k": 4, "ell": 0.5},
}
# Stock vLLM peers (plugin disabled).
PEERS: dict[str, dict[str, Any]] = {"vllm-ar": {}, "vllm-sd": {"k": 4}}
PEER_NEEDS: dict[str, tuple[str, ...]] = {"vllm-ar": ("target",), "vllm-sd": ("target", "draft")}
PEER_SUMMARY = {
    "vllm-ar": "stock vLLM (relaxspec plugin disabled), autoregressive",
    "vllm-sd": "stock vLLM (relaxspec plugin disabled), draft-model speculative decoding, k drafts",
}


def is_peer(name: str) -> bool:
    return name in PEERS


def resolve(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Validated parameters of a vLLM row (unknown method / parameter / value: clear error)."""
    table = PEERS if is_peer(name) else METHODS
    if name not in table:
        raise RelaxSpecError(
            f"method {name!r} does not run inside vLLM; vLLM rows: {', '.join([*METHODS, *PEERS])}"
        )
    unknown = sorted(set(params) - set(table[name]))
    if unknown:
        raise RelaxSpecError(
            f"{name!r} with --engine vllm has no parameter {', '.join(unknown)} "
            f"(parameters: {', '.join(table[name]) or 'none'})"
        )
    out = {**table[name], **params}
    k = out.get("k", 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise RelaxSpecError(f"k of {name!r} must be an integer >= 1, got {k!r}")
    if name in METHODS and name != "ar":
        from relaxspec.integrations.vllm.rules import RuleChoice

        RuleChoice(canonical(name), {p: v for p, v in out.items() if p in PARAM_KEYS})
    return out


class EnginePool:
    """One vLLM engine per (kind, k, stock); created on first use, closed by :meth:`close`."""

    def __init__(
        self,
        target: str | Path | None = None,
        draft: str | Path | None = None,
        multiprocessing: bool = True,
        **engine_kwargs: Any,
    ) -> None:
        self.target, self.draft = target, draft
        self.multiprocessing = multiprocessing
        self.engine_kwargs = engine_kwargs
        self.engines: dict[tuple[str, int, bool], VLLMEngine] = {}

    def get(self, kind: str, k: int, stock: bool) -> VLLMEngine:
        # AR has no acceptance step: the plugin changes nothing there, so ar and vllm-ar share one.
        key = (kind, k, stock) if kind != "ar" else ("ar", 0, True)
        if key not in self.engines:
            self.engines[key] = VLLMEngine(
                kind,
                target=self.target,
                draft=self.draft,
                k=k,
                stock=key[2],
                multiprocessing=self.multiprocessing,
                **self.engine_kwargs,
            )
        return self.engines[key]

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
        self.engines.clear()


def generation_stats(result: VLLMResult, k: int) -> dict[str, Any]:
    """A vLLM generation's counters under :class:`GenerationStats` names (+ vLLM extras)."""
    s = result.stats
    forwards = int(s["target_forwards"])
    plugin = s.get("plugin")
    out: dict[str, Any] = {
        "prompt_tokens": result.prompt_tokens,
        "new_tokens": len(result.tokens),
        "cycles": forwards,
        "verifier_calls": forwards,
        "draft_calls": k * max(forwards - 1, 0),
        "total_seconds": s["total_seconds"],
        "finish_reason": s.get("finish_reason") or "",
        "tau": s["tau"],
        "engine": "vllm",
        "stock": s["stock"],
        "rule": s.get("rule"),
    }
    if plugin is not None:
        out["accepted_by_relaxation"] = plugin["relaxed_accepted"]
        out["position_proposed"] = plugin["drafted_per_pos"]
        out["position_accepted"] = plugin["accepted_per_pos"]
        out["relaxed_per_pos"] = plugin["relaxed_per_pos"]
    return out


def runner(name: str, params: dict[str, Any], sampling: Any, pool: EnginePool) -> Any:
    """A benchmark runner ``run(example, seed, max_new_tokens) -> record fields`` for a vLLM row.

    ``sampling``: :class:`relaxspec.core.sampling.SamplingParams` of the grid (temperature, top-k,
    top-p, budget). Methods get the plugin and their rule per request; peers are stock vLLM.
    """
    p = resolve(name, params)
    stock = is_peer(name)
    kind = {"vllm-ar": "ar", "vllm-sd": "sd"}.get(name, name)
    k = int(p.get("k", 0)) if kind != "ar" else 0
    engine = pool.get(kind, k, stock)
    rule_params = {x: v for x, v in p.items() if x in PARAM_KEYS}
    rule = None if stock or kind == "ar" else {"rule": kind, **rule_params}

    def run(ex: Any, seed: int, max_new_tokens: int | None = None) -> dict[str, Any]:
        result = engine.generate(
            ex.prompt,
            temperature=sampling.temperature,
            max_new_tokens=max_new_tokens or sampling.max_new_tokens,
            seed=seed if sampling.temperature > 0 else None,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            stop=list(ex.stop) or None,
            rule=rule,
        )[0]
        return {
            "tokens": result.tokens,
            "text": result.text,
            "seconds": result.stats["total_seconds"],
            "stats": generation_stats(result, k),
        }

    return run


def generate_json(
    method: str,
    prompt: str,
    *,
    params: dict[str, Any] | None = None,
    k: int = 4,
    temperature: float = 0.0,
    max_new_tokens: int = 128,
    seed: int | None = None,
    top_k: int = 0,
    top_p: float = 1.0,
    target: str | Path | None = None,
    draft: str | Path | None = None,
    stop: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One generation for ``relaxspec generate --engine vllm``: ``{"text", "tokens", "stats"}``."""
    p = resolve(method, {"k": k, **(params or {})} if method != "ar" else dict(params or {}))
    if method == "ar":
        p["k"] = 1
    rule_params = {x: v for x, v in p.items() if x in PARAM_KEYS}
    engine = VLLMEngine(
        method, target=target, draft=draft, k=p.get("k", 1), max_model_len=None, seed=seed or 0, **rule_params
    )
    try:
        result = engine.generate(
            prompt,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            seed=seed,
            top_k=top_k,
            top_p=top_p,
            stop=stop,
        )[0]
    finally:
        engine.close()
    stats = generation_stats(result, p.get("k", 0) if method != "ar" else 0)
    stats.update({"method": method, "params": p, "temperature": temperature})
    return {"text": result.text, "tokens": result.tokens, "stats": stats}


def serve_command(method: str, extra: Sequence[str] = ()) -> list[str]:
    """``python -m relaxspec.integrations.vllm.serve`` arguments for a load-test row (``vllm-*``: stock)."""
    import sys

    stock = is_peer(method)
    kind = {"vllm-ar": "ar", "vllm-sd": "sd"}.get(method, method)
    command = [sys.executable, "-m", "relaxspec.integrations.vllm.serve", "--method", kind]
    if stock:
        command.append("--stock")
    return command + list(extra)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to fd 1 (vLLM's logs, native prints) to stderr for a while."""
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def cli_generate(
    method: str,
    params: dict[str, Any],
    paths: dict[str, Any],
    prompt: str,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    max_new_tokens: int,
    stop: Sequence[str] | None,
    as_json: bool,
) -> None:
    """``relaxspec generate --engine vllm``: one JSON object on stdout (``--json``) or the text."""
    import json
    import os
    import sys

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    params = dict(params)
    k = params.pop("k", METHODS.get(method, {}).get("k", 4))
    with stdout_to_stderr():
        out = generate_json(
            method,
            prompt,
            params=params,
            k=k,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            seed=seed,
            top_k=top_k,
            top_p=top_p,
            target=paths.get("target"),
            draft=paths.get("draft"),
            stop=stop,
        )
    if as_json:
        print(json.dumps(out))
        return
    s = out["stats"]
    print(out["text"])
    print(
        f"[{method} in vLLM] {s['new_tokens']} tokens in {s['total_seconds']:.2f}s, tau={s['tau']:.2f}, "
        f"target forwards={s['verifier_calls']}, relaxed accepts={s.get('accepted_by_relaxation', 0)}",
        file=sys.stderr,
    )
