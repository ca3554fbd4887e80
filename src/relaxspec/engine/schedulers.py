"""Schedulers decide whether a cycle calls the verifier at all (verifier skipping, docs/design.md §4).

A scheduler looks at a proposal and at how many tokens have been committed without verification
since the last verifier call, and returns how many leading draft tokens to commit *unverified*
(0 means: run a strict round, verify the whole block).

- :class:`Strict` — verify every cycle.
- :class:`ConfidenceSkip` — VS paper §4: the longest prefix passing the local gate
  ``B_k = min_{j≤k} conf_j ≥ τ`` and the signal's prefix gate ``C_k ≥ τ_signal``; skip it only if
  it has at least ``k_min`` tokens and fewer than ``s_max`` tokens were committed unverified since
  the last verification. With ``commit_first=True`` and no verifier it is MARS's rule: commit the
  first token always, then left to right while the confidence stays ≥ τ.
- :class:`Periodic` — attempt a fixed-length skip every P rounds (baseline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from relaxspec.engine.proposers.base import Proposal
from relaxspec.errors import RelaxSpecError


@dataclass
class SchedulerState:
    """What a scheduler may know about the generation so far."""

    rounds: int = 0  # cycles so far
    unverified_run: int = 0  # tokens committed without verification since the last verifier call


class Scheduler(Protocol):
    name: str

    def skip_length(self, proposal: Proposal, state: SchedulerState) -> int:
        """How many leading draft tokens to commit without verification (0 = verify)."""
        ...


class Signal(Protocol):
    """A per-prefix survival score for ConfidenceSkip's prefix gate ``C_k``."""

    name: str

    def prefix_scores(self, proposal: Proposal) -> torch.Tensor:
        """``FloatTensor[K]``: score of committing the first k tokens, non-increasing in k."""
        ...


@dataclass(frozen=True)
class RawConfidence:
    """The drafter's own confidence: ``C_k = min_{j≤k} conf_j`` (the same as the local gate)."""

    name: str = "raw"

    def prefix_scores(self, proposal: Proposal) -> torch.Tensor:
        return torch.cummin(proposal.confidence[0].float(), dim=0).values


@dataclass(frozen=True)
class Strict:
    """Verify every cycle (standard speculative decoding)."""

    name: str = "strict"

    def skip_length(self, proposal: Proposal, state: SchedulerState) -> int:
        return 0


def longest_passing_prefix(scores: torch.Tensor, threshold: float) -> int:
    """Length of the longest prefix whose (non-increasing) scores are all ≥ ``threshold``."""
    passing = (scores >= threshold).int()
    return int(torch.cumprod(passing, dim=0).sum())


@dataclass(frozen=True)
class ConfidenceSkip:
    """Confidence-guided verifier skipping (VS paper §4).

    tau: local-gate threshold on the drafter's confidence; signal_tau: threshold of the signal's
    prefix gate (defaults to ``tau``); k_min: shortest prefix worth skipping; s_max: longest
    unverified run allowed before a strict round is forced; commit_first: always commit at least
    one token (MARS, which has no verifier to fall back on).
    """

    tau: float
    k_min: int = 6
    s_max: float = 64
    signal: Signal = field(default_factory=RawConfidence)
    signal_tau: float | None = None
    commit_first: bool = False
    name: str = "confidence-skip"

    def __post_init__(self) -> None:
        if not (isinstance(self.tau, int | float) and math.isfinite(self.tau) and 0 <= self.tau <= 1):
            raise RelaxSpecError(f"tau must be in [0, 1], got {self.tau!r}")
        if self.signal_tau is not None and not (0 <= self.signal_tau <= 1):
            raise RelaxSpecError(f"signal_tau must be in [0, 1], got {self.signal_tau!r}")
        if not isinstance(self.k_min, int) or self.k_min < 0:
            raise RelaxSpecError(f"k_min must be an integer >= 0, got {self.k_min!r}")
        if not (self.s_max >= self.k_min):
            raise RelaxSpecError(f"s_max ({self.s_max}) must be >= k_min ({self.k_min})")

    def skip_length(self, proposal: Proposal, state: SchedulerState) -> int:
        if self.commit_first:
            # MARS: the first token is committed whatever its confidence; the gate runs from
            # position 2 on.
            rest = torch.cummin(proposal.confidence[0, 1:].float(), dim=0).values
            return 1 + longest_passing_prefix(rest, self.tau)
        local = torch.cummin(proposal.confidence[0].float(), dim=0).values
        k = min(
            longest_passing_prefix(local, self.tau),
            longest_passing_prefix(
                self.signal.prefix_scores(proposal), self.tau if self.signal_tau is None else self.signal_tau
            ),
        )
        if k >= max(self.k_min, 1) and state.unverified_run < self.s_max:
            return k
        return 0


@dataclass(frozen=True)
class Periodic:
    """Every ``period``-th round commits the first ``k`` draft tokens unverified (baseline)."""

    period: int
    k: int = 6
    name: str = "periodic"

    def __post_init__(self) -> None:
        if not isinstance(self.period, int) or self.period < 1:
            raise RelaxSpecError(f"period must be an integer >= 1, got {self.period!r}")
        if not isinstance(self.k, int) or self.k < 1:
            raise RelaxSpecError(f"k must be an integer >= 1, got {self.k!r}")

    def skip_length(self, proposal: Proposal, state: SchedulerState) -> int:
        return self.k if (state.rounds + 1) % self.period == 0 else 0
