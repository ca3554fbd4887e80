"""What every proposer returns, and the interface the engine calls (docs/design.md §4)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from relaxspec.core.sampling import SamplingParams, processed_probs, sample


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


def draft_chain(
    logits: torch.Tensor,
    feed: Callable[[torch.Tensor, int], torch.Tensor],
    k: int,
    params: SamplingParams,
    generator: torch.Generator | None,
    stop_below: float = 0.0,
) -> Proposal:
    """Draw a chain ``d_1 .. d_r`` (r ≤ k), each from the processed law ``q_i`` (argmax when greedy).

    logits: FloatTensor[1, V], the proposer's logits for ``d_1``; ``feed(d_i[1], i)`` feeds
    ``d_i`` (i = 1 .. r − 1) and returns the logits ``[1, V]`` for ``d_{i+1}``. The chain stops
    early after the first draft its law gives less than ``stop_below`` (a dynamic draft length,
    EAGLE-2's confidence as a cut): the rule still verifies each ``d_i`` against its ``q_i``, so
    exact rules stay exact. The last draft is never fed: its successor is not needed.
    """
    tokens, probs = [], []
    for i in range(k):
        q = processed_probs(logits, params)  # [1, V]
        token = sample(q, generator, params.greedy)  # [1]
        tokens.append(token)
        probs.append(q)
        if i + 1 == k or (stop_below > 0 and float(q[0, token[0]]) < stop_below):  # no sync when off
            break
        logits = feed(token, i + 1)
    d = torch.stack(tokens, dim=1)  # [1, r]
    q_all = torch.stack(probs, dim=1)  # [1, r, V]
    return Proposal(tokens=d, probs=q_all, confidence=q_all.gather(-1, d[..., None]).squeeze(-1))


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
