"""Closed-form single-step laws and sequence-level bounds (DESIGN §3; NSD §3 and App. A).

For one position with target ``p`` and proposal ``q`` a rule with acceptance function ``h`` has
accepted mass ``a = q·h``, rejection mass ``ρ = 1 − Σa`` and emitted law
``e = a + ρ·r`` where ``r`` is the rule's recovery law (``norm((p − a)⁺)``, or ``onehot(argmax p)``
in greedy mode). ``h`` and ``r`` come from :mod:`relaxspec.core.acceptance`, the same code that
:func:`relaxspec.core.acceptance.verify` samples with.

Tensor functions take ``[..., V]`` and reduce the last dim.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from relaxspec.core.acceptance import (
    AcceptanceRule,
    Exact,
    Gate,
    Greedy,
    Nucleus,
    Rule,
    argmax_mask,
    check_distribution,
    nucleus_mask,
)
from relaxspec.errors import require

__all__ = [
    "acceptance_rate",
    "certified_horizon",
    "coupling_bound",
    "emitted_distribution",
    "excess_in_nucleus",
    "position_report",
    "rejection_mass",
    "total_variation",
]


def _check_pair(p: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    p = check_distribution(p, "p")
    q = check_distribution(q, "q")
    require(p.shape == q.shape, f"p and q must have the same shape, got {list(p.shape)} and {list(q.shape)}")
    require(p.device == q.device, f"p is on {p.device} but q is on {q.device}")
    return p, q


def _check_rule(rule: Rule) -> AcceptanceRule:
    require(
        not isinstance(rule, Gate),
        "Gate has no emitted law: it emits no recovered or bonus token, so the single-step law "
        "of DESIGN §3 is undefined for it",
    )
    require(
        isinstance(rule, AcceptanceRule),
        f"rule must be one of Exact, Nucleus, TopK, Typical, Lenience, Greedy, got {type(rule).__name__}",
    )
    return rule


def emitted_distribution(rule: Rule, p: Tensor, q: Tensor | None) -> Tensor:
    """Single-step law of the emitted token, ``e = a + ρ·r`` (DESIGN §3; NSD App. A.2).

    p, q: [..., V] -> [..., V]. ``q`` may be None only for :class:`Greedy`, whose law is
    ``onehot(argmax p)`` whatever the proposal. Gate has no emitted law (RelaxSpecError).
    """
    rule = _check_rule(rule)
    if q is None:
        require(isinstance(rule, Greedy), f"{rule!r} needs the proposal distribution q")
        p = check_distribution(p, "p")
        return argmax_mask(p).to(p.dtype)
    p, q = _check_pair(p, q)
    h = rule.h_full(p, q)
    accepted = q * h
    rho = (1.0 - accepted.sum(dim=-1, keepdim=True)).clamp_min(0.0)
    return accepted + rho * rule.recovery_distribution(p, q, h)


def acceptance_rate(rule: Rule, p: Tensor, q: Tensor) -> Tensor:
    """Probability that a draft ``x ~ q`` is accepted, ``Σ q·h``. p, q: [..., V] -> [...]."""
    rule = _check_rule(rule)
    p, q = _check_pair(p, q)
    return (q * rule.h_full(p, q)).sum(dim=-1)


def rejection_mass(p: Tensor, q: Tensor) -> Tensor:
    """Standard-SD rejection probability ``R = Σ (q − p)⁺`` = TV(p, q). p, q: [..., V] -> [...]."""
    p, q = _check_pair(p, q)
    return (q - p).clamp_min(0.0).sum(dim=-1)


def excess_in_nucleus(p: Tensor, q: Tensor, theta: float) -> Tensor:
    """Draft excess inside the target nucleus, ``ES = Σ_{x ∈ N_θ(p)} (q − p)⁺`` (NSD §3).

    p, q: [..., V]; theta ∈ (0, 1] -> [...]. Equals NSD's extra acceptance and its TV error.
    """
    p, q = _check_pair(p, q)
    member = nucleus_mask(p, theta)
    return torch.where(member, (q - p).clamp_min(0.0), 0.0).sum(dim=-1)


def total_variation(a: Tensor, b: Tensor) -> Tensor:
    """``TV(a, b) = ½ Σ |a − b|`` over the last dim. a, b: [..., V] -> [...]."""
    require(isinstance(a, Tensor) and isinstance(b, Tensor), "a and b must be tensors")
    require(a.shape == b.shape, f"a and b must have the same shape, got {list(a.shape)} and {list(b.shape)}")
    require(a.dim() >= 1, "a and b must have shape [..., V]")
    require(bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all()), "a or b contains NaN or Inf")
    return 0.5 * (a.float() - b.float()).abs().sum(dim=-1)


def _eps_values(eps: Sequence[float] | Tensor | float) -> list[float]:
    if isinstance(eps, Tensor):
        values = eps.detach().double().flatten().tolist()
    elif isinstance(eps, numbers.Real):
        values = [float(eps)]
    else:
        values = [float(e) for e in eps]
    require(
        all(math.isfinite(e) and 0.0 <= e <= 1.0 for e in values),
        "eps must contain per-step total-variation bounds in [0, 1]",
    )
    return values


def coupling_bound(eps: Sequence[float] | Tensor) -> float:
    """Sequence agreement lower bound ``Q_T = Π_t (1 − ε_t)`` (NSD App. A.4).

    eps: per-step TV bounds ε_1..ε_T in [0, 1] (sequence or tensor of any shape). Empty → 1.
    E.g. ``coupling_bound([1e-3] * 32) ≈ 0.9685`` (NSD §3).
    """
    return math.prod(1.0 - e for e in _eps_values(eps))


def certified_horizon(eps: float, delta: float) -> int | float:
    """Longest horizon certified at agreement ≥ 1 − δ under a uniform per-step bound ε (NSD App. A.5).

    The largest integer ``T ≥ 0`` with ``T ≤ log(1 − δ)/log(1 − ε)``, i.e. ``(1 − ε)^T ≥ 1 − δ``.
    Edge cases: ``ε = 0`` (exact decoder) or ``δ = 1`` (vacuous target) → ``math.inf``;
    ``ε = 1`` or ``δ = 0`` (with ``ε > 0``) → 0. Requires ``ε, δ ∈ [0, 1]``.
    """
    for name, x in (("eps", eps), ("delta", delta)):
        require(
            isinstance(x, numbers.Real) and not isinstance(x, bool) and 0.0 <= float(x) <= 1.0,
            f"{name} must be a number in [0, 1], got {x!r}",
        )
    eps, delta = float(eps), float(delta)
    if eps == 0.0 or delta == 1.0:
        return math.inf
    if eps == 1.0 or delta == 0.0:
        return 0
    ratio = math.log1p(-delta) / math.log1p(-eps)
    # A hair of slack so a ratio that is an integer in exact arithmetic is not floored below it.
    return math.floor(ratio * (1.0 + 1e-12))


def position_report(p: Tensor, q: Tensor, theta: float) -> dict[str, Tensor]:
    """Per-position diagnostics along a generation for the nucleus rule (DESIGN §3 CLI).

    p, q: [T, V] (or any [..., V]) target and proposal laws; theta ∈ (0, 1]. Returns [...] tensors:
    ``rejection_mass`` R, ``excess_in_nucleus`` ES, ``total_variation`` TV(e_NSD, p) (= ES),
    ``sd_acceptance`` 1 − R, ``nsd_acceptance`` 1 − R + ES, ``nucleus_size`` |N_θ(p)|.
    """
    p, q = _check_pair(p, q)
    rule = Nucleus(theta)
    emitted = emitted_distribution(rule, p, q)
    return {
        "rejection_mass": rejection_mass(p, q),
        "excess_in_nucleus": excess_in_nucleus(p, q, theta),
        "total_variation": total_variation(emitted, p),
        "sd_acceptance": acceptance_rate(Exact(), p, q),
        "nsd_acceptance": acceptance_rate(rule, p, q),
        "nucleus_size": nucleus_mask(p, theta).sum(dim=-1),
    }
