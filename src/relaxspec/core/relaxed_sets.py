"""Sets of tokens a relaxed rule accepts outright, as bool masks over the vocabulary
(docs/design.md §2): ``argmax p``, NSD's tie-inclusive nucleus ``N_θ(p)`` (NSD §3 Eq. 1, App. B),
top-k by rank, and Medusa's typical set. Shapes: ``[..., V]`` in, ``[..., V]`` bool out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from relaxspec.core.checks import check_finite_nonneg, check_unit_interval
from relaxspec.errors import require


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


def nucleus_mask_unchecked(p: Tensor, theta: float) -> Tensor:
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


def nucleus_member_unchecked(p: Tensor, tokens: Tensor, theta: float) -> Tensor:
    """``tokens ∈ N_θ(p)`` without building the set: the definition of :func:`nucleus_mask`
    (``p(x) > 0`` and ``Σ_{y: p(y) > p(x)} p(y) < θ``) evaluated at ``x`` directly, one pass over
    the vocabulary and no sort. p: [..., V]; tokens: [...] long -> [...] bool.

    The sum is in float64 like :func:`_mass_before`'s, over the same values in another order, so
    the two agree wherever θ is farther from the mass above ``x`` than float64's rounding bound.
    """
    p_x = p.gather(-1, tokens.unsqueeze(-1))  # [..., 1]
    if theta >= 1.0:
        return (p_x > 0).squeeze(-1)
    above = torch.where(p > p_x, p, 0.0).sum(dim=-1, dtype=torch.float64)
    return (above < theta) & (p_x.squeeze(-1) > 0)


def nucleus_mask(p: Tensor, theta: float) -> Tensor:
    """Tie-inclusive, order-free nucleus ``N_θ(p)`` (docs/design.md §2; NSD §3 Eq. 1, App. B).

    ``x ∈ N_θ(p)`` ⇔ ``p(x) > 0`` and ``Σ_{y: p(y) > p(x)} p(y) < θ``. The top token is always a
    member, all tokens tied with the boundary token are members, and ``θ = 1`` gives the support.

    p: [..., V] non-negative; theta ∈ (0, 1] -> [..., V] bool.
    """
    check_unit_interval(theta, "theta")
    require(isinstance(p, Tensor) and p.is_floating_point(), "p must be a floating-point tensor")
    require(p.dim() >= 1 and p.shape[-1] >= 1, "p must have shape [..., V] with V ≥ 1")
    check_finite_nonneg(p, "p")
    return nucleus_mask_unchecked(p, float(theta))


def top_k_mask(p: Tensor, k: int) -> Tensor:
    """``rank_p(x) < k`` and ``p(x) > 0``, with ``rank_p(x) = #{y: p(y) > p(x)}`` (ties share a rank).

    p: [..., V] -> [..., V] bool.
    """
    # rank_p(x) < k ⇔ p(x) ≥ the k-th largest value (counting duplicates).
    kth = p.topk(min(k, p.shape[-1]), dim=-1).values[..., -1:]
    return (p >= kth) & (p > 0)


def typical_mask(p: Tensor, epsilon: float, delta: float) -> Tensor:
    """``p(x) ≥ min(ε, δ·exp(−H(p)))`` with H the natural-log entropy (Medusa; vLLM).

    p: [..., V] -> [..., V] bool. The threshold is > 0, so zero-probability tokens never qualify.
    """
    entropy = torch.special.entr(p).sum(dim=-1, keepdim=True)
    threshold = torch.clamp(delta * torch.exp(-entropy), max=epsilon)
    return p >= threshold
