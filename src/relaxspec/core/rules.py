"""The acceptance rules (docs/design.md §2): every sampling-mode rule is an *acceptance function*
``h(x) ∈ [0, 1]`` (:class:`AcceptanceRule`), written once, element-wise, in
:meth:`AcceptanceRule.h`; ``Gate`` (ProVe) is the one rule outside this family.

:func:`~relaxspec.core.verify.verify` calls ``h`` on the drafted tokens and on the rejection row,
and :mod:`relaxspec.core.theory` over the whole vocabulary (:meth:`AcceptanceRule.h_full`), so the
sampler and the closed-form emitted law of §3 cannot drift apart.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from relaxspec.core.checks import check_unit_interval, is_real
from relaxspec.core.relaxed_sets import (
    argmax_mask,
    nucleus_mask_unchecked,
    nucleus_member_unchecked,
    top_k_mask,
    typical_mask,
)
from relaxspec.errors import require

# A residual (p − q·h)⁺ with less total mass than this is rounding noise, not a distribution:
# recovery falls back to p (docs/design.md §2). Its total mass bounds the rejection probability ρ, so
# the fallback moves the emitted law by at most this much in total variation.
RESIDUAL_EPS = 1e-6


def residual_distribution(p: Tensor, q: Tensor, h: Tensor) -> Tensor:
    """Recovery law ``norm((p − q·h)⁺)``; ``p`` (normalised) where the residual has no mass.

    p, q, h: [..., V] -> [..., V]. "No mass" means total below ``RESIDUAL_EPS`` (rounding noise).
    """
    residual = (p - q * h).clamp_min(0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    fallback = p / p.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
    return torch.where(mass > RESIDUAL_EPS, residual / mass.clamp_min(RESIDUAL_EPS), fallback)


def _ratio(p_x: Tensor, q_x: Tensor, ell: float) -> Tensor:
    """``min(1, p/(ℓ·q))`` element-wise, never NaN: ``q = 0`` gives 1 if ``p > 0`` (ratio +inf), 0 if
    ``p = 0`` (a token the target forbids is never accepted).

    A token with ``q = 0`` was never proposed, so the guard only fixes values that carry no mass
    (``q·h = 0``). Values with ``p ≥ ℓq`` are exactly 1, which keeps the residual free of noise.
    """
    scaled = ell * q_x
    ratio = p_x / scaled.clamp_min(torch.finfo(scaled.dtype).tiny)
    return torch.where((p_x >= scaled) & (p_x > 0), 1.0, ratio)


@dataclass(frozen=True)
class Rule:
    """Base of every acceptance rule accepted by :func:`verify`."""

    @property
    def is_greedy(self) -> bool:
        """True for temperature-0 rules: argmax-based acceptance, recovery and bonus."""
        return bool(getattr(self, "greedy", False))

    @property
    def needs_draft_probs(self) -> bool:
        """True if :func:`verify` needs ``draft_probs`` (at least ``q_i(d_i)``)."""
        return not self.is_greedy

    @property
    def needs_full_draft_probs(self) -> bool:
        """True if ``draft_probs`` must be the full ``[B, K, V]`` (recovery uses ``q_i``)."""
        return self.needs_draft_probs


@dataclass(frozen=True)
class AcceptanceRule(Rule):
    """A rule given by an acceptance function ``h`` (docs/design.md §2 table).

    ``h(x) = 1`` on :meth:`accept_set` and the base rule elsewhere: ``min(1, p/(ℓq))`` in sampling
    mode (``ℓ = 1`` except for :class:`Lenience`), 0 in greedy mode.
    """

    def relaxed_set(self, p: Tensor) -> Tensor | None:
        """Tokens the relaxation accepts outright, [..., V] bool, or None for no relaxation."""
        return None

    @property
    def relaxes(self) -> bool:
        """False where :meth:`relaxed_set` is None whatever ``p`` (the greedy path then reads no
        target law: :func:`~relaxspec.core.verify.verify_greedy`)."""
        return type(self).relaxed_set is not AcceptanceRule.relaxed_set

    @property
    def reads_block(self) -> bool:
        """True where :meth:`defer` reads the target laws of the whole block (``FLy``)."""
        return type(self).defer is not AcceptanceRule.defer

    def relaxed_at(self, p: Tensor, tokens: Tensor) -> Tensor | None:
        """Membership of ``tokens`` in :meth:`relaxed_set` — p: [M, V], tokens: [M] long -> [M]
        bool, or None for no relaxation."""
        relaxed = self.relaxed_set(p)
        return None if relaxed is None else relaxed.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    def _leniency(self) -> float:
        return 1.0

    def accept_set(self, p: Tensor) -> Tensor | None:
        """Tokens with ``h = 1`` regardless of q: the relaxed set, plus ``argmax p`` in greedy mode.

        p: [..., V] -> [..., V] bool or None.
        """
        relaxed = self.relaxed_set(p)
        if not self.is_greedy:
            return relaxed
        top = argmax_mask(p)
        return top if relaxed is None else relaxed | top

    def h(self, p_x: Tensor, q_x: Tensor | None, in_set: Tensor | None) -> Tensor:
        """The acceptance function, element-wise — the one definition of h.

        p_x, q_x: [...] target / proposal probability of the token(s) in question (q_x unused
        in greedy mode, may be None); in_set: [...] bool membership in :meth:`accept_set` or
        None. Returns [...] in [0, 1], dtype of p_x.
        """
        if self.is_greedy:
            base = torch.zeros_like(p_x)
        else:
            require(q_x is not None, f"{self!r} needs the proposal probabilities q")
            base = _ratio(p_x, q_x, self._leniency())
        return base if in_set is None else torch.where(in_set, 1.0, base)

    def h_full(self, p: Tensor, q: Tensor | None) -> Tensor:
        """``h`` over the whole vocabulary. p, q: [..., V] -> [..., V] (used by theory §3)."""
        return self.h(p, q, self.accept_set(p))

    def acceptance_prob(self, tokens: Tensor, q_tok: Tensor | None, p: Tensor) -> Tensor:
        """``h`` at given tokens. tokens: [...] long; q_tok: [...] = q(tokens); p: [..., V] -> [...]."""
        idx = tokens.unsqueeze(-1)
        in_set = self.accept_set(p)
        in_set_tok = None if in_set is None else in_set.gather(-1, idx).squeeze(-1)
        return self.h(p.gather(-1, idx).squeeze(-1), q_tok, in_set_tok)

    def defer(self, native: Tensor, p_draft: Tensor, p_tok: Tensor) -> Tensor:
        """The accept mask from the element-wise decisions: unchanged for every rule but one whose
        decision at a position also reads later positions of the same block (``FLy``).

        native: [B, K] bool; p_draft: [B, K, V]; p_tok: [B, K] -> [B, K] bool.
        """
        return native

    def recovery_distribution(self, p: Tensor, q: Tensor | None, h: Tensor) -> Tensor:
        """Law of the token emitted after a rejection: ``norm((p − q·h)⁺)`` or ``onehot(argmax p)``.

        p, q, h: [..., V] -> [..., V] float.
        """
        if self.is_greedy:
            return argmax_mask(p).to(p.dtype)
        assert q is not None
        return residual_distribution(p, q, h)


@dataclass(frozen=True)
class Exact(AcceptanceRule):
    """Standard speculative sampling, ``h = min(1, p/q)`` (Leviathan et al.; Chen et al.). Lossless."""


@dataclass(frozen=True)
class Lenience(AcceptanceRule):
    """Lenient acceptance, ``h = min(1, p/(ℓq))``, ``ℓ ∈ (0, 1]``; ``ℓ = 1`` is :class:`Exact`.

    ``greedy=True`` is the deterministic (temperature-0) variant used by the VS paper's lenience
    baseline under greedy decoding: accept ``x`` iff ``p(x) ≥ ℓ·max p`` (tokens within a factor ℓ
    of the target's mode; ``ℓ = 1`` accepts exactly the argmax ties, i.e. :class:`Greedy`);
    recovered and bonus tokens are ``argmax p``. The sampling rule is unchanged by this flag.
    """

    ell: float
    greedy: bool = False

    def __post_init__(self) -> None:
        check_unit_interval(self.ell, "ell")
        require(isinstance(self.greedy, bool), f"greedy must be a bool, got {self.greedy!r}")

    def _leniency(self) -> float:
        return float(self.ell)

    def relaxed_set(self, p: Tensor) -> Tensor | None:
        if not self.greedy:
            return None
        return (p >= float(self.ell) * p.amax(dim=-1, keepdim=True)) & (p > 0)


@dataclass(frozen=True)
class Nucleus(AcceptanceRule):
    """NSD: accept if ``x ∈ N_θ(p)``, else the base rule (NSD §3). ``θ ∈ (0, 1]``."""

    theta: float
    greedy: bool = False

    def __post_init__(self) -> None:
        check_unit_interval(self.theta, "theta")
        require(isinstance(self.greedy, bool), f"greedy must be a bool, got {self.greedy!r}")

    def relaxed_set(self, p: Tensor) -> Tensor:
        return nucleus_mask_unchecked(p, float(self.theta))

    def relaxed_at(self, p: Tensor, tokens: Tensor) -> Tensor:
        return nucleus_member_unchecked(p, tokens, float(self.theta))


# NSD's θ where a user gives none, per decoding regime ("greedy": temperature 0; "sampling"),
# the largest θ of the measured speed–quality frontier whose quality stays inside the lossless
# baseline's 95 % interval on the bundled family (docs/results.md, "NSD's default θ").
NSD_DEFAULT_THETA = {"greedy": 0.8, "sampling": 0.8}


def nsd_rule(theta: float | None, greedy: bool) -> Nucleus:
    """NSD's rule for one regime: ``Nucleus(theta)``, or the regime's default θ
    (:data:`NSD_DEFAULT_THETA`) where ``theta`` is None."""
    if theta is None:
        theta = NSD_DEFAULT_THETA["greedy" if greedy else "sampling"]
    return Nucleus(theta, greedy=greedy)


@dataclass(frozen=True)
class TopK(AcceptanceRule):
    """Top-k acceptance: accept if ``rank_p(x) < k`` (and ``p(x) > 0``), else the base rule."""

    k: int
    greedy: bool = False

    def __post_init__(self) -> None:
        require(
            isinstance(self.k, numbers.Integral) and not isinstance(self.k, bool) and self.k >= 1,
            f"k must be an integer ≥ 1, got {self.k!r}",
        )
        require(isinstance(self.greedy, bool), f"greedy must be a bool, got {self.greedy!r}")

    def relaxed_set(self, p: Tensor) -> Tensor:
        return top_k_mask(p, int(self.k))


@dataclass(frozen=True)
class Typical(AcceptanceRule):
    """Typical acceptance: accept if ``p(x) ≥ min(ε, δ·exp(−H(p)))``, else the base rule.

    Defaults are Medusa's / vLLM's (posterior threshold 0.09, alpha 0.3). ``ε ∈ (0, 1]``, ``δ > 0``.
    """

    epsilon: float = 0.09
    delta: float = 0.3
    greedy: bool = False

    def __post_init__(self) -> None:
        check_unit_interval(self.epsilon, "epsilon")
        require(
            is_real(self.delta) and float(self.delta) > 0,
            f"delta must be a finite number > 0, got {self.delta!r}",
        )
        require(isinstance(self.greedy, bool), f"greedy must be a bool, got {self.greedy!r}")

    def relaxed_set(self, p: Tensor) -> Tensor:
        return typical_mask(p, float(self.epsilon), float(self.delta))


@dataclass(frozen=True)
class Greedy(AcceptanceRule):
    """Temperature 0: accept iff ``x = argmax p``; recovered and bonus tokens are ``argmax p``."""

    @property
    def is_greedy(self) -> bool:
        return True


@dataclass(frozen=True)
class Gate(Rule):
    """ProVe product gate: accept the prefix while ``q_i(d_i)·p_i(d_i) ≥ θ``; ``d_1`` always.

    ``q_i(d_i)`` is the proposer's probability of its own token. Emits no next token
    (``next_token = NO_TOKEN``). ``θ ≥ 0``; ``θ = 0`` accepts everything, ``θ > 1`` only ``d_1``.
    """

    theta: float

    def __post_init__(self) -> None:
        require(
            is_real(self.theta) and float(self.theta) >= 0,
            f"theta must be a finite number ≥ 0, got {self.theta!r}",
        )

    @property
    def needs_draft_probs(self) -> bool:
        return True

    @property
    def needs_full_draft_probs(self) -> bool:
        return False
