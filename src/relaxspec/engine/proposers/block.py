"""BlockProposer: a MARS block proposer drafts k tokens in one causal forward (ProVe §2, docs/design.md §4).

One forward over ``[committed tokens not yet cached, k−1 placeholders]`` on the proposer's own
cache yields k next-token distributions: the output at the last real token (position n−1) is the
ordinary AR law of token n, the output at placeholder j (position n−1+j) is the law of token n+j.
Each draft token is drawn independently from its processed law ``q_i`` (argmax when greedy), so
``q_i`` is exactly the law ``d_i`` was drawn from — which keeps the ``Exact`` rule exact when the
proposer verifies itself (``prove-lossless`` at temperature > 0) — and the confidence is
``q_i(d_i)``.

KV of placeholder inputs never survives a cycle: the cache is cropped back to the committed
length right after the forward, so it only ever holds committed tokens.

:class:`FusedBlockProposer` is the same block model drafting inside its own verification forward
(``prove-lossless``): placeholders after the drafts the verifier checks, their laws the next block.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from relaxspec.core.sampling import SamplingParams, processed_probs, sample
from relaxspec.engine.kv import make_lm
from relaxspec.engine.proposers.base import Proposal
from relaxspec.engine.proposers.rows import DraftRows, RowRequest, drafter_logits
from relaxspec.errors import RelaxSpecError, check_int

# Config attributes a block proposer carries (written by relaxspec.train.block at training).
BLOCK_SIZE_ATTR = "mars_block_size"
MASK_ID_ATTR = "mars_mask_token_id"


def mask_token_id_of(tokenizer: PreTrainedTokenizerBase, where: str = "the tokenizer") -> int:
    """The placeholder id (the tokenizer's mask token); a clear error if it has none."""
    mask_id = tokenizer.mask_token_id
    if mask_id is None:
        raise RelaxSpecError(
            f"{where} has no mask token: a block proposer needs a placeholder token "
            "(add one, e.g. tokenizer.add_special_tokens({'mask_token': '<|mask|>'}))"
        )
    return int(mask_id)


def trained_block_size(model: PreTrainedModel, where: str = "the block model") -> int:
    """The block size a proposer was trained with (``config.mars_block_size``); clear error if none."""
    size = getattr(model.config, BLOCK_SIZE_ATTR, None)
    if not isinstance(size, int) or size < 1:
        raise RelaxSpecError(
            f"{where} is not a block proposer (its config has no {BLOCK_SIZE_ATTR}); "
            "train one with `relaxspec train block`"
        )
    return size


def check_block_size(block_size: object, trained: int) -> int:
    """``block_size`` must be an integer in ``[1, trained]``."""
    check_int("block_size", block_size, 1)
    if block_size > trained:
        raise RelaxSpecError(
            f"block_size {block_size} is larger than the block size the proposer was trained with "
            f"({trained}); its deeper placeholder positions were never trained"
        )
    return block_size


def block_settings(model: PreTrainedModel, block_size: int, mask_token_id: int | None) -> tuple[int, int]:
    """Validated ``(block_size, placeholder id)`` (default: the id recorded at training)."""
    block_size = check_block_size(block_size, trained_block_size(model))
    if mask_token_id is None:
        mask_token_id = getattr(model.config, MASK_ID_ATTR, None)
    vocab = model.get_input_embeddings().weight.shape[0]
    if not isinstance(mask_token_id, int) or not 0 <= mask_token_id < vocab:
        raise RelaxSpecError(
            f"the block proposer needs a placeholder token id in [0, {vocab}), got {mask_token_id!r}"
        )
    return block_size, mask_token_id


def draw_block(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
    """``d_1..d_k`` from the block's raw logits ``[1, k, V]`` (ProVe §2): ``q_i`` processed laws,
    each token drawn from its own (argmax when greedy), confidence ``q_i(d_i)``."""
    q = processed_probs(logits, params)  # [1, k, V]
    tokens = sample(q, generator, params.greedy)  # [1, k]
    confidence = q.gather(-1, tokens[..., None]).squeeze(-1)  # [1, k]
    return Proposal(tokens=tokens, probs=q, confidence=confidence)


# The fused layout's block cut (FusedBlockProposer.min_confidence): measured on the bundled block
# model, tokens per verifier forward on math 2.47 (no cut), 2.75 (0.3), 2.76 (0.4), 2.62 (0.6);
# code 1.54 -> 1.64 at 0.3 (docs/vllm-proposers.md, session 19).
DEFAULT_MIN_CONFIDENCE = 0.3


def check_min_confidence(value: object) -> float:
    """The fused layout's block cut: a number in [0, 1) (None: :data:`DEFAULT_MIN_CONFIDENCE`)."""
    if value is None:
        return DEFAULT_MIN_CONFIDENCE
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise RelaxSpecError(f"min_confidence must be a number in [0, 1), got {value!r}")
    return float(value)


def check_fused_block_size(block_size: int) -> int:
    """A fused block drafts ``block_size − 1`` tokens after the verifier's own: at least 2."""
    if block_size < 2:
        raise RelaxSpecError("a fused block needs block_size >= 2 (at least 2: a block of 1 drafts nothing)")
    return block_size


def draw_next_block(
    laws: torch.Tensor, mask_id: int, greedy: bool, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused layout's drafts from the verifier's processed laws at placeholder slots ``[m, V]``:
    ``(tokens [m], q [m, V])``, q the law each token is drawn from (argmax when greedy) with the
    placeholder id removed, so a draft is never mistaken for a placeholder."""
    q = laws.float().clone()
    q[:, mask_id] = 0.0
    q = q / q.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)
    return sample(q, generator, greedy), q


def cut_block(tokens: torch.Tensor, q: torch.Tensor, min_confidence: float) -> int:
    """How many of the drafts ``tokens [m]`` (drawn from ``q [m, V]``) to keep: all before the
    first one its law gives less than ``min_confidence``."""
    if min_confidence <= 0 or tokens.numel() == 0:
        return int(tokens.numel())
    unlikely = (q[torch.arange(tokens.numel()), tokens] < min_confidence).nonzero()
    return int(unlikely[0]) if len(unlikely) else int(tokens.numel())


class FusedBlockProposer:
    """ProVe's block model drafting inside its own verification forward (``prove-lossless``).

    When the verifier *is* the block model, a block draft ``[last real token, placeholder ×
    (B − 1)]`` is a causal forward with the verify forward's layout, so one forward can do both:
    the engine feeds the verifier ``[last committed, d_1..d_r, placeholder × (B − 1)]``
    (:meth:`placeholders`); it verifies ``d_1..d_r`` as usual and, when all r are accepted and the
    token after them is emitted, the verifier's laws at the placeholders are the block model's
    laws of the B − 1 tokens after that token (ProVe §2's block layout with the accepted drafts as
    context): :meth:`receive` draws them (:func:`draw_next_block`) as the next cycle's drafts,
    cut before the first draft its law gives less than ``min_confidence`` (a rejection costs a
    cycle that verifies nothing). After a rejection the next cycle has no drafts: it emits the
    verifier's own token and draws a fresh block. No forward and no cache of its own (``calls``
    stays 0). The vLLM plugin's fused seam runs the same layout inside vLLM.
    """

    name = "block-fused"
    fused = True  # the engine runs its fused cycle (Engine._fused_cycle)

    def __init__(
        self,
        model: PreTrainedModel,
        block_size: int,
        mask_token_id: int | None = None,
        min_confidence: float | None = None,
    ) -> None:
        self.block_size, self.mask_token_id = block_settings(model, block_size, mask_token_id)
        check_fused_block_size(self.block_size)
        self.min_confidence = check_min_confidence(min_confidence)
        self.vocab = int(model.get_output_embeddings().weight.shape[0])
        self.pending: tuple[int, Proposal] | None = None  # (committed length it follows, drafts)
        self.calls = 0

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.pending = None

    def propose(
        self, ids: torch.Tensor, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        """The drafts the last cycle drew, at most ``k``, if they follow ``ids[1, n]``; else none
        (``tokens [1, 0]``)."""
        pending, self.pending = self.pending, None
        if pending is None or pending[0] != ids.shape[1]:
            empty = torch.empty((1, 0), dtype=torch.long, device=ids.device)
            no_law = torch.empty((1, 0, self.vocab), device=ids.device)
            return Proposal(tokens=empty, probs=no_law, confidence=torch.empty((1, 0), device=ids.device))
        proposal = pending[1]
        return Proposal(proposal.tokens[:, :k], proposal.probs[:, :k], proposal.confidence[:, :k])

    def placeholders(self, room: int, device: torch.device) -> torch.Tensor:
        """``[1, m]`` placeholders to feed after the drafts, ``m = min(B − 1, room)``."""
        return torch.full((1, max(0, min(self.block_size - 1, room))), self.mask_token_id, device=device)

    def receive(
        self, length: int, laws: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
    ) -> None:
        """Draw the next cycle's drafts from the verifier's laws at the placeholders ``[m, V]``;
        they follow the first ``length`` committed tokens."""
        tokens, q = draw_next_block(laws, self.mask_token_id, params.greedy, generator)
        keep = cut_block(tokens, q, self.min_confidence)
        if keep == 0:
            return
        tokens, q = tokens[None, :keep], q[None, :keep]
        confidence = q.gather(-1, tokens[..., None]).squeeze(-1)
        self.pending = (length, Proposal(tokens=tokens, probs=q, confidence=confidence))

    def rollback(self, length: int) -> None:
        """Nothing cached: the pending drafts carry the length they follow."""


class BlockProposer:
    """Draft up to ``block_size`` tokens per cycle with one forward of a block-trained causal LM.

    model: a causal LM trained by :mod:`relaxspec.train.block` (config carries
    ``mars_block_size``). block_size: tokens per proposal, ``1 ≤ block_size ≤ trained``.
    mask_token_id: the placeholder id (default: the one recorded in the config at training).
    """

    name = "block"

    def __init__(self, model: PreTrainedModel, block_size: int, mask_token_id: int | None = None) -> None:
        self.block_size, self.mask_token_id = block_settings(model, block_size, mask_token_id)
        self.lm = make_lm(model, name="block proposer")

    @classmethod
    def from_pretrained(
        cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, block_size: int
    ) -> BlockProposer:
        """Validate block size and placeholder against ``tokenizer`` (one clear error each)."""
        mask_id = mask_token_id_of(tokenizer, "the block proposer's tokenizer")
        return cls(model, block_size, mask_id)

    @property
    def calls(self) -> int:
        return self.lm.calls

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.lm.reset()

    def block_logits(self, ids: torch.Tensor, k: int) -> torch.Tensor:
        """Raw logits of the next ``k`` tokens after ``ids[1, n]``: ``FloatTensor[1, k, V]``.

        One forward over the uncached committed tail and ``k−1`` placeholders; the cache is
        cropped back to the ``n`` committed tokens before returning.
        """
        if not 1 <= k <= self.block_size:
            raise RelaxSpecError(f"a block proposal has 1..{self.block_size} tokens, asked for {k}")
        n = ids.shape[1]
        placeholders = torch.full((1, k - 1), self.mask_token_id, dtype=torch.long, device=ids.device)
        logits = self.lm.feed_committed(ids, placeholders, logits_to_keep=k)  # [1, k, V]
        self.lm.rollback(n)  # drop the placeholder KV at once
        return logits

    def propose(
        self, ids: torch.Tensor, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        """Draft ``d_1..d_k`` (ProVe §2): ``q_i`` processed laws, confidence ``q_i(d_i)``."""
        return draw_block(self.block_logits(ids, k), params, generator)

    def rollback(self, length: int) -> None:
        self.lm.rollback(length)


class BlockBatch(DraftRows):
    """The block proposer for many requests at once: one batched forward drafts every row's block.

    Each request is a row of one cache of committed tokens (:class:`DraftRows`); a draft feeds
    every drafted row's uncached committed tokens and k placeholders (causal: as
    :meth:`BlockProposer.block_logits` feeds k − 1 — the last placeholder's output is not used,
    and causal attention keeps it from changing the others), crops the placeholders, and draws
    each row's tokens as :class:`BlockProposer` does: a row's draft equals its solo draft (up to
    floating-point summation order). :meth:`remove` frees a finished request's row.
    """

    name = "block"

    def __init__(self, model: PreTrainedModel, block_size: int, mask_token_id: int | None = None) -> None:
        self.block_size, self.mask_token_id = block_settings(model, block_size, mask_token_id)
        super().__init__(model, causal_block=True)

    @torch.inference_mode()
    def propose(self, requests: list[RowRequest]) -> list[Proposal]:
        """One proposal per request, in order (each request's key at most once); rows asking for
        different k are drafted in one forward per k."""
        for r in requests:
            room = self.context_length - r.ids.shape[1]
            if not 1 <= r.k <= min(self.block_size, room):
                raise RelaxSpecError(
                    f"a block proposal has 1..{min(self.block_size, room)} tokens here, asked for {r.k}"
                )
        return self.in_groups(
            requests,
            [r.k for r in requests],
            lambda idx, k: self._propose_rows([requests[i] for i in idx], k),
        )

    def _propose_rows(self, requests: list[RowRequest], k: int) -> list[Proposal]:
        joined = [self.join(r) for r in requests]
        rows = [row for row, _ in joined]
        fresh = [r.ids[0, row.length :] for r, row in zip(requests, rows, strict=True)]
        placeholders = torch.full((k,), self.mask_token_id, dtype=torch.long)
        hidden, offset = self.forward(
            rows, fresh, [placeholders] * len(rows), [r.ids.shape[1] for r in requests]
        )
        predictors = self.predictors(self.first_hidden(joined, fresh, hidden), hidden, offset, k)  # [R, k, H]
        logits = drafter_logits(self.model, predictors, "block proposer")  # [R, k, V]
        return [draw_block(logits[i][None], r.params, r.generator) for i, r in enumerate(requests)]
