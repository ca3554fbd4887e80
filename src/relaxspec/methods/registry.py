"""The presets' registry: what a method is (:class:`MethodSpec`, its vLLM row :class:`VllmRow`), the
models it may use (:class:`ModelSet`), and how one is looked up, resolved and built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from relaxspec.core.named_rules import RuleSpec
from relaxspec.engine import Engine
from relaxspec.errors import RelaxSpecError
from relaxspec.models import LoadedModel
from relaxspec.params import (
    Param,
    Params,
    declare,
    defaults,
    resolve,
)

MODEL_ROLES = ("target", "draft", "eagle", "block", "diffusion", "survival")


@dataclass
class ModelSet:
    """The models a method may use, by role; ``require`` gives a clear error for a missing one."""

    target: LoadedModel | None = None
    draft: LoadedModel | None = None
    eagle: Any = None  # an EAGLE head (engine/proposers/eagle.py LoadedEagle): drafter=eagle
    block: LoadedModel | None = None
    diffusion: Any = None
    survival: Any = None

    def require(self, role: str, method: str) -> Any:
        model = getattr(self, role)
        if model is None:
            article = "an" if role[0] in "aeiou" else "a"
            raise RelaxSpecError(f"method {method!r} needs {article} {role} model")
        return model


# --- Methods: presets that own their parameters, build engines and declare their vLLM row ----------


@dataclass(frozen=True)
class VllmRow:
    """How a method runs inside vLLM (read by :mod:`relaxspec.integrations.vllm.runners`).

    ``proposer``: ``ar`` (no drafts), ``draft`` (vLLM's draft-model proposer; ``proposer=block``
    swaps in a MARS drafter, ``proposer=ngram`` / ``suffix`` vLLM's model-free proposers),
    ``block`` (a block proposer: ``seam`` picks how), ``diffusion``.
    ``extras``: parameters only the vLLM row has; ``drops``: engine parameters it does not take.
    """

    proposer: str
    extras: Mapping[str, Param] = field(default_factory=declare)
    drops: tuple[str, ...] = ()


def no_check(p: Params) -> None:
    """No checks beyond each parameter's own."""


@dataclass(frozen=True)
class MethodSpec:
    """A preset: the models it needs, its typed parameters, its builder and its vLLM row.

    ``rule``: the rule it verifies with (None: it picks one from its parameters, or none).
    ``validate``: checks across parameters, run once after each parameter's own check.
    ``optional`` roles are loaded when a path is given or a bundled model exists, and left None
    otherwise (the builder raises a clear error if the chosen parameters need them).
    ``vllm``: its row inside vLLM, or None where it skips the verifier (vLLM cannot).
    """

    name: str
    summary: str
    needs: tuple[str, ...]
    params: Mapping[str, Param]
    build: Callable[[ModelSet, Params], Engine]
    validate: Callable[[Params], None] = no_check
    optional: tuple[str, ...] = ()
    rule: RuleSpec | None = None
    vllm: VllmRow | None = None

    @property
    def defaults(self) -> dict[str, Any]:
        return defaults(self.params)

    def resolve(self, given: Mapping[str, Any]) -> Params:
        """``given`` over the defaults, each value checked, then the checks across values."""
        p = resolve(f"method {self.name!r}", self.params, given)
        self.validate(p)
        if self.rule is not None:
            self.rule.pair(p)  # constructing the rules validates θ, ℓ, ε, δ, ...
        return p


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add a preset to the registry (users may register their own combinations too)."""
    METHODS[spec.name] = spec
    return spec


def params_named(name: str) -> list[tuple[str, Param]]:
    """Every (method, its :class:`Param`) of that name, in registry order (the CLI's flag help)."""
    return [(m, spec.params[name]) for m, spec in METHODS.items() if name in spec.params]


def method_names() -> list[str]:
    return list(METHODS)


def get_method(method: str) -> MethodSpec:
    if method not in METHODS:
        raise RelaxSpecError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    return METHODS[method]


def resolve_params(method: str, params: Mapping[str, Any]) -> Params:
    """Defaults of ``method`` overridden by ``params``, validated once; unknown names are an error."""
    return get_method(method).resolve(params)


def build_engine(
    method: str, target: LoadedModel | ModelSet, draft: LoadedModel | None = None, **params: Any
) -> Engine:
    """An :class:`Engine` for a named method; ``target`` may be a :class:`ModelSet` of all roles."""
    resolved = resolve_params(method, params)
    models = target if isinstance(target, ModelSet) else ModelSet(target=target, draft=draft)
    return get_method(method).build(models, resolved)
