"""DraftModel: a small causal LM sampled K steps with its own KV cache (classic SD drafting)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.kv import make_lm
from relaxspec.engine.proposers.base import Proposal, draft_chain


class DraftModel:
    """Draft ``k`` tokens autoregressively from a small causal LM.

    Each token is drawn from the draft's *processed* distribution (the request's temperature,
    top-k and top-p), which is returned as ``q`` so exact rules stay exact. The first forward of
    a cycle also feeds the committed tokens the cache has not seen (the previous cycle's accepted
    tail, recovered or bonus token), so a cycle costs exactly ``k`` draft forwards — fewer when
    ``stop_below`` ends the chain early (:func:`~relaxspec.engine.proposers.base.draft_chain`).
    """

    name = "draft"

    def __init__(self, model: PreTrainedModel, stop_below: float = 0.0) -> None:
        self.lm = make_lm(model, name="draft model")
        self.stop_below = stop_below

    @property
    def calls(self) -> int:
        return self.lm.calls

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.lm.reset()

    def propose(
        self, ids: torch.Tensor, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        logits = self.lm.feed_committed(ids)[:, -1]  # [1, V]: distribution after the committed ids

        def feed(token: torch.Tensor, i: int) -> torch.Tensor:
            return self.lm.forward(token[:, None], logits_to_keep=1)[:, -1]

        return draft_chain(logits, feed, k, params, generator, self.stop_below)

    def rollback(self, length: int) -> None:
        self.lm.rollback(length)
