"""vLLM rows for ``relaxspec bench`` / ``generate`` / ``loadtest`` (``--engine vllm``; docs/design.md §6, §8).

- our methods through vLLM + the plugin: ``ar``, ``sd``, ``nsd``, ``topk``, ``typical``,
  ``lenience`` (parameters as in :mod:`relaxspec.methods`: ``k``, ``theta``, ``accept_k``, ...);
- ProVe and SDD with our proposers inside vLLM (:mod:`.proposers`; parameters as in
  :mod:`relaxspec.methods`): ``prove-lossless`` (target = proposer = the block model, B =
  ``block_size``, lossless), ``prove`` (block proposer, small verifier = the draft model, ``Gate(θ)``),
  ``sdd`` (diffusion drafter, target, ``accept`` = exact | lenience | topk | nucleus, ``gamma``,
  ``steps``, ``reveal``). ``mars``, ``sdd-skip`` and ``sdd-periodic`` skip the verifier and stay in
  relaxspec's engine (vLLM runs the target every step);
- peers = stock vLLM, plugin out: ``vllm-ar`` and ``vllm-sd`` (``k``; vLLM's default greedy
  drafting, i.e. what a user of stock vLLM gets). ``vllm-ar`` takes an optional ``model``
  (``target`` by default, or ``block`` / ``draft``): AR of the model a method verifies with,
  e.g. ``--set vllm-ar.model=block`` beside ``prove-lossless``.

Engines are shared: every rule at one ``k`` runs on the same vLLM engine (the rule is a
per-request argument), so a θ grid costs one engine. Benchmark engines run in their own processes
(``multiprocessing=True``) so that several stay alive side by side and prompts can be interleaved
across cells; a runner records, per generation, the same counters as our engine
(:class:`relaxspec.engine.stats.GenerationStats` field names).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relaxspec.engine.proposers.block import check_min_confidence
from relaxspec.errors import RelaxSpecError
from relaxspec.integrations.vllm.offline import VLLMEngine, VLLMResult
from relaxspec.integrations.vllm.rules import PARAM_KEYS, RuleChoice, canonical
from relaxspec.methods import BASE_PARAMS, get_method
from relaxspec.models import model_dir

# Our method presets that run inside vLLM, with their parameters and defaults (methods.py's names).
METHODS: dict[str, dict[str, Any]] = {
    "ar": {},
    "sd": {"k": 4},
    "nsd": {"k": 4, "theta": None},
    "topk": {"k": 4, "accept_k": 2},
    "typical": {"k": 4, "epsilon": 0.09, "delta": 0.3},
    "lenience": {"k": 4, "ell": 0.5},
    # the other engines' rules (core/peer_rules.py): parameters as methods.py's presets
    **{m: {**get_method(m).params, "k": 4} for m in ("topk-delta", "threshold", "fly")},
    # Our proposers inside vLLM (.proposers); defaults as methods.py's presets.
    "prove-lossless": {"block_size": 8},
    "prove": {"block_size": 8, "theta": 0.05},
    # the engine's SDD parameters (gamma/steps None: the drafter's operating point), not its
    # verifier-skipping audit
    "sdd": {name: value for name, value in BASE_PARAMS.items() if name != "shadow"},
}
PROPOSER_METHODS = ("prove-lossless", "prove", "sdd")
# rules with vLLM's draft-model proposer (or a MARS-drafted one, proposer=block)
RULE_METHODS = ("sd", "nsd", "topk", "typical", "lenience", "topk-delta", "threshold", "fly")
SKIPPING_METHODS = ("mars", "sdd-skip", "sdd-periodic")  # verifier skipping stays in our engine
SDD_ACCEPT = {"exact": ("sd", ()), "lenience": ("lenience", ("ell",)), "topk": ("topk", ("accept_k",)),
              "nucleus": ("nsd", ("theta",))}  # fmt: skip
AR_MODELS = ("target", "block", "draft")
# Stock vLLM peers (plugin disabled).
PEERS: dict[str, dict[str, Any]] = {"vllm-ar": {}, "vllm-sd": {"k": 4}}
# Optional parameters (not in the defaults, so existing rows keep their identity): the AR model of
# vllm-ar, and the drafter of the draft-model rules (``proposer=block``: MARS-drafted sd / nsd / ...
# against the target, block size = k).
PEER_OPTIONAL: dict[str, dict[str, Any]] = {
    "vllm-ar": {"model": "target"},
    # the seam that carries the block proposer: the verifier's own forward (prove-lossless, whose
    # verifier is the block model: .proposers.FusedBlockDrafter; min_confidence = its block cut),
    # vLLM's parallel drafting, or our proposer class with its own context cache (.BlockDrafter)
    "prove-lossless": {"seam": "fused", "min_confidence": None},
    "prove": {"seam": "parallel"},
    **{m: {"proposer": "draft"} for m in RULE_METHODS},
}
RULE_PROPOSERS = ("draft", "block")
# seam -> VLLMEngine proposer: vLLM's parallel drafting, our proposer class with its own cache,
# or the block model drafting inside its own verification forward (prove-lossless only)
BLOCK_SEAMS = {"parallel": "block", "own-cache": "block-cache", "fused": "block-fused"}
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
    if name in SKIPPING_METHODS:
        raise RelaxSpecError(
            f"{name!r} commits tokens without the verifier, which vLLM cannot (it runs the target on "
            "every step): use --engine relaxspec (docs/vllm-proposers.md)"
        )
    if name not in table:
        raise RelaxSpecError(
            f"method {name!r} does not run inside vLLM; vLLM rows: {', '.join([*METHODS, *PEERS])}"
        )
    known = {**table[name], **PEER_OPTIONAL.get(name, {})}
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise RelaxSpecError(
            f"{name!r} with --engine vllm has no parameter {', '.join(unknown)} "
            f"(parameters: {', '.join(known) or 'none'})"
        )
    out = {**table[name], **params}
    k = out.get("k", 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise RelaxSpecError(f"k of {name!r} must be an integer >= 1, got {k!r}")
    if out.get("proposer", "draft") not in RULE_PROPOSERS:
        raise RelaxSpecError(f"proposer of {name!r} must be draft or block, got {out['proposer']!r}")
    if "model" in out and out["model"] not in AR_MODELS:
        raise RelaxSpecError(f"model of {name!r} must be one of {', '.join(AR_MODELS)}, got {out['model']!r}")
    if name in PROPOSER_METHODS:
        engine_plan(name, out)  # validates
    elif name in METHODS and name != "ar":
        RuleChoice(canonical(name), {p: v for p, v in out.items() if p in PARAM_KEYS})
    return out


@dataclass(frozen=True)
class EnginePlan:
    """How a method runs inside vLLM: the engine (target, proposer, k, options) and the request rule."""

    rule: str
    rule_params: dict[str, Any]
    proposer: str  # draft | block | block-cache | diffusion (VLLMEngine proposers)
    k: int
    target_role: str = "target"
    proposer_role: str = "draft"
    # gamma, steps, reveal (diffusion); min_confidence (the fused block seam)
    options: dict[str, Any] = field(default_factory=dict)

    def request_rule(self) -> dict[str, Any]:
        return {"rule": self.rule, **self.rule_params}

    @property
    def drafter_positions(self) -> int:
        """Drafter positions per step (the ``draft_calls`` count): none on the fused seam, where
        the verifier's own forward drafts."""
        return 0 if self.proposer == "block-fused" else self.k

    def engine_key(self, paths: dict[str, Any]) -> tuple[Any, ...]:
        """Engines are shared by every plan that differs only in its rule (the rule is per request)."""
        return (
            self.proposer,
            self.k,
            str(paths.get(self.target_role)),
            str(paths.get(self.proposer_role)),
            json.dumps(self.options, sort_keys=True),
        )


def _int_param(p: dict[str, Any], name: str, upper: int = 64) -> int:
    value = p[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper:
        raise RelaxSpecError(f"{name} must be an integer in [1, {upper}], got {value!r}")
    return value


def drafter_gamma(path: str | Path | None = None) -> int:
    """The diffusion drafter's operating-point γ (config ``diffusion_gamma``, else its training block)."""
    config = json.loads((model_dir("diffusion", path, "vLLM") / "config.json").read_text())
    gamma = config.get("diffusion_gamma") or config.get("diffusion_block_length")
    if not isinstance(gamma, int) or gamma < 1:
        raise RelaxSpecError("the diffusion drafter's config has no diffusion_gamma; pass gamma")
    return gamma


def engine_plan(name: str, p: dict[str, Any], paths: dict[str, Any] | None = None) -> EnginePlan:
    """The :class:`EnginePlan` of a vLLM method row with resolved parameters ``p``."""
    paths = paths or {}
    if name in ("prove-lossless", "prove"):
        seam = p.get("seam", PEER_OPTIONAL[name]["seam"])
        if seam not in BLOCK_SEAMS:
            raise RelaxSpecError(f"seam must be one of {', '.join(BLOCK_SEAMS)}, got {seam!r}")
        size = _int_param(p, "block_size")
        if name == "prove-lossless":
            options = {}
            if p.get("min_confidence") is not None:
                if seam != "fused":
                    raise RelaxSpecError("min_confidence is an option of seam=fused")
                options["min_confidence"] = check_min_confidence(p["min_confidence"])
            return EnginePlan("sd", {}, BLOCK_SEAMS[seam], size, "block", "block", options)
        if seam == "fused":
            raise RelaxSpecError(
                "seam=fused drafts inside the verifier's own forward, so the verifier must be the block "
                "model: prove-lossless only (prove verifies with the small model)"
            )
        RuleChoice("gate", {"theta": p["theta"]})
        return EnginePlan("gate", {"theta": p["theta"]}, BLOCK_SEAMS[seam], size, "draft", "block")
    if name == "sdd":
        if p["accept"] not in SDD_ACCEPT:
            raise RelaxSpecError(f"accept must be one of {', '.join(SDD_ACCEPT)}, got {p['accept']!r}")
        rule, names = SDD_ACCEPT[p["accept"]]
        rule_params = {n: p[n] for n in names}
        RuleChoice(rule, rule_params)
        gamma = drafter_gamma(paths.get("diffusion")) if p["gamma"] is None else _int_param(p, "gamma")
        steps = p["steps"]
        if steps is not None:
            _int_param(p, "steps", gamma)
        if p["reveal"] not in ("auto", "confidence", "left_to_right"):
            raise RelaxSpecError(f"reveal must be auto, confidence or left_to_right, got {p['reveal']!r}")
        options = {"gamma": gamma, "steps": steps, "reveal": p["reveal"]}
        return EnginePlan(rule, rule_params, "diffusion", gamma, "target", "diffusion", options)
    if name in METHODS and name != "ar":
        rule_params = {x: v for x, v in p.items() if x in PARAM_KEYS}
        if p.get("proposer", "draft") == "block":  # MARS-drafted: parallel drafting against the target
            return EnginePlan(canonical(name), rule_params, "block", int(p["k"]), "target", "block")
        return EnginePlan(canonical(name), rule_params, "draft", int(p["k"]))
    raise RelaxSpecError(f"method {name!r} has no vLLM engine plan")


class EnginePool:
    """One vLLM engine per (kind, k, stock); created on first use, closed by :meth:`close`."""

    def __init__(
        self,
        target: str | Path | None = None,
        draft: str | Path | None = None,
        multiprocessing: bool = True,
        block: str | Path | None = None,
        diffusion: str | Path | None = None,
        **engine_kwargs: Any,
    ) -> None:
        self.target, self.draft = target, draft
        self.paths: dict[str, Any] = {"target": target, "draft": draft}
        self.paths.update(block=block, diffusion=diffusion)
        self.multiprocessing = multiprocessing
        self.engine_kwargs = engine_kwargs
        self.engines: dict[tuple[Any, ...], VLLMEngine] = {}

    def get(self, kind: str, k: int, stock: bool, model: str = "target") -> VLLMEngine:
        # AR has no acceptance step: the plugin changes nothing there, so ar and vllm-ar share one.
        key = (kind, k, stock) if kind != "ar" else ("ar", 0, True)
        if model != "target":
            key = (*key, model)
        if key not in self.engines:
            self.engines[key] = VLLMEngine(
                kind,
                target=model_dir(model, self.paths.get(model), "vLLM") if model != "target" else self.target,
                draft=self.draft,
                k=k,
                stock=key[2],
                multiprocessing=self.multiprocessing,
                **self.engine_kwargs,
            )
        return self.engines[key]

    def get_plan(self, plan: EnginePlan) -> VLLMEngine:
        """The engine of a method row (plugin on); shared by plans that differ only in their rule."""
        if plan.proposer == "draft" and plan.target_role == "target":
            return self.get(plan.rule, plan.k, False)
        key = ("plan", *plan.engine_key(self.paths))
        if key not in self.engines:
            self.engines[key] = VLLMEngine(
                plan.rule,
                target=model_dir(plan.target_role, self.paths.get(plan.target_role), "vLLM"),
                draft=model_dir(plan.proposer_role, self.paths.get(plan.proposer_role), "vLLM"),
                k=plan.k,
                proposer=plan.proposer,
                multiprocessing=self.multiprocessing,
                **plan.options,
                **self.engine_kwargs,
                **plan.rule_params,
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
        out["relaxed_per_pos"] = out["position_relaxed"] = plugin["relaxed_per_pos"]  # our engine's name too
    return out


def runner(name: str, params: dict[str, Any], sampling: Any, pool: EnginePool) -> Any:
    """A benchmark runner ``run(example, seed, max_new_tokens) -> record fields`` for a vLLM row.

    ``sampling``: :class:`relaxspec.core.sampling.SamplingParams` of the grid (temperature, top-k,
    top-p, budget). Methods get the plugin and their rule per request; peers are stock vLLM.
    """
    p = resolve(name, params)
    stock = is_peer(name)
    kind = {"vllm-ar": "ar", "vllm-sd": "sd"}.get(name, name)
    if stock or kind == "ar":
        k = int(p.get("k", 0)) if kind != "ar" else 0
        engine = pool.get(kind, k, stock, model=p.get("model", "target"))
        rule = None
    else:
        plan = engine_plan(name, p, pool.paths)
        k = plan.drafter_positions
        engine = pool.get_plan(plan)
        rule = plan.request_rule()

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
    paths: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One generation for ``relaxspec generate --engine vllm``: ``{"text", "tokens", "stats"}``.

    ``paths``: model directories by role (``block``, ``diffusion``, ...) for the ProVe / SDD rows.
    """
    paths = {"target": target, "draft": draft, **{r: v for r, v in (paths or {}).items() if v is not None}}
    if method in PROPOSER_METHODS or (params or {}).get("proposer", "draft") != "draft":
        given = dict(params or {}) if method in PROPOSER_METHODS else {"k": k, **(params or {})}
        p = resolve(method, given)
        plan = engine_plan(method, p, paths)
        engine = VLLMEngine(
            plan.rule,
            target=model_dir(plan.target_role, paths.get(plan.target_role), "vLLM"),
            draft=model_dir(plan.proposer_role, paths.get(plan.proposer_role), "vLLM"),
            k=plan.k,
            proposer=plan.proposer,
            seed=seed or 0,
            **plan.options,
            **plan.rule_params,
        )
        k = plan.drafter_positions
    else:
        p = resolve(method, {"k": k, **(params or {})} if method != "ar" else dict(params or {}))
        if method == "ar":
            p["k"] = 1
        rule_params = {x: v for x, v in p.items() if x in PARAM_KEYS}
        k = p.get("k", 1)
        engine = VLLMEngine(method, target=target, draft=draft, k=k, seed=seed or 0, **rule_params)
        k = p.get("k", 0) if method != "ar" else 0
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
    stats = generation_stats(result, k)
    stats.update({"method": method, "params": p, "temperature": temperature})
    return {"text": result.text, "tokens": result.tokens, "stats": stats}


def proposer_spec_args(
    method: str,
    params: dict[str, Any],
    paths: dict[str, Any],
    k_schedule: Sequence[tuple[int, int, int]] | None = None,
) -> tuple[Path, list[str], RuleChoice]:
    """The target directory, the speculative-decoding ``vllm serve`` arguments and the default rule
    of ``prove-lossless`` / ``prove`` / ``sdd`` (:func:`.serve.vllm_args` adds the rest);
    ``k_schedule``: vLLM's batch-size schedule of the draft length (custom proposers read it
    per step, :meth:`.proposers.OwnCacheDrafter.bind`).

    The block proposer's placeholder id cannot travel on vLLM's command line (a dict
    ``--hf-overrides`` stays with the target): the server sets the callable
    :func:`.proposers.mars_hf_overrides` on the parsed arguments (:func:`needs_mars_overrides`).
    """
    from relaxspec.integrations.vllm import proposers

    plan = engine_plan(method, resolve(method, params), paths)
    target = model_dir(plan.target_role, paths.get(plan.target_role), "serve --engine vllm")
    drafter = str(model_dir(plan.proposer_role, paths.get(plan.proposer_role), "serve --engine vllm"))
    o = plan.options
    spec, extra_config = proposers.speculative_settings(
        plan.proposer,
        drafter,
        plan.k,
        "probabilistic",
        o.get("gamma"),
        o.get("steps"),
        o.get("reveal", "auto"),
        o.get("min_confidence"),
    )
    proposers.add_k_schedule(spec, k_schedule)
    argv = [] if extra_config is None else ["--additional-config", json.dumps(extra_config)]
    argv += ["--speculative-config", json.dumps(spec)]
    return target, argv, RuleChoice(plan.rule, plan.rule_params)


def needs_mars_overrides(method: str) -> bool:
    return method in ("prove-lossless", "prove")


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
    if method in SKIPPING_METHODS:
        resolve(method, {})  # the clear error
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
            paths=paths,
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
