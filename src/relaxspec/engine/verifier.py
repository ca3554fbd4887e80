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
        self.last_logits: torch.Tensor | None = None  # raw logits [1, K+1, V] of the last score
        self.fed_logits: torch.Tensor | None = None  # with keep_fed: [1, fed, V], every fed position

    @property
    def calls(self) -> int:
        return self.lm.calls

    @property
    def context_length(self) -> int:
        return self.lm.context_length

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.lm.reset()

    def score(
        self, ids: torch.Tensor, draft: torch.Tensor, params: SamplingParams, keep_fed: bool = False
    ) -> torch.Tensor:
        """Processed target laws ``p_1..p_{K+1}``: ``FloatTensor[1, K+1, V]``.

        ``ids[1, n]`` are the committed tokens, ``draft[1, K]`` the proposal (K may be 0: plain
        AR decoding). ``p_i`` is the distribution of position ``n + i``. The raw logits of those
        positions stay in :attr:`last_logits` (logprobs); with ``keep_fed`` the logits of every
        fed position (the prompt's too, on the first call) stay in :attr:`fed_logits`.
        """
        keep = draft.shape[1] + 1
        logits = self.lm.feed_committed(ids, draft, logits_to_keep=0 if keep_fed else keep)
        self.fed_logits = logits if keep_fed else None
        self.last_logits = logits[:, -keep:]
        return processed_probs(self.last_logits, params)

    def rollback(self, length: int) -> None:
        self.lm.rollback(length)
