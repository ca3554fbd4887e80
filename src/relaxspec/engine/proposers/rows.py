"""Many requests' drafts in one batched forward: a block of slots on top of each request's cache.

The diffusion drafter (:class:`~relaxspec.engine.proposers.diffusion.DiffusionBatch`) and ProVe's
block proposer (:class:`~relaxspec.engine.proposers.block.BlockBatch`) draft the same way when
many requests run at once (vLLM's custom-proposer seam hands a step's rows together): each request
is a row of one position-indexed cache of its committed tokens
(:class:`~relaxspec.engine.batching.SharedCache`: per-row validity masks and logical positions,
holes compacted when they outnumber valid slots). A request's first draft prefills its committed
tokens alone (a long prompt never pads the batch) and joins; a draft then feeds, for every drafted
row at once, the committed tokens its cache lacks (causal) and a block of slots on top — attended
bidirectionally (diffusion) or causally (the block proposer's placeholders) — whose KV is cropped
after the forward. The predictor of block token 1 is the hidden state of the row's last committed
token, that of token j the hidden state of block slot j − 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from relaxspec.core.sampling import SamplingParams, check_finite
from relaxspec.engine.kv import cache_argument, cache_nbytes, new_cache
from relaxspec.engine.packed import packed_forward
from relaxspec.engine.proposers.base import Proposal
from relaxspec.errors import RelaxSpecError


def drafter_hidden(
    model: PreTrainedModel,
    cache: Any,
    tokens: torch.Tensor,
    allowed: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """One drafter forward with an explicit mask: final (normed) hidden states ``[B, Q, H]``.

    tokens, positions: LongTensor[B, Q]; allowed: BoolTensor[B|1, 1, Q, KV] (True = may attend),
    KV = the cache's length + Q. The cache grows by Q positions.
    """
    packed = packed_forward(model)
    device = next(model.parameters()).device
    dtype = torch.float32 if packed is not None else next(model.parameters()).dtype
    bias = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min).to(device)
    if packed is not None:
        return packed.hidden(tokens.to(device), cache, attention_mask=bias, position_ids=positions.to(device))
    decoder = model.get_decoder()
    return decoder(
        input_ids=tokens.to(device),
        attention_mask=bias,
        position_ids=positions.to(device),
        use_cache=True,
        **cache_argument(decoder, cache),
    ).last_hidden_state


def drafter_logits(model: PreTrainedModel, hidden: torch.Tensor, name: str = "drafter") -> torch.Tensor:
    """LM head on hidden states ``[..., H]`` -> float32 logits ``[..., V]`` (finite-checked)."""
    packed = packed_forward(model)
    with torch.inference_mode():
        head = packed.logits if packed is not None else model.get_output_embeddings()
        logits = head(hidden).float()
    check_finite(logits, f"the {name}")
    return logits


@dataclass(eq=False)
class DraftRow:
    """One request's row in :class:`DraftRows`: ``length`` committed tokens are cached."""

    key: str
    length: int = 0


@dataclass
class RowRequest:
    """Draft ``k`` tokens after ``ids[1, n]`` for the request ``key``."""

    key: str
    ids: torch.Tensor
    k: int
    params: SamplingParams
    generator: torch.Generator | None = None


class DraftRows:
    """The rows of many requests' drafts over one model (module doc).

    causal_block: block slots attend causally among themselves (the block proposer's
    placeholders) instead of to the whole block (the diffusion drafter).
    """

    def __init__(self, model: PreTrainedModel, causal_block: bool) -> None:
        from relaxspec.engine.batching import SharedCache  # the batched-cache bookkeeping

        self.model, self.causal_block = model, causal_block
        self.context_length = int(getattr(model.config, "max_position_embeddings", 2048))
        self.shared = SharedCache(model)
        self.rows: dict[str, DraftRow] = {}
        self.calls = 0  # batched forwards (joining rows' prefills not counted)

    def remove(self, key: str) -> None:
        """Free the row of request ``key`` (no-op if it has none)."""
        row = self.rows.pop(key, None)
        if row is not None:
            self.shared.remove(row)

    def cache_bytes(self) -> int:
        """Bytes of the shared cache's buffers (0 once every row is freed)."""
        return cache_nbytes(self.shared.cache)

    @staticmethod
    def in_groups(
        requests: Sequence[RowRequest],
        groups: Sequence[int],
        draft: Callable[[list[int], int], list[Proposal]],
    ) -> list[Proposal]:
        """Proposals for ``requests`` in their order: those with the same ``groups`` value (a
        block length) are drafted together by ``draft(indices, value)``, largest value first.
        Call it after validating every request: nothing has changed before it raises."""
        if len({r.key for r in requests}) != len(requests):
            raise RelaxSpecError("a request may be drafted at most once per batch")
        proposals: dict[int, Proposal] = {}
        for value in sorted(set(groups), reverse=True):
            indices = [i for i, g in enumerate(groups) if g == value]
            proposals.update(zip(indices, draft(indices, value), strict=True))
        return [proposals[i] for i in range(len(requests))]

    @staticmethod
    def first_hidden(
        joined: list[tuple[DraftRow, torch.Tensor | None]], fresh: list[torch.Tensor], hidden: torch.Tensor
    ) -> torch.Tensor:
        """``[R, H]``: each row's last committed token's hidden state — from its join prefill, else
        its last fresh slot of ``hidden`` (the forward that fed ``fresh``)."""
        return torch.stack(
            [h if h is not None else hidden[i, len(fresh[i]) - 1] for i, (_, h) in enumerate(joined)]
        )

    @staticmethod
    def predictors(first: torch.Tensor, hidden: torch.Tensor, offset: int, width: int) -> torch.Tensor:
        """``[R, width, H]``: the last committed token's state, then block slots 1 .. width − 1."""
        return torch.cat([first[:, None].to(hidden.dtype), hidden[:, offset : offset + width - 1]], dim=1)

    def join(self, request: RowRequest) -> tuple[DraftRow, torch.Tensor | None]:
        """The request's row and, for a row that joins now, its last committed token's hidden
        state ``[H]`` (a joining row's committed tokens are prefilled alone, all of them; a known
        row keeps at most all but the last, whose hidden state the next forward recomputes)."""
        n = request.ids.shape[1]
        row = self.rows.get(request.key)
        if row is not None:
            if row.length >= n:
                self.shared.rollback(row, n - 1)
                row.length = n - 1
            return row, None
        single = new_cache(self.model)
        causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
        hidden = drafter_hidden(self.model, single, request.ids, causal, torch.arange(n)[None])
        row = self.rows[request.key] = DraftRow(request.key, length=n)
        self.shared.insert(row, single, n)
        return row, hidden[0, -1]

    def forward(
        self,
        rows: list[DraftRow],
        fresh: list[torch.Tensor] | None,
        blocks: list[torch.Tensor],
        committed: list[int],
    ) -> tuple[torch.Tensor, int]:
        """One batched drafter forward over every row of the shared cache.

        Drafted row i (``rows[i]``, ``committed[i]`` tokens committed) feeds ``fresh[i]``, the
        committed tokens its cache lacks (step 0 only), then its γ block slots ``blocks[i]``;
        other rows feed holes. A fresh slot attends causally (its row's valid cached slots and
        the fresh slots up to its own), a block slot to all of its row's committed slots and to
        the whole block (or, with ``causal_block``, to the block slots up to its own); a hole only
        to itself. Returns the drafted rows' hidden states ``[R, L + γ, H]`` and ``L``, the
        block's offset; the fresh slots stay in the cache (as valid slots of their rows), the
        block slots are cropped.
        """
        shared = self.shared
        B, T, gamma = len(shared.rows), shared.physical_length, blocks[0].shape[0]
        L = max((len(f) for f in fresh), default=0) if fresh is not None else 0
        Q = L + gamma
        at = {id(row): b for b, row in enumerate(shared.rows)}
        tokens = torch.zeros((B, Q), dtype=torch.long)
        positions = torch.zeros((B, Q), dtype=torch.long)
        fed = torch.zeros((B, L), dtype=torch.bool)  # valid fresh committed slots
        in_block = torch.zeros((B, 1), dtype=torch.bool)  # drafted rows
        for i, row in enumerate(rows):
            b, f = at[id(row)], 0 if fresh is None else len(fresh[i])
            if f:
                tokens[b, :f], positions[b, :f], fed[b, :f] = fresh[i], row.length + torch.arange(f), True
            tokens[b, L:], positions[b, L:] = blocks[i], committed[i] + torch.arange(gamma)
            in_block[b] = True
        committed_keys = torch.cat([shared.valid, fed], dim=1)  # [B, T + L]
        allowed = torch.zeros((B, Q, T + Q), dtype=torch.bool)
        allowed[:, :L, : T + L] = fed[:, :, None] & committed_keys[:, None, :]
        allowed[:, :L, T : T + L] &= torch.ones(L, L, dtype=torch.bool).tril()
        allowed[:, L:, : T + L] = in_block[:, :, None] & committed_keys[:, None, :]
        allowed[:, L:, T + L :] = in_block[:, :, None]
        if self.causal_block:
            allowed[:, L:, T + L :] &= torch.ones(gamma, gamma, dtype=torch.bool).tril()
        slot = torch.arange(Q)
        allowed[:, slot, T + slot] |= ~torch.cat(
            [fed, in_block.expand(B, gamma)], dim=1
        )  # holes see themselves
        try:
            hidden = drafter_hidden(self.model, shared.cache, tokens, allowed[:, None], positions)
        except BaseException:
            shared.truncate(T)  # layers the failed forward already extended: back to T slots
            raise
        self.calls += 1
        shared.cache.crop(-gamma)  # the block slots' KV never survives a step
        shared.valid = torch.cat([shared.valid, fed], dim=1)
        shared.position = torch.cat([shared.position, torch.where(fed, positions[:, :L], -1)], dim=1)
        for i, row in enumerate(rows):
            row.length += 0 if fresh is None else len(fresh[i])
        drafted = hidden[[at[id(row)] for row in rows]]
        if L:
            shared.trim_and_compact()
        return drafted, L
