"""The verifier: a causal LM that scores ``[last committed, d_1..d_K]`` in one forward pass."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from relaxspec.core.sampling import SamplingParams, processed_probs
from relaxspec.engine.kv import make_lm


class Verifier:
    """Wraps the target (or any causal LM: ProVe's small verifier, the proposer in AR mode).

    Committed tokens the verifier has not seen yet — the previous cycle's last token, or a whole
    run of tokens a scheduler committed without verification — are prefilled in the same forward
    as the draft, so a cycle costs exactly one verifier call.
    """

    def __init__(self, model: PreTrainedModel, name: str = "target") -> None:
        self.lm = make_lm(model, name=name)

    @property
    def calls(self) -> int:
        return self.lm.calls

    @property
    def context_length(self) -> int:
        return self.lm.context_length

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.lm.reset()

    def score(self, ids: torch.Tensor, draft: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """Processed target laws ``p_1..p_{K+1}``: ``FloatTensor[1, K+1, V]``.

        ``ids[1, n]`` are the committed tokens, ``draft[1, K]`` the proposal (K may be 0: plain
        AR decoding). ``p_i`` is the distribution of position ``n + i``.
        """
        logits = self.lm.feed_committed(ids, draft, logits_to_keep=draft.shape[1] + 1)
        return processed_probs(logits, params)

    def rollback(self, length: int) -> None:
        self.lm.rollback(length)
