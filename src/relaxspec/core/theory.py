"""Closed-form single-step laws and sequence-level bounds (docs/design.md §3; NSD §3 and App. A).

For one position with target ``p`` and proposal ``q`` a rule with acceptance function ``h`` has
accepted mass ``a = q·h``, rejection mass ``ρ = 1 − Σa`` and emitted law
``e = a + ρ·r`` where ``r`` is the rule's recovery law (``norm((p − a)⁺)``, or ``onehot(argmax p)``
in greedy mode). ``h`` and ``r`` come from :mod:`relaxspec.core.acceptance`, the same code that
:func:`relaxspec.core.acceptance.verify` samples with.

Tensor functions take ``[..., V]`` and reduce the last dim.
"""

from __future__ import annotations

import itertools
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
from relaxspec.core.peer_rules import FLy, Threshold, TopKDelta
from relaxspec.errors import require

__all__ = [
    "acceptance_rate",
    "certified_horizon",
    "coupling_bound",
    "emitted_distribution",
    "excess_in_nucleus",
    "fly_block_law",
    "peer_emitted_law",
    "peer_excess",
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
        "of docs/design.md §3 is undefined for it",
    )
    require(
        isinstance(rule, AcceptanceRule),
        f"rule must be one of Exact, Nucleus, TopK, Typical, Lenience, TopKDelta, Threshold, Greedy, "
        f"got {type(rule).__name__}",
    )
    require(
        not isinstance(rule, FLy),
        "FLy has no single-step law: its decision at a position reads the later drafts of its window; "
        "use fly_block_law (exact enumeration over the block)",
    )
    return rule


def emitted_distribution(rule: Rule, p: Tensor, q: Tensor | None) -> Tensor:
    """Single-step law of the emitted token, ``e = a + ρ·r`` (docs/design.md §3; NSD App. A.2).

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
    """Per-position diagnostics along a generation for the nucleus rule (docs/design.md §3 CLI).

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


# ---------------------------------------------------------------------------------------------
# The other engines' rules (core/peer_rules.py)
# ---------------------------------------------------------------------------------------------


def _peer_accepted(rule: TopKDelta | Threshold, p: Tensor, q: Tensor) -> Tensor:
    """Accepted mass ``a = q·h`` written from each rule's own definition (not through ``h``).

    TopKDelta: ``a = q`` on ``S = {rank_p < N, p ≥ max p − δ, p > 0}``, ``min(p, q)`` elsewhere.
    Threshold: ``a = q`` on ``{p ≥ single, p > 0}``, ``min(q, p/acc)`` elsewhere. p, q: [..., V].
    """
    if isinstance(rule, TopKDelta):
        rank = (p.unsqueeze(-2) > p.unsqueeze(-1)).sum(-1)  # #{y: p(y) > p(x)}; O(V²), small V
        member = (rank < rule.top_n) & (p >= p.amax(-1, keepdim=True) - rule.delta) & (p > 0)
        return torch.where(member, q, torch.minimum(p, q))
    member = (p >= rule.single) & (p > 0)
    return torch.where(member, q, torch.minimum(q, p / rule.acc))


def _check_peer(rule: Rule) -> TopKDelta | Threshold:
    require(
        isinstance(rule, TopKDelta | Threshold) and not rule.is_greedy,
        f"a closed form is given for sampling-mode TopKDelta and Threshold, got {rule!r}",
    )
    return rule


def peer_excess(rule: TopKDelta | Threshold, p: Tensor, q: Tensor) -> Tensor:
    """Closed-form extra acceptance ``E = Σ (a − p)⁺`` of TopKDelta / Threshold; ``E = TV(e, p)``.

    TopKDelta: ``E = Σ_{x ∈ S} (q − p)⁺`` (NSD's excess with the top-N-within-δ set).
    Threshold: ``E = Σ_{p ≥ single} (q − p)⁺ + Σ_{p < single} (min(q, p/acc) − p)⁺``.
    Why TV: ``h ≥ min(1, p/q)`` for both, so ``a = q`` where ``p ≥ q``, the residual is
    ``(p − q)⁺`` (mass R = TV(p, q)), ``ρ = R − E``, and ``e − p = (a − p)⁺ − (E/R)(p − q)⁺``.
    p, q: [..., V] -> [...].
    """
    rule = _check_peer(rule)
    p, q = _check_pair(p, q)
    return (_peer_accepted(rule, p, q) - p).clamp_min(0.0).sum(-1)


def peer_emitted_law(rule: TopKDelta | Threshold, p: Tensor, q: Tensor) -> Tensor:
    """Closed-form single-step law ``e = a + (1 − E/R)·(p − q)⁺`` (``e = p`` where ``R = 0``).

    p, q: [..., V] -> [...,V]; see :func:`peer_excess` for ``a``, ``E`` and ``R``.
    """
    rule = _check_peer(rule)
    p, q = _check_pair(p, q)
    accepted = _peer_accepted(rule, p, q)
    excess = (accepted - p).clamp_min(0.0).sum(-1, keepdim=True)
    residual = (p - q).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    scale = torch.where(mass > 0, 1.0 - excess / mass.clamp_min(1e-30), 0.0)
    return accepted + scale * residual


# Enumeration bound of fly_block_law: draft blocks × native decision patterns.
FLY_ENUMERATION_LIMIT = 200_000


def fly_block_law(rule: FLy, p: Tensor, q: Tensor | None) -> dict[str, Tensor]:
    """FLy's laws over one block by exact enumeration (small V and K).

    Drafts ``d_i ~ q_i`` independently (p and q fixed per position, as :func:`verify` sees them);
    native decisions ``b_i ~ Bernoulli(min(1, p_i(d_i)/q_i(d_i)))`` (greedy: ``d_i = argmax p_i``);
    FLy's deferral written out position by position, independent of ``FLy.defer``.

    p: [K+1, V], q: [K, V] (None for a greedy rule, whose drafts are then every d ∈ V^K with weight 1
    each: the result is a count, not a law). Returns ``accepted`` [K+1], the law of the accepted
    length, and ``first`` [V], the law of the first emitted token (``d_1`` if accepted, else the
    recovery draw at position 1: ``norm((p_1 − q_1)⁺)``, greedy ``argmax p_1``).
    """
    require(isinstance(rule, FLy), f"fly_block_law takes a FLy rule, got {rule!r}")
    p = check_distribution(p, "p").double()
    require(p.dim() == 2 and p.shape[0] >= 2, "p must have shape [K+1, V] with K ≥ 1")
    K, V = p.shape[0] - 1, p.shape[1]
    if not rule.is_greedy:
        require(q is not None, "a sampling-mode FLy rule needs q")
        q = check_distribution(q, "q").double()
        require(tuple(q.shape) == (K, V), f"q must have shape [K, V] = [{K}, {V}], got {list(q.shape)}")
    require(V**K * 2**K <= FLY_ENUMERATION_LIMIT, f"V^K·2^K = {V**K * 2**K} is too many to enumerate")
    top = min(rule.entropy_top_k, V)
    entropy = [float(torch.special.entr(p[i].topk(top).values).sum()) for i in range(K)]
    high = [e >= rule.entropy_threshold for e in entropy]
    window = rule.window_for(K)
    accepted = torch.zeros(K + 1, dtype=torch.float64)
    first = torch.zeros(V, dtype=torch.float64)
    recovery = argmax_mask(p[0]).double() if rule.is_greedy else _exact_residual(p[0], q[0])  # type: ignore[index]
    for drafts in itertools.product(range(V), repeat=K):
        if rule.is_greedy:
            weight, rate = 1.0, [float(p[i].argmax() == d) for i, d in enumerate(drafts)]
        else:
            weight = math.prod(float(q[i, d]) for i, d in enumerate(drafts))  # type: ignore[index]
            rate = [min(1.0, float(p[i, d] / q[i, d])) if q[i, d] > 0 else 0.0 for i, d in enumerate(drafts)]  # type: ignore[index]
        if weight == 0:
            continue
        for native in itertools.product((0, 1), repeat=K):
            w = weight * math.prod(r if b else 1 - r for r, b in zip(rate, native, strict=True))
            if w == 0:
                continue
            keep = [
                bool(native[i])
                or (
                    window >= 1
                    and i + window < K
                    and high[i]
                    and float(p[i, d]) > 0
                    and all(native[i + 1 : i + 1 + window])
                )
                for i, d in enumerate(drafts)
            ]
            n = next((i for i, k in enumerate(keep) if not k), K)
            accepted[n] += w
            if n >= 1:
                first[drafts[0]] += w
            else:
                first += w * recovery
    return {"accepted": accepted, "first": first}


def _exact_residual(p: Tensor, q: Tensor) -> Tensor:
    """``norm((p − q)⁺)``, ``p`` where that has no mass. p, q: [V] -> [V]."""
    residual = (p - q).clamp_min(0.0)
    return residual / residual.sum() if float(residual.sum()) > 0 else p
