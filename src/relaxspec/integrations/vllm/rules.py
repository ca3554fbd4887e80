"""Which relaxspec rule a vLLM request row uses (docs/design.md §8): names, parameters, validation.

A request names its rule in ``SamplingParams.extra_args`` (OpenAI ``vllm_xargs``), e.g.
``{"rule": "nsd", "theta": 0.9}``; without one it gets the server / engine default, which travels
to every vLLM process in the ``RELAXSPEC_VLLM_RULE`` environment variable (JSON of the same
form; unset: ``sd``, i.e. lossless). A :class:`RuleChoice` holds the two rule objects of
:mod:`relaxspec.acceptance` a row may need: the sampling rule (temperature > 0) and its greedy
variant (temperature 0). Constructing them validates every value (``RelaxSpecError``); this
module never evaluates a rule itself.

Names, parameters and defaults are those of :data:`relaxspec.core.named_rules.RULES` (the table:
docs/vllm.md, "Rules and parameters"). An HTTP request's ``vllm_xargs`` (:func:`check_request`) is
held to the documented set — ``gate`` only on a server started with ``--method prove``, and no
``true``/``false`` for a relaxspec key; in-process callers may name ``gate``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from relaxspec.core.acceptance import Rule
from relaxspec.core.named_rules import RULES
from relaxspec.errors import RelaxSpecError
from relaxspec.params import Param

ENV_RULE = "RELAXSPEC_VLLM_RULE"
RULE_KEY = "rule"
RULE_NAMES = tuple(RULES)
ALIASES = {alias: spec.name for spec in RULES.values() for alias in spec.aliases}
# Rules a request may not name in vllm_xargs unless the server's own rule is that rule.
SERVER_ONLY = ("gate",)


def _implied() -> dict[str, str]:
    """Parameter -> the rule it implies when a request gives it without a rule that takes it: the
    first rule in :data:`RULES` order that declares it (``{"theta": 0.8}`` on an ``sd`` server means
    nucleus at θ = 0.8; ``delta`` alone stays typical's)."""
    implied: dict[str, str] = {}
    for spec in RULES.values():
        if spec.name not in SERVER_ONLY:
            for name in spec.params:
                implied.setdefault(name, spec.name)
    return implied


_IMPLIED = _implied()
PARAM_KEYS = tuple(_IMPLIED)
PARAMS: dict[str, Param] = {name: RULES[rule].params[name] for name, rule in _IMPLIED.items()}


def canonical(name: Any) -> str:
    """The rule name for a method or rule name; unknown names raise ``RelaxSpecError``."""
    if not isinstance(name, str):
        raise RelaxSpecError(f"rule must be a string, one of {', '.join(RULE_NAMES)}; got {name!r}")
    key = ALIASES.get(name.lower(), name.lower())
    if key not in RULES:
        raise RelaxSpecError(
            f"unknown rule {name!r} for vLLM: choose one of {', '.join(RULE_NAMES)} "
            f"(aliases: {', '.join(ALIASES)})"
        )
    return key


@dataclass(frozen=True)
class RuleChoice:
    """A named rule with its parameters, and the rule objects it builds (validated on creation).

    It travels to vLLM as ``extra_args`` (:meth:`to_extra_args`) and back (:meth:`from_extra_args`);
    the process default travels the same way, as JSON in ``RELAXSPEC_VLLM_RULE``.
    """

    name: str = "sd"
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        name = canonical(self.name)
        spec = RULES[name]
        unknown = set(self.params) - set(spec.params)
        if unknown:
            raise RelaxSpecError(
                f"rule {name!r} takes {', '.join(spec.params) or 'no parameters'}; "
                f"got {', '.join(sorted(unknown))}"
            )
        # a None value means the rule's default (NSD's default θ is per regime: None until built)
        given = {k: spec.params[k].coerce(v) for k, v in self.params.items() if v is not None}
        params = {**{k: p.default for k, p in spec.params.items()}, **given}
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "params", params)
        try:
            sampling, greedy = spec.pair(params)
        except RelaxSpecError as err:
            shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
            raise RelaxSpecError(f"rule {name!r} ({shown}): {err}") from None
        object.__setattr__(self, "_sampling", sampling)
        object.__setattr__(self, "_greedy", greedy)

    def rule(self, greedy: bool) -> Rule:
        """The rule for a row: the greedy variant at temperature 0, the sampling rule otherwise."""
        return self._greedy if greedy else self._sampling  # type: ignore[attr-defined]

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.name, *sorted(self.params.items()))

    def label(self) -> str:
        inner = ",".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.name}({inner})" if inner else self.name

    def to_extra_args(self) -> dict[str, Any]:
        """``{"rule": name, **params}``: vLLM's ``extra_args``, and (as JSON) ``RELAXSPEC_VLLM_RULE``."""
        return {RULE_KEY: self.name, **self.params}

    @classmethod
    def from_extra_args(cls, args: Mapping[str, Any] | None, default: RuleChoice | None = None) -> RuleChoice:
        """The rule a request asks for in ``extra_args`` (relaxspec's keys only), over ``default``.

        Keys: ``rule`` and the parameters of :data:`PARAM_KEYS`; other keys belong to others and
        are ignored. A parameter alone switches to the rule it belongs to unless the default rule
        takes it. Raises ``RelaxSpecError`` on bad values.
        """
        default = default or cls()
        args = dict(args or {})
        params = {k: args[k] for k in PARAM_KEYS if k in args}
        if RULE_KEY in args:
            return cls(canonical(args[RULE_KEY]), params)
        if not params:
            return default
        if set(params) <= set(RULES[default.name].params):
            return cls(default.name, {**default.params, **params})
        implied = {_IMPLIED[k] for k in params}
        if len(implied) > 1:
            raise RelaxSpecError(
                f"parameters {', '.join(sorted(params))} belong to different rules; name one"
            )
        return cls(implied.pop(), params)


def default_choice() -> RuleChoice:
    """The process-wide default from ``RELAXSPEC_VLLM_RULE`` (JSON); ``sd`` if unset. The one place
    that reads it (:func:`.rejection.default_rule` keeps the result per process)."""
    text = os.environ.get(ENV_RULE, "").strip()
    if not text:
        return RuleChoice()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = {RULE_KEY: text}
    try:
        if not isinstance(data, dict):
            raise RelaxSpecError('it must be a JSON object like {"rule": "nsd", "theta": 0.9}')
        return RuleChoice.from_extra_args(data)
    except RelaxSpecError as err:
        raise RelaxSpecError(f"{ENV_RULE}={text!r}: {err}") from None


def default_env(choice: RuleChoice | None) -> dict[str, str | None]:
    """The environment that makes ``choice`` the default of every vLLM process (None: unset)."""
    return {ENV_RULE: None if choice is None else json.dumps(choice.to_extra_args())}


def check_request(args: Mapping[str, Any] | None, default: RuleChoice) -> RuleChoice:
    """The rule an HTTP request's raw ``vllm_xargs`` asks for, held to the documented set.

    Stricter than :meth:`RuleChoice.from_extra_args` in two ways: a boolean is refused for ``rule`` and
    every parameter (JSON ``true`` is not the number 1), and a rule of :data:`SERVER_ONLY`
    (``gate``) is refused unless it is the server's own rule. Raises ``RelaxSpecError``.
    """
    args = dict(args or {})
    for key in (RULE_KEY, *PARAM_KEYS):
        value = args.get(key)
        if isinstance(value, bool) or (isinstance(value, list) and any(isinstance(v, bool) for v in value)):
            what = "a rule name" if key == RULE_KEY else "a number"
            raise RelaxSpecError(f"{key} must be {what}, got {json.dumps(value)}")
    choice = RuleChoice.from_extra_args(args, default)
    if choice.name in SERVER_ONLY and default.name != choice.name:
        offered = ", ".join(n for n in RULE_NAMES if n not in SERVER_ONLY)
        raise RelaxSpecError(
            f"rule {choice.name!r} is not offered per request (it emits no corrected token and needs "
            f"the block proposer's q): choose one of {offered}, or start the server with --method prove"
        )
    return choice


# vLLM modules whose request models carry ``vllm_xargs`` (OpenAI completions, chat, responses,
# Anthropic messages, speech to text).
PROTOCOL_MODULES = (
    "vllm.entrypoints.openai.completion.protocol",
    "vllm.entrypoints.openai.chat_completion.protocol",
    "vllm.entrypoints.openai.responses.protocol",
    "vllm.entrypoints.anthropic.protocol",
    "vllm.entrypoints.speech_to_text.transcription.protocol",
    "vllm.entrypoints.speech_to_text.translation.protocol",
)


def check_request_models(served: Callable[[], RuleChoice | None]) -> list[type]:
    """Give vLLM's request models a before-validator on ``vllm_xargs`` that runs
    :func:`check_request` on the raw value against ``served()`` — the server's rule, or None for
    no check (the plugin unregistered: stock behaviour) — and rebuild them. Returns the models
    patched; idempotent (a model keeps its first validator).

    A before-validator sees the JSON as sent: vLLM's field type ``str | int | float`` reads ``true``
    as 1 before any later check could tell. Routes built after this (vLLM builds its app after
    loading plugins) validate with it; the error is vLLM's 400 with our message.
    """
    import importlib

    from pydantic import BaseModel, BeforeValidator

    def check_raw(value: Any) -> Any:
        default = served()
        if default is not None and isinstance(value, Mapping):
            try:
                check_request(value, default)
            except RelaxSpecError as err:
                raise ValueError(f"vllm_xargs: {err}") from None
        return value

    check_raw.relaxspec_xargs = True  # type: ignore[attr-defined]

    patched = []
    for name in PROTOCOL_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:  # a front end this vLLM build lacks (or its optional dependencies)
            continue
        for model in vars(module).values():
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                continue
            field = model.model_fields.get("vllm_xargs")
            if field is None or any(
                hasattr(getattr(m, "func", None), "relaxspec_xargs") for m in field.metadata
            ):
                continue
            field.metadata.append(BeforeValidator(check_raw))
            model.model_rebuild(force=True)
            patched.append(model)
    return patched
