"""Named method presets (DESIGN §4): a method is a (proposer, rule, scheduler) combination.

``build_engine("nsd", target, draft, theta=0.9, k=8)`` returns a ready :class:`Engine`. Each
preset declares its parameters with defaults, so unknown names and bad values fail with one clear
message, and the CLI, the benchmark and the server all build engines through this one function.
Users who want another combination build an :class:`Engine` from the parts directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relaxspec.acceptance import Exact, Greedy, Lenience, Nucleus, Rule, TopK, Typical
from relaxspec.engine import Engine
from relaxspec.errors import RelaxSpecError
from relaxspec.models import LoadedModel, check_compatible, check_same_tokenizer
from relaxspec.proposers.draft_model import DraftModel


@dataclass(frozen=True)
class MethodSpec:
    """A preset: its parameters (name -> default) and how its rules are made from them."""

    name: str
    summary: str
    params: dict[str, Any] = field(default_factory=dict)
    needs_draft: bool = True
    rules: Callable[[dict[str, Any]], tuple[Rule | None, Rule | None]] = lambda p: (None, None)


DRAFT_PARAMS = {"k": 8}

METHODS: dict[str, MethodSpec] = {
    "ar": MethodSpec("ar", "autoregressive decoding with the target (the baseline)", {}, needs_draft=False),
    "sd": MethodSpec(
        "sd",
        "speculative decoding, exact (Leviathan/Chen); greedy: argmax match",
        dict(DRAFT_PARAMS),
        rules=lambda p: (Exact(), Greedy()),
    ),
    "nsd": MethodSpec(
        "nsd",
        "Nucleus Speculative Decoding: also accept drafts in the target's θ-nucleus",
        {**DRAFT_PARAMS, "theta": 0.95},
        rules=lambda p: (Nucleus(p["theta"]), Nucleus(p["theta"], greedy=True)),
    ),
    "topk": MethodSpec(
        "topk",
        "also accept drafts among the target's top accept_k tokens",
        {**DRAFT_PARAMS, "accept_k": 2},
        rules=lambda p: (TopK(p["accept_k"]), TopK(p["accept_k"], greedy=True)),
    ),
    "typical": MethodSpec(
        "typical",
        "typical acceptance (Medusa): also accept p(x) ≥ min(ε, δ·exp(−H(p)))",
        {**DRAFT_PARAMS, "epsilon": 0.09, "delta": 0.3},
        rules=lambda p: (Typical(p["epsilon"], p["delta"]), Typical(p["epsilon"], p["delta"], greedy=True)),
    ),
    "lenience": MethodSpec(
        "lenience",
        "lenient acceptance min(1, p/(ℓq)); sampling only",
        {**DRAFT_PARAMS, "ell": 0.5},
        rules=lambda p: (Lenience(p["ell"]), None),
    ),
}


def method_names() -> list[str]:
    return list(METHODS)


def resolve_params(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Defaults of ``method`` overridden by ``params``; unknown names are an error."""
    if method not in METHODS:
        raise RelaxSpecError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    spec = METHODS[method]
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        allowed = ", ".join(spec.params) or "none"
        raise RelaxSpecError(
            f"method {method!r} has no parameter {', '.join(unknown)} (parameters: {allowed})"
        )
    resolved = {**spec.params, **params}
    if "k" in resolved and (
        not isinstance(resolved["k"], int) or isinstance(resolved["k"], bool) or resolved["k"] < 1
    ):
        raise RelaxSpecError(f"k (draft length) must be an integer >= 1, got {resolved['k']!r}")
    spec.rules(resolved)  # constructing the rules validates their parameters (θ, ℓ, ε, δ, ...)
    return resolved


def build_engine(method: str, target: LoadedModel, draft: LoadedModel | None = None, **params: Any) -> Engine:
    """An :class:`Engine` for a named method on a target (and draft) model."""
    resolved = resolve_params(method, params)
    spec = METHODS[method]
    rule, greedy_rule = spec.rules(resolved)  # validates the rule parameters
    if not spec.needs_draft:
        return Engine(target.model, target.tokenizer)
    if draft is None:
        raise RelaxSpecError(f"method {method!r} needs a draft model")
    check_compatible(target.model, draft.model, "draft")
    check_same_tokenizer(target.tokenizer, draft.tokenizer, "draft")
    return Engine(
        target.model,
        target.tokenizer,
        proposer=DraftModel(draft.model),
        rule=rule,
        greedy_rule=greedy_rule,
        k=resolved["k"],
    )
