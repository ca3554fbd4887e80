"""Input checks shared by the rules and :func:`~relaxspec.core.verify.verify`: numbers in range,
and probability tensors that are finite, non-negative and normalised (docs/design.md §2)."""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from relaxspec.errors import require

# Rows of a probability tensor must sum to 1 within this tolerance. Loose enough for bf16
# softmax outputs, tight enough to catch logits or unnormalised scores passed by mistake.
SUM_TOLERANCE = 1e-2


def is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


def check_unit_interval(x: object, name: str) -> None:
    require(is_real(x) and 0.0 < float(x) <= 1.0, f"{name} must be a number in (0, 1], got {x!r}")


def check_finite_nonneg(x: Tensor, name: str) -> None:
    require(bool(torch.isfinite(x).all()), f"{name} contains NaN or Inf")
    require(bool((x >= 0).all()), f"{name} contains negative probabilities")


def check_distribution(x: Tensor, name: str) -> Tensor:
    """Validate probabilities over the last dim and return them as float32.

    Finite, non-negative, rows summing to 1 within ``SUM_TOLERANCE``. x: [..., V].
    """
    require(isinstance(x, Tensor) and x.is_floating_point(), f"{name} must be a floating-point tensor")
    require(x.dim() >= 1 and x.shape[-1] >= 1, f"{name} must have shape [..., V] with V ≥ 1")
    x = x.float()
    check_finite_nonneg(x, name)
    if x.numel():
        sums = x.sum(dim=-1)
        lo, hi = float(sums.min()), float(sums.max())
        require(
            abs(lo - 1) <= SUM_TOLERANCE and abs(hi - 1) <= SUM_TOLERANCE,
            f"{name} must be probabilities summing to 1 over the last dim (got sums in "
            f"[{lo:.4g}, {hi:.4g}]); pass softmax outputs, not logits",
        )
    return x
