"""Acceptance rules and the batched verification step (docs/design.md §2).

Every sampling-mode rule is an *acceptance function* ``h(x) ∈ [0, 1]``: draft token ``d_i`` is
accepted iff ``u_i < h_i(d_i)`` with ``u_i ~ U(0, 1)``; the first rejection ends the block and the
recovered token is drawn from ``norm((p_i − q_i·h_i)⁺)``; if all K drafts pass, a bonus token is
drawn from ``p_{K+1}``. Greedy-mode rules use ``h ∈ {0, 1}`` and recover/bonus with ``argmax p``.
``Gate`` (ProVe) is the one rule outside this family: a deterministic prefix gate emitting no
next token.

A rule's ``h`` is written once, element-wise, in :meth:`AcceptanceRule.h`; :func:`verify` calls it
on the drafted tokens and on the rejection row, and ``relaxspec.core.theory`` calls it over the whole
vocabulary (:meth:`AcceptanceRule.h_full`), so the sampler and the closed-form emitted law of §3
cannot drift apart.

Shapes: ``B`` batch rows, ``K`` draft positions, ``V`` vocabulary size.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from relaxspec.errors import require

__all__ = [
    "NO_TOKEN",
    "NSD_DEFAULT_THETA",
    "AcceptanceRule",
    "Exact",
    "Gate",
    "Greedy",
    "Lenience",
    "Nucleus",
    "Rule",
    "TopK",
    "Typical",
    "Verdict",
    "argmax_mask",
    "check_distribution",
    "check_verify_inputs",
    "nsd_rule",
    "nucleus_mask",
    "residual_distribution",
    "verify",
    "verify_unchecked",
]

# ``Verdict.next_token`` where the rule emits no token (Gate): vLLM's PLACEHOLDER_TOKEN_ID.
NO_TOKEN = -1

# Rows of a probability tensor must sum to 1 within this tolerance. Loose enough for bf16
# softmax outputs, tight enough to catch logits or unnormalised scores passed by mistake.
SUM_TOLERANCE = 1e-2
# A residual (p − q·h)⁺ with less total mass than this is rounding noise, not a distribution:
# recovery falls back to p (docs/design.md §2). Its total mass bounds the rejection probability ρ, so
# the fallback moves the emitted law by at most this much in total variation.
RESIDUAL_EPS = 1e-6


# ---------------------------------------------------------------------------------------------
# Sets of tokens a relaxed rule accepts outright
# ---------------------------------------------------------------------------------------------


def argmax_mask(p: Tensor) -> Tensor:
    """One-hot bool mask of ``argmax p`` over the last dim; ties go to the lowest token id.

    p: [..., V] -> [..., V] bool.
    """
    # torch.argmax returns the first maximal index on every backend.
    return F.one_hot(p.argmax(dim=-1), p.shape[-1]).bool()


# The nucleus is looked for among the largest 64, then 512 values first (a partial top-k costs a
# few percent of a full sort of the vocabulary on CPU); only rows whose nucleus is larger still
# sort everything.
NUCLEUS_HEADS = (64, 512)


def _mass_before(sorted_p: Tensor) -> Tensor:
    """Exclusive prefix sums ``before[i] = Σ_{j<i} sorted_p[j]``, in float64.

    sorted_p: [..., H] (descending) -> [..., H] float64.

    Why float64: the nucleus test ``before < θ`` is a threshold on a sum, and near θ = 1 a
    float32 sum (24-bit significand) lands on either side of θ depending on the summation order
    (``1 − 2⁻²⁴`` vs ``1.0``), which made the mask disagree with its own definition. Each float32
    (or bf16/fp16) value has at most 24 significant bits, so a partial sum of values whose
    exponents span at most ``29 − log₂ H`` binades fits in float64's 53 bits and is *exact*; in
    general the float64 sum is within ``(H − 1)·2⁻⁵³`` (relative) of the exact one (Higham,
    Thm 4.4), so the mask equals the exact-arithmetic mask for every θ farther than that from a
    partial sum, and θ itself is compared as a float64 (never rounded to the tensor's dtype).
    """
    mass = sorted_p.double().cumsum(-1)
    return torch.cat([torch.zeros_like(mass[..., :1]), mass[..., :-1]], dim=-1)


def _nucleus_mask(p: Tensor, theta: float) -> Tensor:
    """Unvalidated :func:`nucleus_mask`."""
    if theta >= 1.0:
        # Σ_{p(y) > p(x)} p(y) ≤ 1 − p(x) < 1 for every x in the support; skip the float sums.
        return p > 0
    for head in (*NUCLEUS_HEADS, p.shape[-1]):
        complete = head >= p.shape[-1]
        sorted_p = p.sort(dim=-1, descending=True).values if complete else p.topk(head, dim=-1).values
        # Exclusive cumsum: the mass sorted strictly before each position. It depends only on
        # the multiset of values, so the mask is invariant to permuting the vocabulary. A head's
        # prefix sums are a prefix of the full ones, so a head whose last position already has
        # mass ≥ θ before it (in every row) holds the whole nucleus.
        before = _mass_before(sorted_p)
        if complete or bool((before[..., -1] >= theta).all()):
            break
    # Positions with `before < θ` form a prefix of length ≥ 1. Its last value is the smallest
    # member; every token tied with it has the same mass strictly above, so it is a member too.
    n = (before < theta).sum(dim=-1, keepdim=True)
    threshold = sorted_p.gather(-1, n - 1)
    return (p >= threshold) & (p > 0)


def nucleus_mask(p: Tensor, theta: float) -> Tensor:
    """Tie-inclusive, order-free nucleus ``N_θ(p)`` (docs/design.md §2; NSD §3 Eq. 1, App. B).

    ``x ∈ N_θ(p)`` ⇔ ``p(x) > 0`` and ``Σ_{y: p(y) > p(x)} p(y) < θ``. The top token is always a
    member, all tokens tied with the boundary token are members, and ``θ = 1`` gives the support.

    p: [..., V] non-negative; theta ∈ (0, 1] -> [..., V] bool.
    """
    _check_unit_interval(theta, "theta")
    require(isinstance(p, Tensor) and p.is_floating_point(), "p must be a floating-point tensor")
    require(p.dim() >= 1 and p.shape[-1] >= 1, "p must have shape [..., V] with V ≥ 1")
    _check_finite_nonneg(p, "p")
    return _nucleus_mask(p, float(theta))


def _top_k_mask(p: Tensor, k: int) -> Tensor:
    """``rank_p(x) < k`` and ``p(x) > 0``, with ``rank_p(x) = #{y: p(y) > p(x)}`` (ties share a rank).

    p: [..., V] -> [..., V] bool.
    """
    # rank_p(x) < k ⇔ p(x) ≥ the k-th largest value (counting duplicates).
    kth = p.topk(min(k, p.shape[-1]), dim=-1).values[..., -1:]
    return (p >= kth) & (p > 0)


def _typical_mask(p: Tensor, epsilon: float, delta: float) -> Tensor:
    """``p(x) ≥ min(ε, δ·exp(−H(p)))`` with H the natural-log entropy (Medusa; vLLM).

    p: [..., V] -> [..., V] bool. The threshold is > 0, so zero-probability tokens never qualify.
    """
    entropy = torch.special.entr(p).sum(dim=-1, keepdim=True)
    threshold = torch.clamp(delta * torch.exp(-entropy), max=epsilon)
    return p >= threshold


# ---------------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------------


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


def _check_unit_interval(x: object, name: str) -> None:
    require(_is_real(x) and 0.0 < float(x) <= 1.0, f"{name} must be a number in (0, 1], got {x!r}")


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
        _check_unit_interval(self.ell, "ell")
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
        _check_unit_interval(self.theta, "theta")
        require(isinstance(self.greedy, bool), f"greedy must be a bool, got {self.greedy!r}")

    def relaxed_set(self, p: Tensor) -> Tensor:
        return _nucleus_mask(p, float(self.theta))


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
        return _top_k_mask(p, int(self.k))


@dataclass(frozen=True)
class Typical(AcceptanceRule):
    """Typical acceptance: accept if ``p(x) ≥ min(ε, δ·exp(−H(p)))``, else the base rule.

    Defaults are Medusa's / vLLM's (posterior threshold 0.09, alpha 0.3). ``ε ∈ (0, 1]``, ``δ > 0``.
    """

    epsilon: float = 0.09
    delta: float = 0.3
    greedy: bool = False

    def __post_init__(self) -> None:
        _check_unit_interval(self.epsilon, "epsilon")
        require(
            _is_real(self.delta) and float(self.delta) > 0,
            f"delta must be a finite number > 0, got {self.delta!r}",
        )
        require(isinstance(self.greedy, bool), f"greedy must be a bool, got {self.greedy!r}")

    def relaxed_set(self, p: Tensor) -> Tensor:
        return _typical_mask(p, float(self.epsilon), float(self.delta))


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
            _is_real(self.theta) and float(self.theta) >= 0,
            f"theta must be a finite number ≥ 0, got {self.theta!r}",
        )

    @property
    def needs_draft_probs(self) -> bool:
        return True

    @property
    def needs_full_draft_probs(self) -> bool:
        return False


# ---------------------------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Verdict:
    """Result of :func:`verify`.

    accepted: [B] long, accepted prefix length in 0..K.
    next_token: [B] long, recovered token if ``accepted < K``, bonus token if ``accepted == K``,
        :data:`NO_TOKEN` where the rule emits none (Gate).
    accept_mask: [B, K] bool, per-position decisions before the prefix cut (positions after the
        first rejection were decided with their own uniforms but are not committed).
    exact_accepted: [B] long, the prefix length the strict rule gives on the same draws — Exact
        under the same uniforms for sampling rules, argmax match for greedy rules and Gate — so
        ``accepted − exact_accepted`` counts tokens accepted by the relaxation.

    Unpacks like a pair: ``accepted, next_token = verify(...)``.
    """

    accepted: Tensor
    next_token: Tensor
    accept_mask: Tensor | None = None
    exact_accepted: Tensor | None = None

    def __iter__(self) -> Iterator[Tensor]:
        yield self.accepted
        yield self.next_token

    def emitted(self, draft_tokens: Tensor, row: int = 0) -> list[int]:
        """The tokens row ``row`` commits: its accepted draft prefix, then the next token unless
        it is :data:`NO_TOKEN` (the one place the placeholder is stripped)."""
        accepted, next_token = int(self.accepted[row]), int(self.next_token[row])
        tokens = draft_tokens[row, :accepted].tolist()
        return tokens if next_token == NO_TOKEN else [*tokens, next_token]


def residual_distribution(p: Tensor, q: Tensor, h: Tensor) -> Tensor:
    """Recovery law ``norm((p − q·h)⁺)``; ``p`` (normalised) where the residual has no mass.

    p, q, h: [..., V] -> [..., V]. "No mass" means total below ``RESIDUAL_EPS`` (rounding noise).
    """
    residual = (p - q * h).clamp_min(0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    fallback = p / p.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
    return torch.where(mass > RESIDUAL_EPS, residual / mass.clamp_min(RESIDUAL_EPS), fallback)


def _prefix_length(mask: Tensor) -> Tensor:
    """Length of the leading run of True per row. mask: [B, K] bool -> [B] long."""
    return mask.long().cumprod(dim=-1).sum(dim=-1)


def _check_finite_nonneg(x: Tensor, name: str) -> None:
    require(bool(torch.isfinite(x).all()), f"{name} contains NaN or Inf")
    require(bool((x >= 0).all()), f"{name} contains negative probabilities")


def check_distribution(x: Tensor, name: str) -> Tensor:
    """Validate probabilities over the last dim and return them as float32.

    Finite, non-negative, rows summing to 1 within ``SUM_TOLERANCE``. x: [..., V].
    """
    require(isinstance(x, Tensor) and x.is_floating_point(), f"{name} must be a floating-point tensor")
    require(x.dim() >= 1 and x.shape[-1] >= 1, f"{name} must have shape [..., V] with V ≥ 1")
    x = x.float()
    _check_finite_nonneg(x, name)
    if x.numel():
        sums = x.sum(dim=-1)
        lo, hi = float(sums.min()), float(sums.max())
        require(
            abs(lo - 1) <= SUM_TOLERANCE and abs(hi - 1) <= SUM_TOLERANCE,
            f"{name} must be probabilities summing to 1 over the last dim (got sums in "
            f"[{lo:.4g}, {hi:.4g}]); pass softmax outputs, not logits",
        )
    return x


def _check_rule_and_shapes(rule: Rule, draft_tokens: Tensor, target_probs: Tensor) -> None:
    require(
        isinstance(rule, AcceptanceRule | Gate),
        f"rule must be an acceptance rule (Exact, Nucleus, TopK, Typical, Lenience, TopKDelta, "
        f"Threshold, FLy, Greedy, Gate), "
        f"got {type(rule).__name__}",
    )
    require(
        isinstance(draft_tokens, Tensor)
        and draft_tokens.dim() == 2
        and not draft_tokens.is_floating_point()
        and not draft_tokens.is_complex()
        and draft_tokens.dtype != torch.bool,
        "draft_tokens must be an integer tensor of shape [B, K]",
    )
    require(
        isinstance(target_probs, Tensor) and target_probs.is_floating_point() and target_probs.dim() == 3,
        "target_probs must be a floating-point tensor of shape [B, K+1, V]",
    )
    B, K = draft_tokens.shape
    require(
        tuple(target_probs.shape[:2]) == (B, K + 1) and target_probs.shape[2] >= 1,
        f"target_probs must have shape [B, K+1, V] = [{B}, {K + 1}, V] to match draft_tokens of "
        f"shape [{B}, {K}], got {list(target_probs.shape)}",
    )
    require(
        draft_tokens.device == target_probs.device,
        f"draft_tokens is on {draft_tokens.device} but target_probs is on {target_probs.device}",
    )


def _check_draft_probs(
    rule: Rule, draft_probs: Tensor | None, B: int, K: int, V: int, device: torch.device
) -> Tensor | None:
    """Validate ``draft_probs`` for ``rule``; return it as float32 (or None)."""
    if draft_probs is None:
        require(
            not rule.needs_draft_probs,
            f"{rule!r} needs draft_probs (the proposal distribution the drafts were sampled from)",
        )
        return None
    require(
        isinstance(draft_probs, Tensor) and draft_probs.is_floating_point(),
        "draft_probs must be a floating-point tensor of shape [B, K, V] (or [B, K] for Gate)",
    )
    require(
        draft_probs.device == device,
        f"draft_probs is on {draft_probs.device} but target_probs is on {device}",
    )
    full, tok_only = (B, K, V), (B, K)
    shape = tuple(draft_probs.shape)
    if rule.needs_full_draft_probs:
        require(
            shape == full,
            f"{rule!r} needs draft_probs of shape [B, K, V] = {list(full)} (the full proposal "
            f"distribution, for recovery sampling), got {list(shape)}",
        )
    else:
        require(
            shape in (full, tok_only),
            f"draft_probs must have shape [B, K, V] = {list(full)} or [B, K] = {list(tok_only)}, "
            f"got {list(shape)}",
        )
    if shape == full:
        return check_distribution(draft_probs, "draft_probs")
    q = draft_probs.float()
    _check_finite_nonneg(q, "draft_probs")
    require(bool((q <= 1).all()), "draft_probs contains probabilities greater than 1")
    return q


def check_verify_inputs(
    rule: Rule,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    target_probs: Tensor,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Validate :func:`verify` arguments at the public boundary (one clear error each); return
    (tokens long, q float32 or None, p float32) as :func:`verify_unchecked` expects them."""
    _check_rule_and_shapes(rule, draft_tokens, target_probs)
    (B, K), V, device = draft_tokens.shape, target_probs.shape[2], target_probs.device
    tokens = draft_tokens.long()
    if tokens.numel():
        require(
            bool(((tokens >= 0) & (tokens < V)).all()),
            f"draft_tokens must be token ids in [0, {V}) (vocabulary size of target_probs)",
        )
    p = check_distribution(target_probs, "target_probs")
    q = _check_draft_probs(rule, draft_probs, B, K, V, device)
    if generator is not None:
        require(isinstance(generator, torch.Generator), "generator must be a torch.Generator or None")
        require(
            generator.device.type == device.type,
            f"generator is on {generator.device} but the probabilities are on {device}",
        )
    return tokens, q, p


def _gather_last(x: Tensor, tokens: Tensor) -> Tensor:
    """x: [B, K, V], tokens: [B, K] -> x at the tokens, [B, K]."""
    return x.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _argmax_match(tokens: Tensor, p: Tensor) -> Tensor:
    """tokens: [B, K], p: [B, K+1, V] -> [B, K] bool, ``d_i == argmax p_i``."""
    return tokens == p[:, : tokens.shape[1]].argmax(dim=-1)


def _verify_gate(rule: Gate, tokens: Tensor, q: Tensor, p: Tensor) -> Verdict:
    """ProVe gate (docs/design.md §2): prefix of ``q(d_i)·p(d_i) ≥ θ`` with position 1 always passing."""
    K = tokens.shape[1]
    q_tok = q if q.dim() == 2 else _gather_last(q, tokens)
    p_tok = _gather_last(p[:, :K], tokens)
    mask = q_tok * p_tok >= float(rule.theta)
    mask[:, :1] = True
    accepted = _prefix_length(mask)
    return Verdict(
        accepted=accepted,
        next_token=torch.full_like(accepted, NO_TOKEN),
        accept_mask=mask,
        exact_accepted=_prefix_length(_argmax_match(tokens, p)),
    )


def _sample_next(
    rule: AcceptanceRule,
    p: Tensor,
    q: Tensor,
    in_set: Tensor | None,
    accepted: Tensor,
    generator: torch.Generator | None,
) -> Tensor:
    """Recovered token at the first rejection, bonus token from ``p_{K+1}`` if none.

    p: [B, K+1, V]; q: [B, K, V]; in_set: [B, K, V] bool or None; accepted: [B] -> [B] long.
    """
    B, K = q.shape[:2]
    dist = p[:, K]
    if K > 0:
        rows = torch.arange(B, device=p.device)
        j = accepted.clamp(max=K - 1)
        p_row, q_row = p[rows, j], q[rows, j]
        set_row = None if in_set is None else in_set[rows, j]
        recovered = residual_distribution(p_row, q_row, rule.h(p_row, q_row, set_row))
        dist = torch.where((accepted == K).unsqueeze(-1), dist, recovered)
    return torch.multinomial(dist, 1, generator=generator).squeeze(-1)


def verify(
    rule: Rule,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    target_probs: Tensor,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Verify a batch of draft blocks with ``rule`` (docs/design.md §2; NSD §3 Alg. 1).

    draft_tokens: [B, K] int, the drafts ``d_1..d_K``.
    draft_probs: [B, K, V] proposal laws ``q_i`` the drafts were drawn from; ``[B, K]`` (``q_i(d_i)``
        only) is enough for Gate; None for greedy-mode rules, which ignore it.
    target_probs: [B, K+1, V] target laws ``p_1..p_{K+1}``.
    generator: optional ``torch.Generator`` for the uniforms (float64) and the recovery/bonus
        draws; the same generator state gives the same Verdict. Greedy rules and Gate are
        deterministic and draw nothing.

    Returns a :class:`Verdict`. Probabilities are handled in float32. Raises ``RelaxSpecError``
    on bad input: this is the public boundary; the engine, whose inputs come from its own
    processing, calls :func:`verify_unchecked`.
    """
    tokens, q, p = check_verify_inputs(rule, draft_tokens, draft_probs, target_probs, generator)
    return verify_unchecked(rule, tokens, q, p, generator)


def verify_unchecked(
    rule: Rule, tokens: Tensor, q: Tensor | None, p: Tensor, generator: torch.Generator | None = None
) -> Verdict:
    """:func:`verify` on inputs known to be valid: ``tokens[B, K]`` long, ``q`` float32
    ``[B, K, V]`` (``[B, K]`` for Gate) or None, ``p`` float32 ``[B, K+1, V]`` probabilities."""
    assert tokens.dtype == torch.long and p.dtype == torch.float32 and p.shape[1] == tokens.shape[1] + 1
    if isinstance(rule, Gate):
        assert q is not None
        return _verify_gate(rule, tokens, q, p)
    assert isinstance(rule, AcceptanceRule)

    B, K = tokens.shape
    p_draft = p[:, :K]
    in_set = rule.accept_set(p_draft)
    in_set_tok = None if in_set is None else _gather_last(in_set, tokens)
    p_tok = _gather_last(p_draft, tokens)

    if rule.is_greedy:
        # h ∈ {0, 1}: no uniforms needed. Recovered and bonus token are both argmax p_j.
        assert in_set_tok is not None
        accept_mask = rule.defer(in_set_tok, p_draft, p_tok)
        accepted = _prefix_length(accept_mask)
        next_token = p.argmax(dim=-1).gather(-1, accepted.unsqueeze(-1)).squeeze(-1)
        exact_mask = _argmax_match(tokens, p)
    else:
        assert q is not None and q.shape == p_draft.shape
        q_tok = _gather_last(q, tokens)
        u = torch.rand((B, K), dtype=torch.float64, generator=generator, device=p.device)
        accept_mask = rule.defer(u < rule.h(p_tok, q_tok, in_set_tok).double(), p_draft, p_tok)
        exact_mask = u < Exact().h(p_tok, q_tok, None).double()
        accepted = _prefix_length(accept_mask)
        next_token = _sample_next(rule, p, q, in_set, accepted, generator)

    return Verdict(
        accepted=accepted,
        next_token=next_token,
        accept_mask=accept_mask,
        exact_accepted=_prefix_length(exact_mask),
    )
