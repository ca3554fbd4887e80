"""What every proposer returns, and the interface the engine calls (docs/design.md §4)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from relaxspec.core.sampling import SamplingParams


@dataclass
class Proposal:
    """A draft block for one sequence.

    tokens:     LongTensor[1, K]    the drafted tokens d_1..d_K
    probs:      FloatTensor[1, K, V] the law q_i each d_i was drawn from (None if unknown)
    confidence: FloatTensor[1, K]   the proposer's own score of each token (q_i(d_i) for a draft
                                    model; the reveal-step probability for a diffusion drafter)
    features:   extra per-position tensors a scheduler may use (e.g. hidden states)
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None
    confidence: torch.Tensor
    features: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def k(self) -> int:
        return int(self.tokens.shape[1])


class Proposer(Protocol):
    """Drafts tokens after the committed sequence; keeps whatever state (cache) it needs.

    ``start`` is called once per generation with the prompt, ``propose`` once per cycle with all
    committed ids, and ``rollback`` after each commit with the number of committed tokens whose
    state may be kept (the proposer must drop anything beyond it).
    """

    name: str

    @property
    def calls(self) -> int:
        """Forward passes made so far (the stats' draft calls)."""
        ...

    def start(self, prompt_ids: torch.Tensor) -> None: ...

    def propose(
        self, ids: torch.Tensor, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal: ...

    def rollback(self, length: int) -> None: ...
