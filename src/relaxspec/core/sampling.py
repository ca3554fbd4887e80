"""Sampling controls: from raw logits to the processed distribution a request samples from.

The verifier's processed distribution is ``p`` and the proposer's actual sampling law is ``q``
(DESIGN §1): both come from :func:`processed_probs` with the request's temperature, top-k and top-p,
so that exact rules are exact with respect to what the user asked for, not the raw model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from relaxspec.errors import RelaxSpecError


@dataclass(frozen=True)
class SamplingParams:
    """What the user asks of one generation.

    ``temperature == 0`` means greedy decoding (argmax, ties to the lowest id); top-k and top-p
    then only shape the reference distribution that relaxed greedy rules (e.g. the nucleus) use.
    """

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not (
            isinstance(self.temperature, int | float)
            and math.isfinite(self.temperature)
            and self.temperature >= 0
        ):
            raise RelaxSpecError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise RelaxSpecError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise RelaxSpecError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise RelaxSpecError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**63):
            raise RelaxSpecError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise RelaxSpecError("stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_finite(logits: torch.Tensor, who: str) -> None:
    """Raise a clear error if a model produced NaN or Inf logits (DESIGN §7).

    Tests the sum: it is NaN or Inf iff some logit is (a real model's logits are many orders of
    magnitude below where a float32 sum could overflow), and one reduction costs a tenth of an
    elementwise test, which the batched server pays per row and per step.
    """
    if not math.isfinite(float(logits.sum(dtype=torch.float64))):
        raise RelaxSpecError(f"{who} produced NaN or Inf logits; the model weights or inputs are broken")


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``FloatTensor[..., V]`` probabilities after temperature, top-k and top-p (float32).

    Top-k keeps the k highest logits (ties at the boundary kept); top-p keeps the smallest set of
    highest-probability tokens whose mass reaches ``top_p`` (the boundary token included). At
    temperature 0 the distribution is the softmax at temperature 1 with the same filters.
    """
    logits = logits.float()
    if params.temperature > 0:
        logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p  # keep tokens until the mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None, greedy: bool) -> torch.Tensor:
    """One token per row of ``probs[..., V]``: argmax if ``greedy`` else a categorical draw."""
    if greedy:
        return probs.argmax(dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
