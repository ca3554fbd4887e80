"""DraftModel: a small causal LM sampled K steps with its own KV cache (classic SD drafting)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from relaxspec.core.sampling import SamplingParams, processed_probs, sample
from relaxspec.engine.kv import make_lm
from relaxspec.engine.proposers.base import Proposal


class DraftModel:
    """Draft ``k`` tokens autoregressively from a small causal LM.

    Each token is drawn from the draft's *processed* distribution (the request's temperature,
    top-k and top-p), which is returned as ``q`` so exact rules stay exact. The first forward of
    a cycle also feeds the committed tokens the cache has not seen (the previous cycle's accepted
    tail, recovered or bonus token), so a cycle costs exactly ``k`` draft forwards.
    """

    name = "draft"

    def __init__(self, model: PreTrainedModel) -> None:
        self.lm = make_lm(model, name="draft model")

    @property
    def calls(self) -> int:
        return self.lm.calls

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.lm.reset()

    def propose(
        self, ids: torch.Tensor, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        tokens, probs = [], []
        logits = self.lm.feed_committed(ids)[:, -1]  # [1, V]: distribution after the committed ids
        for i in range(k):
            q = processed_probs(logits, params)
            token = sample(q, generator, params.greedy)  # [1]
            tokens.append(token)
            probs.append(q)
            if i + 1 < k:  # the last draft token is never fed: its successor is not needed
                logits = self.lm.forward(token[:, None], logits_to_keep=1)[:, -1]
        d = torch.stack(tokens, dim=1)  # [1, K]
        q_all = torch.stack(probs, dim=1)  # [1, K, V]
        confidence = q_all.gather(-1, d[..., None]).squeeze(-1)
        return Proposal(tokens=d, probs=q_all, confidence=confidence)

    def rollback(self, length: int) -> None:
        self.lm.rollback(length)
