"""vLLM rows for ``relaxspec bench`` / ``generate`` / ``loadtest`` (``--engine vllm``; docs/design.md §6, §8).

Our methods through vLLM and the plugin (``ar``, ``sd``, ``nsd``, ``topk``, ``typical``,
``lenience``, …), on vLLM's draft-model proposer or on its model-free ``ngram`` / ``suffix``
proposers (``--set proposer=ngram``; :mod:`.lookup`, one-hot ``q``), ProVe and SDD with our
proposers inside vLLM (``prove-lossless``, ``prove``, ``sdd``; :mod:`.proposers`), and the stock
peers ``vllm-ar``, ``vllm-sd`` and (when named) ``vllm-ngram`` and ``vllm-eagle`` (plugin out). ``mars``,
``sdd-skip`` and ``sdd-periodic`` skip the verifier and stay in relaxspec's engine. Every rule at
one ``k`` shares one engine (the rule is a per-request argument), so a θ grid costs one engine; a
runner records the same counters as our engine (:class:`relaxspec.engine.stats.GenerationStats`
field names). Each row's parameters: docs/vllm.md, "The plugin, file by file".
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relaxspec.core.named_rules import RULES
from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.proposers.block import check_fused_block_size, check_min_confidence
from relaxspec.errors import RelaxSpecError, check_int
from relaxspec.integrations.vllm.lookup import check_prompt_lookup
from relaxspec.integrations.vllm.offline import VLLMEngine, VLLMEngineSettings, VLLMResult
from relaxspec.integrations.vllm.rules import RuleChoice
from relaxspec.methods import (
    LOOKUP_PROPOSERS,
    METHODS,
    PROMPT_LOOKUP_MAX,
    PROMPT_LOOKUP_MIN,
    SDD_ACCEPT,
    block_size_of,
    check_drafter,
    get_method,
)
from relaxspec.models import model_dir
from relaxspec.params import K, Param, Params, check_names, declare, defaults
from relaxspec.params import resolve as resolve_params

# Our methods that run inside vLLM: every preset that declares a vLLM row (methods/), in order.
VLLM_METHODS = tuple(name for name, spec in METHODS.items() if spec.vllm is not None)
PROPOSER_METHODS = tuple(n for n in VLLM_METHODS if METHODS[n].vllm.proposer in ("block", "diffusion"))
# rules with vLLM's draft-model proposer (or a MARS-drafted one, proposer=block)
RULE_METHODS = tuple(n for n in VLLM_METHODS if METHODS[n].vllm.proposer == "draft")
SKIPPING_METHODS = tuple(n for n, spec in METHODS.items() if spec.vllm is None)  # stay in our engine
AR_MODELS = ("target", "block", "draft")
# Stock vLLM peers (plugin disabled); ``model``: the AR model of vllm-ar (given only: rows keep
# their identity), e.g. ``--set vllm-ar.model=block`` beside ``prove-lossless``.
PEERS: dict[str, Mapping[str, Param]] = {
    "vllm-ar": declare(),
    "vllm-sd": declare(K),
    "vllm-ngram": declare(K),
    "vllm-eagle": declare(K),
}
PEER_EXTRAS = {
    "vllm-ar": declare(Param("model", str, "target", "the AR model's role", choices=AR_MODELS)),
    "vllm-ngram": declare(PROMPT_LOOKUP_MIN, PROMPT_LOOKUP_MAX),
}
# What ``bench --engine vllm`` runs beside the methods when --peers is not given (vllm-ngram: named)
DEFAULT_PEERS = ("vllm-ar", "vllm-sd")
# seam -> VLLMEngine proposer: vLLM's parallel drafting, our proposer class with its own cache,
# or the block model drafting inside its own verification forward (prove-lossless only)
BLOCK_SEAMS = {"parallel": "block", "own-cache": "block-cache", "fused": "block-fused"}
PEER_NEEDS: dict[str, tuple[str, ...]] = {
    "vllm-ar": ("target",),
    "vllm-sd": ("target", "draft"),
    "vllm-ngram": ("target",),
    "vllm-eagle": ("target", "eagle"),
}
PEER_SUMMARY = {
    "vllm-ar": "stock vLLM (relaxspec plugin disabled), autoregressive",
    "vllm-sd": "stock vLLM (relaxspec plugin disabled), draft-model speculative decoding, k drafts",
    "vllm-ngram": "stock vLLM (relaxspec plugin disabled), ngram (prompt lookup) speculative decoding",
    "vllm-eagle": "stock vLLM (relaxspec plugin disabled), EAGLE speculative decoding, eagle role",
}


def is_peer(name: str) -> bool:
    return name in PEERS


def row_params(name: str) -> tuple[Mapping[str, Param], Mapping[str, Param]]:
    """A vLLM row's (parameters with defaults, options present only when given): a method's are its
    preset's less the row's ``drops``, and the row's ``extras`` (methods/registry.py :class:`VllmRow`)."""
    if is_peer(name):
        return PEERS[name], PEER_EXTRAS.get(name, declare())
    if name in SKIPPING_METHODS:
        raise RelaxSpecError(
            f"{name!r} commits tokens without the verifier, which vLLM cannot (it runs the target on "
            "every step): use --engine relaxspec (docs/vllm-proposers.md)"
        )
    if name not in VLLM_METHODS:
        raise RelaxSpecError(
            f"method {name!r} does not run inside vLLM; vLLM rows: {', '.join([*VLLM_METHODS, *PEERS])}"
        )
    spec = get_method(name)
    row = spec.vllm
    assert row is not None
    own = declare(*(p for n, p in spec.params.items() if n not in row.drops))
    return own, row.extras


def row_names(name: str) -> list[str]:
    """Every parameter and option a vLLM row takes (what ``--set`` may give it)."""
    own, extras = row_params(name)
    return [*own, *extras]


def row_defaults(name: str) -> dict[str, Any]:
    """A vLLM row's parameter names and defaults (what ``--set`` may sweep)."""
    return defaults(row_params(name)[0])


def resolve(name: str, params: Mapping[str, Any]) -> Params:
    """Validated parameters of a vLLM row (unknown method / parameter / value: clear error).

    A method's own parameters are checked by its preset (:meth:`MethodSpec.resolve`, the same
    checks as on our engine); the row's options by their :class:`Param` and :func:`engine_plan`.
    """
    own, extras = row_params(name)
    check_names(f"{name!r} with --engine vllm", params, [*own, *extras])
    options = resolve_params(name, extras, {n: v for n, v in params.items() if n in extras})
    given = {n: v for n, v in params.items() if n in own}
    if is_peer(name):
        base = resolve_params(name, own, given)
    else:
        spec = get_method(name)
        engine = spec.resolve({n: v for n, v in given.items() if n in spec.params})
        base = Params({n: engine[n] for n in own})
    out = Params({**base, **{n: options[n] for n in params if n in extras}})
    if name not in ("ar", "vllm-ar"):
        row_plan(name, out)  # validates the row's options
    return out


@dataclass(frozen=True)
class EnginePlan:
    """How a method runs inside vLLM: the engine (target, proposer, k, options) and the request rule."""

    rule: str
    rule_params: dict[str, Any]
    # draft | block | block-cache | block-fused | diffusion | ngram | suffix (VLLMEngine proposers)
    proposer: str
    k: int
    target_role: str = "target"
    proposer_role: str | None = "draft"  # None: a model-free proposer (ngram, suffix)
    # gamma, steps, reveal (diffusion); min_confidence (the fused block seam);
    # prompt_lookup_min / _max (ngram)
    options: dict[str, Any] = field(default_factory=dict)
    stock: bool = False  # vLLM without the plugin (the vllm-* peers)

    @property
    def choice(self) -> RuleChoice:
        """The rule every request of this row asks for."""
        return RuleChoice(self.rule, self.rule_params)

    def request_rule(self) -> dict[str, Any]:
        return self.choice.to_extra_args()

    @property
    def drafter_positions(self) -> int:
        """Drafter positions per step (the ``draft_calls`` count): none on the fused seam, where
        the verifier's own forward drafts, nor for a model-free proposer (ngram, suffix)."""
        return 0 if self.proposer in ("block-fused", *LOOKUP_PROPOSERS) else self.k

    def engine_key(self, paths: dict[str, Any]) -> tuple[Any, ...]:
        """Engines are shared by every plan that differs only in its rule (the rule is per request)."""
        return (
            self.proposer,
            self.k,
            str(paths.get(self.target_role)),
            str(paths.get(self.proposer_role)) if self.proposer_role else None,
            json.dumps(self.options, sort_keys=True),
        )


def drafter_gamma(path: str | Path | None = None) -> int:
    """The diffusion drafter's operating-point γ (config ``diffusion_gamma``, else its training block)."""
    config = json.loads((model_dir("diffusion", path, "vLLM") / "config.json").read_text())
    gamma = config.get("diffusion_gamma") or config.get("diffusion_block_length")
    if not isinstance(gamma, int) or gamma < 1:
        raise RelaxSpecError("the diffusion drafter's config has no diffusion_gamma; pass gamma")
    return gamma


def _rule_params(rule: str, p: Mapping[str, Any]) -> dict[str, Any]:
    return {n: p[n] for n in RULES[rule].params}


def _block_plan(name: str, p: Mapping[str, Any]) -> EnginePlan:
    """prove-lossless (the block model verifies itself) or prove (a small verifier, ``Gate(θ)``)."""
    seam = p.get("seam", get_method(name).vllm.extras["seam"].default)
    size = block_size_of(p)
    if name == "prove-lossless":
        options = {}
        if seam == "fused":
            check_fused_block_size(size)
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
    return EnginePlan("gate", _rule_params("gate", p), BLOCK_SEAMS[seam], size, "draft", "block")


def _diffusion_plan(p: Mapping[str, Any], paths: Mapping[str, Any]) -> EnginePlan:
    rule = SDD_ACCEPT[p["accept"]]
    gamma = drafter_gamma(paths.get("diffusion")) if p["gamma"] is None else p["gamma"]
    if p["steps"] is not None:
        check_int("steps", p["steps"], 1, gamma)
    options = {"gamma": gamma, "steps": p["steps"], "reveal": p["reveal"]}
    return EnginePlan(rule, _rule_params(rule, p), "diffusion", gamma, "target", "diffusion", options)


def engine_plan(name: str, p: Mapping[str, Any], paths: Mapping[str, Any] | None = None) -> EnginePlan:
    """The :class:`EnginePlan` of a vLLM method row with resolved parameters ``p``: what its
    preset's :class:`~relaxspec.methods.VllmRow` says."""
    spec = get_method(name)
    row = spec.vllm
    if row is None or row.proposer == "ar":
        raise RelaxSpecError(f"method {name!r} has no vLLM engine plan")
    if row.proposer == "block":
        return _block_plan(name, p)
    if row.proposer == "diffusion":
        return _diffusion_plan(p, paths or {})
    assert spec.rule is not None
    rule_params = _rule_params(spec.rule.name, p)
    proposer = p.get("proposer", "draft")
    drafter = check_drafter(p.get("drafter", "draft"), proposer)
    lookup = _lookup_options(proposer, p)
    if proposer == "block":  # MARS-drafted: parallel drafting against the target
        return EnginePlan(spec.rule.name, rule_params, "block", p["k"], "target", "block")
    if proposer in LOOKUP_PROPOSERS:  # vLLM's model-free proposers: q one-hot at the draft
        return EnginePlan(spec.rule.name, rule_params, proposer, p["k"], "target", None, lookup)
    return EnginePlan(spec.rule.name, rule_params, "draft", p["k"], "target", drafter)


def _lookup_options(proposer: str, p: Mapping[str, Any]) -> dict[str, Any]:
    """The ngram proposer's n-gram window (both keys, None where not given), checked: min ≤ max,
    and no window for another proposer (:func:`.lookup.check_prompt_lookup`)."""
    lo, hi = check_prompt_lookup(proposer, p.get("prompt_lookup_min"), p.get("prompt_lookup_max"))
    return {"prompt_lookup_min": lo, "prompt_lookup_max": hi} if proposer == "ngram" else {}


def row_plan(name: str, p: Mapping[str, Any], paths: Mapping[str, Any] | None = None) -> EnginePlan:
    """The plan of any vLLM row: a method's (:func:`engine_plan`), ``ar`` (the target, no drafts)
    or a stock peer (``stock=True``: the plugin out)."""
    if name in ("ar", "vllm-ar"):  # AR has no acceptance step: the plugin changes nothing there
        return EnginePlan("ar", {}, "draft", 0, p.get("model", "target"), stock=True)
    if name == "vllm-sd":
        return EnginePlan("sd", {}, "draft", p["k"], stock=True)
    if name == "vllm-ngram":
        return EnginePlan("sd", {}, "ngram", p["k"], "target", None, _lookup_options("ngram", p), stock=True)
    if name == "vllm-eagle":
        return EnginePlan("sd", {}, "draft", p["k"], "target", "eagle", stock=True)
    return engine_plan(name, p, paths)


def engine_settings(plan: EnginePlan, paths: Mapping[str, Any], **runtime: Any) -> VLLMEngineSettings:
    """The :class:`VLLMEngineSettings` of a plan: models by role from ``paths`` (None: the bundled
    ones); ``runtime``: ``seed``, ``multiprocessing``, ``max_model_len``, ..."""
    where = "vLLM"
    target = model_dir(plan.target_role, paths.get(plan.target_role), where)
    if plan.rule == "ar":
        return VLLMEngineSettings("ar", target=target, stock=plan.stock, **runtime)
    role = plan.proposer_role
    return VLLMEngineSettings(
        plan.rule,
        plan.rule_params,
        target=target,
        draft=model_dir(role, paths.get(role), where) if role else None,
        k=plan.k,
        proposer=plan.proposer,
        stock=plan.stock,
        **plan.options,
        **runtime,
    )


def start_engine(plan: EnginePlan, paths: Mapping[str, Any], **runtime: Any) -> VLLMEngine:
    """The one place a :class:`VLLMEngine` is built from a plan (:func:`engine_settings`)."""
    return VLLMEngine(engine_settings(plan, paths, **runtime))


# vLLM's workers keep polling their shared-memory queue for 1 s after their last read
# (vllm/distributed/device_communicators/shm_broadcast.py, SpinCondition.busy_loop_s), ~1.5 cores.
POLL_SECONDS = 1.2


class EnginePool:
    """One vLLM engine per plan (less its rule: the rule is per request); created on first use,
    closed by :meth:`close`. ``last_run``: when a runner's generation last ended (:meth:`settle`)."""

    def __init__(
        self,
        target: str | Path | None = None,
        draft: str | Path | None = None,
        multiprocessing: bool = True,
        block: str | Path | None = None,
        diffusion: str | Path | None = None,
        **engine_kwargs: Any,
    ) -> None:
        self.paths: dict[str, Any] = {
            "target": target,
            "draft": draft,
            "block": block,
            "diffusion": diffusion,
        }
        self.runtime = {"multiprocessing": multiprocessing, **engine_kwargs}
        self.engines: dict[tuple[Any, ...], VLLMEngine] = {}
        self.last_run: float | None = None

    def get_plan(self, plan: EnginePlan) -> VLLMEngine:
        """The engine of a row; shared by plans that differ only in their rule."""
        key = (plan.stock, *plan.engine_key(self.paths)) if plan.rule != "ar" else ("ar", plan.target_role)
        if key not in self.engines:
            self.engines[key] = start_engine(plan, self.paths, **self.runtime)
        return self.engines[key]

    def settle(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """Wait out the engines' idle polling (:data:`POLL_SECONDS` after the last generation), so
        that what runs next (a bench timing another engine) has the CPUs vLLM leaves idle."""
        if self.last_run is not None:
            wait = self.last_run + POLL_SECONDS - time.monotonic()
            if wait > 0:
                sleep(wait)

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
    plan = row_plan(name, resolve(name, params), pool.paths)
    engine = pool.get_plan(plan)
    k = plan.drafter_positions
    rule = plan.request_rule() if not plan.stock and plan.rule != "ar" else None

    def run(ex: Any, seed: int, max_new_tokens: int | None = None) -> dict[str, Any]:
        try:
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
        finally:
            pool.last_run = time.monotonic()
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
    sampling: SamplingParams | None = None,
    *,
    params: dict[str, Any] | None = None,
    paths: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One generation for ``relaxspec generate --engine vllm``: ``{"text", "tokens", "stats"}``.

    ``sampling``: temperature, top-k, top-p, seed, budget and stop strings (None: greedy, 128
    tokens); ``paths``: model directories by role (``target``, ``draft``, ``block``, ``diffusion``).
    """
    sampling = sampling or SamplingParams(temperature=0.0)
    p = resolve(method, params or {})
    plan = row_plan(method, p, paths or {})
    engine = start_engine(plan, paths or {}, seed=sampling.seed or 0)
    try:
        result = engine.generate(
            prompt,
            temperature=sampling.temperature,
            max_new_tokens=sampling.max_new_tokens,
            seed=sampling.seed,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            stop=sampling.stop,
        )[0]
    finally:
        engine.close()
    stats = generation_stats(result, plan.drafter_positions)
    stats.update({"method": method, "params": p, "temperature": sampling.temperature})
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
    kind = {"vllm-ar": "ar", "vllm-sd": "sd", "vllm-ngram": "sd", "vllm-eagle": "sd"}.get(method, method)
    command = [sys.executable, "-m", "relaxspec.integrations.vllm.serve", "--method", kind]
    if stock:
        command.append("--stock")
    if method == "vllm-ngram":
        command += ["--proposer", "ngram"]
    if method == "vllm-eagle":
        command += ["--drafter", "eagle"]
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
    sampling: SamplingParams,
    as_json: bool,
) -> None:
    """``relaxspec generate --engine vllm``: one JSON object on stdout (``--json``) or the text."""
    import json
    import os
    import sys

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    with stdout_to_stderr():
        out = generate_json(method, prompt, sampling, params=params, paths=paths)
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
