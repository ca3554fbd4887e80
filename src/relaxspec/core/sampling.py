"""Sampling controls: from raw logits to the processed distribution a request samples from.

The verifier's processed distribution is ``p`` and the proposer's actual sampling law is ``q``
(docs/design.md §1): both come from :func:`processed_probs` with the request's temperature, top-k and top-p,
so that exact rules are exact with respect to what the user asked for, not the raw model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from relaxspec.errors import RelaxSpecError

# The smallest positive temperature and top-p a request may ask for. Smaller positive values
# underflow (1e-300 is 0 in float32, so logits / T is NaN) or overflow (logits / 1e-40 is inf),
# and they mean nothing new: vLLM decodes greedily below a temperature of 1e-5, and a top-p this
# small keeps only the most likely tokens. One floor, used by every entry point (CLI, servers,
# the vLLM engine), so the same value is refused everywhere with the same message.
MIN_TEMPERATURE = 1e-5
MIN_TOP_P = 1e-5


def check_temperature(temperature: object) -> float:
    """``temperature`` as a float if it is 0 (greedy) or a finite number ≥ MIN_TEMPERATURE."""
    ok = isinstance(temperature, int | float) and not isinstance(temperature, bool)
    if not (ok and math.isfinite(temperature) and temperature >= 0):
        raise RelaxSpecError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if 0 < temperature < MIN_TEMPERATURE:
        raise RelaxSpecError(
            f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {temperature!r}: "
            "smaller values overflow the logits; use 0 for greedy decoding"
        )
    return float(temperature)


def check_top_p(top_p: object) -> float:
    """``top_p`` as a float if it is a number in [MIN_TOP_P, 1]."""
    ok = isinstance(top_p, int | float) and not isinstance(top_p, bool)
    if not (ok and 0 < top_p <= 1):
        raise RelaxSpecError(f"top_p must be in (0, 1], got {top_p!r}")
    if top_p < MIN_TOP_P:
        raise RelaxSpecError(
            f"top_p must be at least {MIN_TOP_P:g}, got {top_p!r}: smaller values underflow "
            f"and keep the same most likely tokens as {MIN_TOP_P:g}"
        )
    return float(top_p)


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
        check_temperature(self.temperature)
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise RelaxSpecError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        check_top_p(self.top_p)
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
    """Raise a clear error if a model produced NaN or Inf logits (docs/design.md §7).

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
        probs = probs.masked_fill(top_p_drop(probs, params.top_p), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


TOP_P_PREFIX = 64  # top_p_drop's first look: the highest tokens that usually hold the nucleus


def top_p_drop(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``BoolTensor[..., V]``: the tokens top-p drops from ``probs[..., V]`` — in descending order,
    every token whose preceding mass already reaches ``top_p``.

    Only the highest :data:`TOP_P_PREFIX` tokens are ranked (``topk``) where their mass reaches
    ``top_p`` in every row: every token past them is preceded by at least that mass, so it is
    dropped, and the kept set is the one a full sort gives; a row flatter than that sorts the whole
    vocabulary. (A language model's 0.95-nucleus is almost always far smaller than the prefix.)
    """
    top, order = torch.topk(probs, min(TOP_P_PREFIX, probs.shape[-1]), dim=-1)  # [..., k], descending
    if not bool((top.sum(dim=-1) >= top_p).all()):  # a flat row: rank the whole vocabulary
        top, order = torch.sort(probs, dim=-1, descending=True)
    keep = torch.cumsum(top, dim=-1) - top < top_p  # keep tokens until the mass reaches top_p
    return torch.ones_like(probs, dtype=torch.bool).scatter(-1, order, ~keep)


def sample(probs: torch.Tensor, generator: torch.Generator | None, greedy: bool) -> torch.Tensor:
    """One token per row of ``probs[..., V]``: argmax if ``greedy`` else a categorical draw."""
    if greedy:
        return probs.argmax(dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
