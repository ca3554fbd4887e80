"""Named method presets (DESIGN §4): a method is a (proposer, verifier, rule, scheduler) combination.

``build_engine("nsd", target, draft, theta=0.9, k=8)`` returns a ready :class:`Engine`. Each
preset declares the models it needs and its parameters with defaults, so unknown names and bad
values fail with one clear message, and the CLI, the benchmark and the server all build engines
through this one function. Users who want another combination build an :class:`Engine` from the
parts directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relaxspec.acceptance import Exact, Gate, Greedy, Lenience, Nucleus, Rule, TopK, Typical
from relaxspec.engine import Engine
from relaxspec.errors import RelaxSpecError
from relaxspec.models import LoadedModel, bundled, check_compatible, check_same_tokenizer, load_model
from relaxspec.proposers.block import BlockProposer, trained_block_size
from relaxspec.proposers.draft_model import DraftModel
from relaxspec.schedulers import ConfidenceSkip

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
    """Add a preset (proposer modules register theirs on import)."""
    METHODS[spec.name] = spec
    return spec


def _check_k(params: dict[str, Any], name: str = "k", what: str = "draft length") -> None:
    k = params.get(name)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise RelaxSpecError(f"{name} ({what}) must be an integer >= 1, got {k!r}")


def draft_model_method(
    name: str,
    summary: str,
    params: dict[str, Any],
    rules: Callable[[dict[str, Any]], tuple[Rule | None, Rule | None]],
) -> MethodSpec:
    """A classic SD-style preset: DraftModel proposer, target verifier, (sampling, greedy) rules."""

    def validate(p: dict[str, Any]) -> None:
        _check_k(p)
        rules(p)  # constructing the rules validates θ, ℓ, ε, δ, ...

    def build(models: ModelSet, p: dict[str, Any]) -> Engine:
        target, draft = models.require("target", name), models.require("draft", name)
        check_compatible(target.model, draft.model, "draft")
        check_same_tokenizer(target.tokenizer, draft.tokenizer, "draft")
        rule, greedy_rule = rules(p)
        return Engine(
            target.model,
            target.tokenizer,
            proposer=DraftModel(draft.model),
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
        {"theta": 0.95},
        lambda p: (Nucleus(p["theta"]), Nucleus(p["theta"], greedy=True)),
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


# --- ProVe family (ProVe paper; DESIGN §4): a MARS block proposer with three ways to commit ---------


# Our operating point from the block-size sweep on the bundled models (docs/results.md): τ is
# already 5.5 at B = 8 and barely grows beyond (6.1 at 16-32), while every placeholder position
# costs compute in the proposer's forward on a CPU, so B = 8 is fastest (prove-lossless 1.58×
# vs 1.47× at 16 and 1.13× at 32). The ProVe paper uses 16 on GPUs, where a wider forward is
# nearly free. The bundled proposer is trained with 32 so the whole sweep stays in range.
DEFAULT_BLOCK_SIZE = 8


def _block_proposer(models: ModelSet, method: str, p: dict[str, Any]) -> tuple[LoadedModel, BlockProposer]:
    """The block model and its proposer; ``block_size`` None = 8, capped at the trained size."""
    block = models.require("block", method)
    trained = trained_block_size(block.model)
    size = p["block_size"] if p["block_size"] is not None else min(DEFAULT_BLOCK_SIZE, trained)
    return block, BlockProposer.from_pretrained(block.model, block.tokenizer, size)


def _check_block_size(p: dict[str, Any]) -> None:
    if p["block_size"] is not None:
        _check_k(p, "block_size", "tokens per block proposal; default: 8, capped at the trained size")


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
    block, proposer = _block_proposer(models, "prove", p)
    verifier = models.require("draft", "prove")
    check_compatible(verifier.model, block.model, "block proposer")
    check_same_tokenizer(verifier.tokenizer, block.tokenizer, "block proposer")
    gate = Gate(p["theta"])
    return Engine(
        verifier.model, block.tokenizer, proposer=proposer, rule=gate, greedy_rule=gate, k=proposer.block_size
    )


def _build_prove_lossless(models: ModelSet, p: dict[str, Any]) -> Engine:
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
        "ProVe-lossless: the block proposer verifies itself in AR mode (greedy = AR; sampling exact)",
        ("block",),
        {"block_size": None},
        _build_prove_lossless,
        _check_block_size,
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
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        allowed = ", ".join(spec.params) or "none"
        raise RelaxSpecError(
            f"method {method!r} has no parameter {', '.join(unknown)} (parameters: {allowed})"
        )
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


# How a model of each role is loaded from a directory (proposer modules add their own roles).
ROLE_LOADERS: dict[str, Callable[[Path], Any]] = {
    "target": load_model,
    "draft": load_model,
    "block": load_model,
}


def load_models(method: str, paths: dict[str, str | Path | None] | None = None) -> ModelSet:
    """Load the models ``method`` needs: from ``paths[role]`` or the bundled ``models/<role>``."""
    spec = get_method(method)
    paths = paths or {}
    models = ModelSet()
    for role in spec.needs:
        path = paths.get(role)
        if path is None:
            path = bundled(role)
            if not path.exists():
                raise RelaxSpecError(
                    f"method {method!r} needs a {role} model: pass --{role} DIR (no bundled model at {path})"
                )
        setattr(models, role, ROLE_LOADERS[role](Path(path)))
    for role in spec.optional:
        path = paths.get(role) or (bundled(role) if bundled(role).exists() else None)
        if path is not None:
            setattr(models, role, ROLE_LOADERS[role](Path(path)))
    return models


# Presets defined in their own modules register themselves on import.
from relaxspec import sdd as _sdd  # noqa: E402, F401
