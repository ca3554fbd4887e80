"""Schedulers decide whether a cycle calls the verifier at all (verifier skipping, DESIGN §4).

A scheduler looks at a proposal and at how many tokens have been committed without verification
since the last verifier call, and returns how many leading draft tokens to commit *unverified*
(0 means: run a strict round, verify the whole block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from relaxspec.proposers.base import Proposal


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


@dataclass(frozen=True)
class Strict:
    """Verify every cycle (standard speculative decoding)."""

    name: str = "strict"

    def skip_length(self, proposal: Proposal, state: SchedulerState) -> int:
        return 0
