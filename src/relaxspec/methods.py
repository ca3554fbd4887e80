"""Named method presets (docs/design.md §4): a method is a (proposer, verifier, rule, scheduler) combination.

``build_engine("nsd", target, draft, theta=0.9, k=8)`` returns a ready :class:`Engine`. Each
preset declares the models it needs and its parameters with defaults, so unknown names and bad
values fail with one clear message, and the CLI, the benchmark and the server all build engines
through this one function. Users who want another combination build an :class:`Engine` from the
parts directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relaxspec.core.acceptance import Exact, Gate, Greedy, Lenience, Nucleus, Rule, TopK, Typical, nsd_rule
from relaxspec.core.peer_rules import FLy, Threshold, TopKDelta
from relaxspec.engine import Engine
from relaxspec.engine.packed import KERNELS
from relaxspec.engine.packed import attach as attach_kernels
from relaxspec.engine.proposers.block import (
    DEFAULT_MIN_CONFIDENCE,
    BlockProposer,
    FusedBlockProposer,
    check_fused_block_size,
    check_min_confidence,
    mask_token_id_of,
    trained_block_size,
)
from relaxspec.engine.proposers.diffusion import REVEAL_ORDERS, DiffusionProposer, load_diffusion
from relaxspec.engine.proposers.draft_model import DraftModel
from relaxspec.engine.proposers.eagle import EagleProposer, LoadedEagle, is_eagle_dir, load_eagle
from relaxspec.engine.schedulers import ConfidenceSkip, Periodic, RawConfidence, Scheduler, Signal, Strict
from relaxspec.engine.survival import ConditionalSurvival, MarginalSurvival, SurvivalPredictor
from relaxspec.errors import RelaxSpecError
from relaxspec.models import LoadedModel, check_compatible, check_same_tokenizer, load_model, model_dir

MODEL_ROLES = ("target", "draft", "block", "diffusion", "survival")


@dataclass
class ModelSet:
    """The models a method may use, by role; ``require`` gives a clear error for a missing one."""

    target: LoadedModel | None = None
    draft: LoadedModel | None = None
    block: LoadedModel | None = None
    diffusion: Any = None
    survival: Any = None

    def require(self, role: str, method: str) -> Any:
        model = getattr(self, role)
        if model is None:
            raise RelaxSpecError(f"method {method!r} needs a {role} model")
        return model


@dataclass(frozen=True)
class MethodSpec:
    """A preset: the models it needs, its parameters (name -> default), and its builder.

    ``optional`` roles are loaded when a path is given or a bundled model exists, and left None
    otherwise (the builder raises a clear error if the chosen parameters need them).
    """

    name: str
    summary: str
    needs: tuple[str, ...]
    params: dict[str, Any]
    build: Callable[[ModelSet, dict[str, Any]], Engine]
    validate: Callable[[dict[str, Any]], None] = field(default=lambda p: None)
    optional: tuple[str, ...] = ()


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add a preset to the registry (users may register their own combinations too)."""
    METHODS[spec.name] = spec
    return spec


# Upper bounds of the method parameters (docs/design.md §7), checked by :func:`resolve_params` for the CLI,
# the benchmark and the server alike. They bound the work of one decoding cycle, so that one request
# can neither stall a batch for long nor hold its slot long after a cancel:
MAX_DRAFT_TOKENS = 64  # k, gamma, block_size, k_min, skip_k: tokens drafted (and verified) per cycle
MAX_DRAFT_WORK = 1024  # gamma x steps: drafter token positions computed per cycle (sdd*)
MAX_COUNT = 1 << 20  # counters and ranks: accept_k, period, s_max
MAX_STRING = 64  # characters of a string parameter (reveal, accept, signal)
_MAX_INT = 1 << 31  # any integer parameter, before its own bound


def _check_k(
    params: dict[str, Any], name: str = "k", what: str = "draft length", upper: int = MAX_DRAFT_TOKENS
) -> None:
    k = params.get(name)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= upper:
        raise RelaxSpecError(f"{name} ({what}) must be an integer in [1, {upper}], got {_show(k)}")


def _check_count(params: dict[str, Any], name: str, upper: int = MAX_COUNT) -> None:
    k = params.get(name)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= upper:
        raise RelaxSpecError(f"{name} must be an integer in [1, {upper}], got {_show(k)}")


def _show(value: Any) -> str:
    """A short ``repr`` of a user-given value for an error message."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return "a very large integer"
    text = ascii(value)  # never unencodable text (lone surrogates) in a message
    return text if len(text) <= 40 else text[:37] + "..."


def _check_scalar(method: str, name: str, value: Any) -> None:
    """A parameter value is a JSON scalar of sane size: a bool, None, an integer below 2^31, a finite
    float or a short string (what the CLI's ``--set`` and the server's JSON can carry)."""
    ok = (
        value is None
        or isinstance(value, bool)
        or (isinstance(value, int) and abs(value) < _MAX_INT)
        or (isinstance(value, float) and math.isfinite(value))
        or (isinstance(value, str) and len(value) <= MAX_STRING and value.isprintable())
    )
    if not ok:
        raise RelaxSpecError(
            f"method {method!r}: parameter {_show(name)} must be a number (integers below 2^31, floats "
            f"finite), a string of at most {MAX_STRING} printable characters, true/false or null; "
            f"got {_show(value)}"
        )


def draft_proposer(target: LoadedModel, draft: LoadedModel | LoadedEagle) -> DraftModel | EagleProposer:
    """What ``--draft`` proposes with: a draft model, or an EAGLE head drafting from the target's
    hidden states (checked against the target it was trained for)."""
    if isinstance(draft, LoadedEagle):
        return EagleProposer(draft.head, target.model, draft.target)
    check_compatible(target.model, draft.model, "draft")
    check_same_tokenizer(target.tokenizer, draft.tokenizer, "draft")
    return DraftModel(draft.model)


def draft_model_method(
    name: str,
    summary: str,
    params: dict[str, Any],
    rules: Callable[[dict[str, Any]], tuple[Rule | None, Rule | None]],
) -> MethodSpec:
    """A classic SD-style preset: DraftModel proposer, target verifier, (sampling, greedy) rules."""

    def validate(p: dict[str, Any]) -> None:
        _check_k(p)
        if "accept_k" in p:
            _check_count(p, "accept_k")
        rules(p)  # constructing the rules validates θ, ℓ, ε, δ, ...

    def build(models: ModelSet, p: dict[str, Any]) -> Engine:
        target, draft = models.require("target", name), models.require("draft", name)
        rule, greedy_rule = rules(p)
        return Engine(
            target.model,
            target.tokenizer,
            proposer=draft_proposer(target, draft),
            rule=rule,
            greedy_rule=greedy_rule,
            k=p["k"],
        )

    return MethodSpec(name, summary, ("target", "draft"), {"k": 8, **params}, build, validate)


register(
    MethodSpec(
        "ar",
        "autoregressive decoding with the target (the baseline)",
        ("target",),
        {},
        lambda models, p: Engine(
            models.require("target", "ar").model, models.require("target", "ar").tokenizer
        ),
    )
)
register(
    draft_model_method(
        "sd",
        "speculative decoding, exact (Leviathan/Chen); greedy: argmax match",
        {},
        lambda p: (Exact(), Greedy()),
    )
)
register(
    draft_model_method(
        "nsd",
        "Nucleus Speculative Decoding: also accept drafts in the target's θ-nucleus",
        {"theta": None},  # None: the regime's default θ (core.acceptance.NSD_DEFAULT_THETA)
        lambda p: (nsd_rule(p["theta"], greedy=False), nsd_rule(p["theta"], greedy=True)),
    )
)
register(
    draft_model_method(
        "topk",
        "also accept drafts among the target's top accept_k tokens",
        {"accept_k": 2},
        lambda p: (TopK(p["accept_k"]), TopK(p["accept_k"], greedy=True)),
    )
)
register(
    draft_model_method(
        "typical",
        "typical acceptance (Medusa): also accept p(x) ≥ min(ε, δ·exp(−H(p)))",
        {"epsilon": 0.09, "delta": 0.3},
        lambda p: (Typical(p["epsilon"], p["delta"]), Typical(p["epsilon"], p["delta"], greedy=True)),
    )
)
register(
    draft_model_method(
        "lenience",
        "lenient acceptance min(1, p/(ℓq)); sampling only",
        {"ell": 0.5},
        lambda p: (Lenience(p["ell"]), None),
    )
)

# --- The other engines' relaxed rules (core/peer_rules.py; issue 31) ------------------------------
# Their defaults are moderate relaxations to start a sweep from (relaxspec bench --set), not tuned.

register(
    draft_model_method(
        "topk-delta",
        "TensorRT-LLM relaxed acceptance: also accept drafts in the target's top_n within delta of its top p",
        {"top_n": 3, "delta": 0.1},
        lambda p: (TopKDelta(p["top_n"], p["delta"]), TopKDelta(p["top_n"], p["delta"], greedy=True)),
    )
)
register(
    draft_model_method(
        "threshold",
        "SGLang accept thresholds: accept if p ≥ single, else with probability min(1, p/(acc·q))",
        {"single": 0.5, "acc": 1.0},
        lambda p: (Threshold(p["single"], p["acc"]), Threshold(p["single"], p["acc"], greedy=True)),
    )
)


def _fly_rules(p: dict[str, Any]) -> tuple[Rule, Rule]:
    """FLy's (sampling, greedy) rules; a window that reaches past the draft block defers nothing
    (``window`` None: ``min(6, K − 1)`` per cycle, vLLM's default)."""
    if p["k"] == 1:
        raise RelaxSpecError("fly needs k ≥ 2: it defers a rejection on the evidence of later drafts")
    if _is_int(p["window"]) and _is_int(p["k"]) and p["window"] >= p["k"]:
        raise RelaxSpecError(
            f"window ({p['window']}) must be smaller than k ({p['k']}): FLy defers a rejection only "
            "when the whole window of later drafts lies inside the block"
        )
    args = (p["window"], p["entropy_threshold"], p["entropy_top_k"])
    return FLy(*args), FLy(*args, greedy=True)


register(
    draft_model_method(
        "fly",
        "FLy: keep a rejected draft at a high-entropy position if the next window drafts are accepted",
        {"window": None, "entropy_threshold": 0.3, "entropy_top_k": 3},
        _fly_rules,
    )
)


# --- ProVe family (ProVe paper; docs/design.md §4): a MARS block proposer with three ways to commit ---------


# Our operating point from the block-size sweep on the bundled models (docs/results.md): τ is
# already 5.5 at B = 8 and barely grows beyond (6.1 at 16-32), while every placeholder position
# costs compute in the proposer's forward on a CPU, so B = 8 is fastest (prove-lossless 1.58×
# vs 1.47× at 16 and 1.13× at 32). The ProVe paper uses 16 on GPUs, where a wider forward is
# nearly free. The bundled proposer is trained with 32 so the whole sweep stays in range.
DEFAULT_BLOCK_SIZE = 8


def _block_size(models: ModelSet, method: str, p: dict[str, Any]) -> tuple[LoadedModel, int]:
    """The block model and the block size; ``block_size`` None = 8, capped at the trained size."""
    block = models.require("block", method)
    trained = trained_block_size(block.model)
    return block, p["block_size"] if p["block_size"] is not None else min(DEFAULT_BLOCK_SIZE, trained)


def _block_proposer(models: ModelSet, method: str, p: dict[str, Any]) -> tuple[LoadedModel, BlockProposer]:
    """The block model and its proposer (:func:`_block_size`)."""
    block, size = _block_size(models, method, p)
    return block, BlockProposer.from_pretrained(block.model, block.tokenizer, size)


def _check_block_size(p: dict[str, Any]) -> None:
    if p["block_size"] is not None:
        _check_k(p, "block_size", "tokens per block proposal, at most the trained size; default 8")


def _validate_mars(p: dict[str, Any]) -> None:
    _check_block_size(p)
    ConfidenceSkip(p["tau"], commit_first=True)


def _build_mars(models: ModelSet, p: dict[str, Any]) -> Engine:
    block, proposer = _block_proposer(models, "mars", p)
    # No verifier: the commit-first scheduler commits >= 1 token every cycle, so the rules are
    # never consulted (the engine only verifies the last token of a length budget).
    return Engine(
        block.model,
        block.tokenizer,
        proposer=proposer,
        rule=Exact(),
        greedy_rule=Greedy(),
        scheduler=ConfidenceSkip(p["tau"], commit_first=True),
        k=proposer.block_size,
    )


def _validate_prove(p: dict[str, Any]) -> None:
    _check_block_size(p)
    Gate(p["theta"])


def _build_prove(models: ModelSet, p: dict[str, Any]) -> Engine:
    verifier = models.require("draft", "prove")
    if isinstance(verifier, LoadedEagle):
        raise RelaxSpecError(
            f"prove verifies with a small causal LM (--draft), but {verifier.path} is an EAGLE head; "
            "pass a causal LM directory"
        )
    block, proposer = _block_proposer(models, "prove", p)
    check_compatible(verifier.model, block.model, "block proposer")
    check_same_tokenizer(verifier.tokenizer, block.tokenizer, "block proposer")
    gate = Gate(p["theta"])
    return Engine(
        verifier.model, block.tokenizer, proposer=proposer, rule=gate, greedy_rule=gate, k=proposer.block_size
    )


def _validate_prove_lossless(p: dict[str, Any]) -> None:
    _check_block_size(p)
    if not isinstance(p["fused"], bool):
        raise RelaxSpecError(f"fused must be true or false, got {p['fused']!r}")
    check_min_confidence(p["min_confidence"])
    if p["fused"] and p["block_size"] is not None:
        check_fused_block_size(p["block_size"])


def _build_prove_lossless(models: ModelSet, p: dict[str, Any]) -> Engine:
    proposer: BlockProposer | FusedBlockProposer
    if p["fused"]:  # the block model drafts inside its own verification forward
        block, size = _block_size(models, "prove-lossless", p)
        mask_id = mask_token_id_of(block.tokenizer, "the block proposer's tokenizer")
        proposer = FusedBlockProposer(block.model, size, mask_id, p["min_confidence"])
    else:
        block, proposer = _block_proposer(models, "prove-lossless", p)
    return Engine(
        block.model,
        block.tokenizer,
        proposer=proposer,
        rule=Exact(),
        greedy_rule=Greedy(),
        k=proposer.block_size,
    )


register(
    MethodSpec(
        "mars",
        "MARS: block proposer, commit the first token then left to right while confidence ≥ tau; no verifier",
        ("block",),
        {"block_size": None, "tau": 0.9},
        _build_mars,
        _validate_mars,
    )
)
register(
    MethodSpec(
        "prove",
        "ProVe: block proposal read by a small verifier (draft); commit while conf·p_V ≥ theta",
        ("block", "draft"),
        {"block_size": None, "theta": 0.05},
        _build_prove,
        _validate_prove,
    )
)
register(
    MethodSpec(
        "prove-lossless",
        "ProVe-lossless: the block proposer verifies itself in AR mode (greedy = AR; sampling exact); "
        "fused: it drafts the next block inside that verification forward",
        ("block",),
        {"block_size": None, "fused": True, "min_confidence": DEFAULT_MIN_CONFIDENCE},
        _build_prove_lossless,
        _validate_prove_lossless,
    )
)

# --- Speculative diffusion decoding (VS paper; docs/design.md §4): sdd, sdd-skip, sdd-periodic -------------
#
# All three draft with a DiffusionProposer (γ-token blocks in S denoising steps) and verify with
# the target. ``accept`` picks the rule of ``sdd``: exact (lossless; greedy = argmax match),
# lenience (ℓ), topk (accept_k) or nucleus (θ) — the VS paper's lenience and top-k baselines.
# ``sdd-skip`` adds ConfidenceSkip: commit the longest prefix passing the local gate
# min_{j≤k} conf_j ≥ τ and the signal's prefix gate (raw, marginal or conditional survival), only
# with ≥ k_min tokens and an unverified run < s_max (paper defaults γ = 32, k_min = 6, s_max = 64).
# ``sdd-periodic`` attempts a skip_k-token skip every period rounds (baseline). ``shadow=True``
# audits skipped rounds with the target (excluded from timing and call counts). γ and S default
# to the drafter's bundled operating point (``relaxspec train diffusion-sweep``).

ACCEPT_RULES = ("exact", "lenience", "topk", "nucleus")
SIGNALS = ("raw", "marginal", "conditional")

BASE_PARAMS: dict[str, Any] = {
    "gamma": None,  # None: the drafter's operating point
    "steps": None,
    "reveal": "auto",
    "accept": "exact",
    "ell": 0.5,
    "accept_k": 2,
    "theta": 0.95,
    "shadow": False,
}
SKIP_PARAMS: dict[str, Any] = {
    "signal": "raw",
    "tau": 0.9,
    "signal_tau": None,
    "k_min": 6,
    "s_max": 64,
}
PERIODIC_PARAMS: dict[str, Any] = {"period": 4, "skip_k": 6}


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def sdd_rules(p: dict[str, Any]) -> tuple[Rule, Rule]:
    """(sampling rule, greedy rule) for ``accept``; constructing them validates ℓ, k, θ."""
    accept = p["accept"]
    if accept == "exact":
        return Exact(), Greedy()
    if accept == "lenience":
        return Lenience(p["ell"]), Lenience(p["ell"], greedy=True)
    if accept == "topk":
        return TopK(p["accept_k"]), TopK(p["accept_k"], greedy=True)
    if accept == "nucleus":
        return Nucleus(p["theta"]), Nucleus(p["theta"], greedy=True)
    raise RelaxSpecError(f"accept must be one of {', '.join(ACCEPT_RULES)}, got {accept!r}")


def _validate_base(p: dict[str, Any]) -> None:
    gamma, steps = p["gamma"], p["steps"]
    if gamma is not None:
        _check_k(p, "gamma", "diffusion block length")
    if steps is not None:
        _check_k(p, "steps", "denoising steps, at most gamma", gamma or MAX_DRAFT_TOKENS)
    if gamma is not None and steps is not None:
        check_draft_work(gamma, steps)
    if p["accept"] == "topk":
        _check_count(p, "accept_k")
    if p["reveal"] not in REVEAL_ORDERS:
        raise RelaxSpecError(f"reveal must be one of {', '.join(REVEAL_ORDERS)}, got {p['reveal']!r}")
    if not isinstance(p["shadow"], bool):
        raise RelaxSpecError(f"shadow must be true or false, got {p['shadow']!r}")
    sdd_rules(p)


def check_draft_work(gamma: int, steps: int) -> None:
    """A diffusion draft computes gamma positions at each of its steps; bound the product."""
    if gamma * steps > MAX_DRAFT_WORK:
        raise RelaxSpecError(
            f"gamma x steps = {gamma} x {steps} = {gamma * steps} drafter positions per cycle exceeds "
            f"the limit of {MAX_DRAFT_WORK}; use fewer denoising steps or a shorter block"
        )


def _check_k_min(k_min: Any, gamma: int | None) -> None:
    if gamma is not None and _is_int(k_min) and k_min > gamma:
        raise RelaxSpecError(f"k_min ({k_min}) cannot exceed gamma ({gamma}): no skip could ever qualify")


def _validate_skip(p: dict[str, Any]) -> None:
    _validate_base(p)
    if p["signal"] not in SIGNALS:
        raise RelaxSpecError(f"signal must be one of {', '.join(SIGNALS)}, got {p['signal']!r}")
    _check_k_min(p["k_min"], p["gamma"])
    if not _is_int(p["k_min"]) or not 0 <= p["k_min"] <= MAX_DRAFT_TOKENS:
        raise RelaxSpecError(f"k_min must be an integer in [0, {MAX_DRAFT_TOKENS}], got {_show(p['k_min'])}")
    if not _is_int(p["s_max"]) or not 0 <= p["s_max"] <= MAX_COUNT:
        raise RelaxSpecError(f"s_max must be an integer in [0, {MAX_COUNT}], got {_show(p['s_max'])}")
    for name in ("tau", "signal_tau"):
        value = p[name]
        if value is None and name == "signal_tau":
            continue
        if not (_is_real(value) and 0 <= value <= 1):
            raise RelaxSpecError(f"{name} must be a number in [0, 1], got {_show(value)}")
    ConfidenceSkip(p["tau"], k_min=p["k_min"], s_max=p["s_max"], signal_tau=p["signal_tau"])


def _validate_periodic(p: dict[str, Any]) -> None:
    _validate_base(p)
    if p["gamma"] is not None and _is_int(p["skip_k"]) and p["skip_k"] > p["gamma"]:
        raise RelaxSpecError(f"skip_k ({p['skip_k']}) cannot exceed gamma ({p['gamma']})")
    _check_count(p, "period")
    _check_count(p, "skip_k", MAX_DRAFT_TOKENS)
    Periodic(p["period"], p["skip_k"])


def make_signal(name: str, survival: SurvivalPredictor | None, method: str = "sdd-skip") -> Signal:
    """The prefix-gate signal ``name``; learned signals need a trained survival predictor."""
    if name == "raw":
        return RawConfidence()
    if survival is None:
        raise RelaxSpecError(
            f"signal {name!r} of method {method!r} needs a trained survival predictor: run "
            "`relaxspec train survival` or pass --survival DIR"
        )
    return MarginalSurvival(survival) if name == "marginal" else ConditionalSurvival(survival)


def build_sdd(models: ModelSet, p: dict[str, Any], scheduler: Scheduler, method: str = "sdd") -> Engine:
    """An SDD engine: diffusion proposer, target verifier, ``accept`` rules, ``scheduler``."""
    target, diffusion = models.require("target", method), models.require("diffusion", method)
    check_compatible(target.model, diffusion.model, "diffusion drafter")
    check_same_tokenizer(target.tokenizer, diffusion.tokenizer, "diffusion drafter")
    proposer = DiffusionProposer(diffusion.model, p["gamma"], p["steps"], p["reveal"])
    check_draft_work(proposer.gamma, proposer.steps)  # also for the drafter's default operating point
    rule, greedy_rule = sdd_rules(p)
    return Engine(
        target.model,
        target.tokenizer,
        proposer=proposer,
        rule=rule,
        greedy_rule=greedy_rule,
        scheduler=scheduler,
        k=proposer.gamma,
        shadow=target.model if p["shadow"] else None,
    )


def _build_skip(models: ModelSet, p: dict[str, Any]) -> Engine:
    signal = make_signal(p["signal"], models.survival)
    scheduler = ConfidenceSkip(
        p["tau"], k_min=p["k_min"], s_max=p["s_max"], signal=signal, signal_tau=p["signal_tau"]
    )
    engine = build_sdd(models, p, scheduler, "sdd-skip")
    _check_k_min(p["k_min"], engine.proposer.gamma)
    if p["signal"] != "raw":
        hidden = engine.proposer.lm.model.config.hidden_size
        if models.survival.config.hidden_size != hidden:
            raise RelaxSpecError(
                f"the survival predictor was trained on drafter hidden states of size "
                f"{models.survival.config.hidden_size}, this drafter has {hidden}"
            )
    return engine


def _build_periodic(models: ModelSet, p: dict[str, Any]) -> Engine:
    engine = build_sdd(models, p, Periodic(p["period"], p["skip_k"]), "sdd-periodic")
    if p["skip_k"] > engine.proposer.gamma:
        raise RelaxSpecError(f"skip_k ({p['skip_k']}) cannot exceed gamma ({engine.proposer.gamma})")
    return engine


register(
    MethodSpec(
        "sdd",
        "Strict speculative diffusion decoding: diffusion-drafted blocks, every block verified",
        ("target", "diffusion"),
        dict(BASE_PARAMS),
        lambda models, p: build_sdd(models, p, Strict()),
        _validate_base,
    )
)
register(
    MethodSpec(
        "sdd-skip",
        "SDD with confidence-guided verifier skipping (signal raw | marginal | conditional)",
        ("target", "diffusion"),
        {**BASE_PARAMS, **SKIP_PARAMS},
        _build_skip,
        _validate_skip,
        optional=("survival",),
    )
)
register(
    MethodSpec(
        "sdd-periodic",
        "SDD that commits skip_k draft tokens unverified every period rounds (baseline)",
        ("target", "diffusion"),
        {**BASE_PARAMS, **PERIODIC_PARAMS},
        _build_periodic,
        _validate_periodic,
    )
)


def method_names() -> list[str]:
    return list(METHODS)


def get_method(method: str) -> MethodSpec:
    if method not in METHODS:
        raise RelaxSpecError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    return METHODS[method]


def resolve_params(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Defaults of ``method`` overridden by ``params``, validated; unknown names are an error."""
    spec = get_method(method)
    unknown = [name for name in params if name not in spec.params]
    if unknown:
        allowed = ", ".join(spec.params) or "none"
        names = ", ".join(_show(name) if not str(name).isidentifier() else name for name in unknown[:3])
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise RelaxSpecError(f"method {method!r} has no parameter {names}{more} (parameters: {allowed})")
    for name, value in params.items():
        _check_scalar(method, name, value)
    resolved = {**spec.params, **params}
    spec.validate(resolved)
    return resolved


def build_engine(
    method: str, target: LoadedModel | ModelSet, draft: LoadedModel | None = None, **params: Any
) -> Engine:
    """An :class:`Engine` for a named method; ``target`` may be a :class:`ModelSet` of all roles."""
    resolved = resolve_params(method, params)
    models = target if isinstance(target, ModelSet) else ModelSet(target=target, draft=draft)
    return get_method(method).build(models, resolved)


def load_draft(path: Path) -> LoadedModel | LoadedEagle:
    """A ``--draft`` directory: an EAGLE head (recognised by its config) or a causal LM."""
    return load_eagle(path) if is_eagle_dir(path) else load_model(path)


# How a model of each role is loaded from a directory.
ROLE_LOADERS: dict[str, Callable[[Path], Any]] = {
    "target": load_model,
    "draft": load_draft,
    "block": load_model,
    "diffusion": load_diffusion,
    "survival": SurvivalPredictor.load,
}


# Roles whose decoding forwards may run on packed kernels (engine/packed.py): every transformers
# model the engines decode with (the diffusion drafter's block forward passes its own mask).
PACKED_ROLES = ("target", "draft", "block", "diffusion")


def load_role(role: str, path: Path, kernels: str = "auto") -> Any:
    """A model of ``role`` loaded from ``path`` with that role's loader.

    ``kernels`` (:data:`relaxspec.engine.packed.KERNELS`) says what the decoding forwards of a
    :data:`PACKED_ROLES` model run on; ``auto`` picks the fastest measured one it allows.
    """
    if role not in ROLE_LOADERS:
        raise RelaxSpecError(f"no loader for {role} models (roles: {', '.join(ROLE_LOADERS)})")
    if kernels not in KERNELS:
        raise RelaxSpecError(f"unknown kernels {kernels!r} (choose from {', '.join(KERNELS)})")
    loaded = ROLE_LOADERS[role](path)
    if role in PACKED_ROLES and not isinstance(loaded, LoadedEagle):  # a head runs on the target's
        attach_kernels(loaded.model, kernels)
    return loaded


def load_models(
    method: str, paths: dict[str, str | Path | None] | None = None, kernels: str = "auto"
) -> ModelSet:
    """Load the models ``method`` needs: from ``paths[role]`` or the bundled ``models/<role>``."""
    spec = get_method(method)
    paths = paths or {}
    models = ModelSet()
    for role in spec.needs:
        path = model_dir(role, paths.get(role), f"method {method!r}")
        setattr(models, role, load_role(role, path, kernels))
    for role in spec.optional:
        path = model_dir(role, paths.get(role), required=False)
        if path is not None:
            setattr(models, role, load_role(role, path, kernels))
    return models
