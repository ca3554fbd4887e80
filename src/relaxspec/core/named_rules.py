"""The acceptance rules by name, with their typed parameters (docs/design.md §8.1): :data:`RULES`.

A method preset (:mod:`relaxspec.methods`) verifies with one of these, and a vLLM request names
one in ``extra_args`` (:mod:`relaxspec.integrations.vllm.rules`), so a rule's parameter names and
defaults are written here once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from relaxspec.core.acceptance import Exact, Gate, Greedy, Lenience, Rule, TopK, Typical, nsd_rule
from relaxspec.core.peer_rules import FLy, Threshold, TopKDelta
from relaxspec.errors import RelaxSpecError
from relaxspec.params import ACCEPT_K, DELTA, ELL, EPSILON, THETA, Param, Params, declare


@dataclass(frozen=True)
class RuleSpec:
    """A named acceptance rule: its parameters and ``make(params, greedy) -> Rule``.

    The rule object checks its own domain (``Nucleus`` checks θ), so its numeric parameters carry
    no bounds here. ``aliases`` are other names vLLM requests may use.
    """

    name: str
    params: Mapping[str, Param]
    make: Callable[[Params, bool], Rule]
    aliases: tuple[str, ...] = ()

    def pair(self, p: Mapping[str, Any]) -> tuple[Rule, Rule]:
        """(sampling rule, greedy rule) for resolved parameters ``p`` (constructing validates)."""
        own = Params({name: p[name] for name in self.params})
        return self.make(own, False), self.make(own, True)


def theta_with_default(default: float | None) -> Param:
    """θ with a preset's own default (NSD's None: the regime's, :data:`NSD_DEFAULT_THETA`)."""
    return dataclasses.replace(THETA, default=default, optional=default is None)


RULES: dict[str, RuleSpec] = {
    r.name: r
    for r in (
        RuleSpec("sd", declare(), lambda p, g: Greedy() if g else Exact(), ("exact",)),
        RuleSpec(
            "nsd",
            declare(THETA),
            lambda p, g: nsd_rule(p.theta, g),
            ("nucleus",),
        ),
        RuleSpec("topk", declare(ACCEPT_K), lambda p, g: TopK(p.accept_k, greedy=g), ("top_k", "top-k")),
        RuleSpec(
            "typical",
            declare(EPSILON, DELTA),
            lambda p, g: Typical(p.epsilon, p.delta, greedy=g),
        ),
        RuleSpec(
            "lenience",
            declare(ELL),
            lambda p, g: Lenience(p.ell, greedy=g),
        ),
        RuleSpec("greedy", declare(), lambda p, g: Greedy()),
        RuleSpec("gate", declare(theta_with_default(0.05)), lambda p, g: Gate(p.theta), ("prove",)),
        RuleSpec(
            "topk-delta",
            declare(
                Param("top_n", int, 3, "TensorRT-LLM top_n: accept among the target's top_n"),
                dataclasses.replace(DELTA, default=0.1),
            ),
            lambda p, g: TopKDelta(p.top_n, p.delta, greedy=g),
            ("topk_delta",),
        ),
        RuleSpec(
            "threshold",
            declare(
                Param("single", float, 0.5, "SGLang: accept outright if p ≥ single"),
                Param("acc", float, 1.0, "SGLang: else accept with probability min(1, p/(acc·q))"),
            ),
            lambda p, g: Threshold(p.single, p.acc, greedy=g),
        ),
        RuleSpec(
            "fly",
            declare(
                Param("window", int, None, "FLy window (None: min(6, K − 1))", optional=True),
                Param("entropy_threshold", float, 0.3, "FLy: defer only above this entropy"),
                Param("entropy_top_k", int, 3, "FLy: entropy over the target's top entropy_top_k"),
            ),
            lambda p, g: FLy(p.window, p.entropy_threshold, p.entropy_top_k, greedy=g),
        ),
    )
}


def get_rule(name: str) -> RuleSpec:
    if name not in RULES:
        raise RelaxSpecError(f"unknown rule {name!r}; choose from {', '.join(RULES)}")
    return RULES[name]
