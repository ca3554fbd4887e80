"""One model's KV cache shared by many rows (:class:`SharedCache`), and the requests a
:class:`~relaxspec.engine.batching.Batcher` step hands it (per-row validity masks and logical
positions, rows joining and leaving, compaction: see :class:`SharedCache`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from relaxspec.engine.kv import (
    CachedLM,
    append_layer_row,
    model_logits,
    remove_layer_row,
    set_layer_kv,
)


@dataclass(eq=False)
class _Generation:
    """One running generation as the fair scheduler sees it."""

    cancel: threading.Event | None = None
    credit: float = 0.0  # seconds; < 0: it used more than its share of costly work (deferred)
    deferred: int = 0  # steps it was held back
    awake_since: float | None = None  # when its last forward or job returned to it
    served: int = -1  # the last step in which its costly work ran


@dataclass(eq=False)
class _Request:
    row: CachedLM | None  # None for an exclusive job
    tokens: torch.Tensor | None  # [1, L_i]
    keep: int  # logits of the last `keep` fed positions (0 = all)
    gen: _Generation | None = None
    job: Callable[[], Any] | None = None  # exclusive work (a private model's forward)
    held: int = 0  # consecutive steps held back for phase alignment
    prefill: _Prefill | None = None  # a joining row's prompt, part way fed
    result: Any = None
    error: BaseException | None = None
    done: bool = False


@dataclass(eq=False)
class _Prefill:
    """A joining row's prompt being fed a chunk per step into its own one-row cache."""

    cache: DynamicCache
    fed: int = 0  # prompt tokens in ``cache``
    logits: list[torch.Tensor] = field(default_factory=list)  # [1, kept, V] per chunk


def _layers(cache: DynamicCache):
    return cache.layers


class SharedCache:
    """One model's KV cache for many rows, with per-row validity masks.

    The shared cache is exact per row without copying caches around:

    - all rows have the same physical length ``T``; each row keeps a validity mask over its ``T``
      slots and the logical position of each slot;
    - a forward appends ``L`` slots to every row (``L`` = the longest input of the step); a row
      with fewer new tokens leaves the rest as holes;
    - rolling a row back only marks its slots beyond the kept length as holes;
    - the model sees the validity mask as a 2D attention mask and the logical positions as
      ``position_ids``, so a row attends exactly to its own committed tokens, in order, as it
      would alone; holes are compacted away when they outnumber valid slots.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.rows: list[CachedLM] = []
        self.cache: DynamicCache | None = None
        self.valid = torch.zeros((0, 0), dtype=torch.bool)  # [B, T]
        self.position = torch.zeros((0, 0), dtype=torch.long)  # [B, T] logical position of each slot

    @property
    def physical_length(self) -> int:
        return int(self.valid.shape[1])

    def index(self, row: CachedLM) -> int:
        return self.rows.index(row)

    # --- row membership -------------------------------------------------------------------

    @torch.inference_mode()
    def insert(self, row: CachedLM, single: DynamicCache, n: int) -> None:
        """Add ``row`` whose first ``n`` tokens are already in the one-row cache ``single``."""
        T = self.physical_length
        if self.cache is None or not self.rows:
            self.cache, self.rows = single, [row]
            self.valid = torch.ones((1, n), dtype=torch.bool)
            self.position = torch.arange(n)[None]
            return
        if n > T:  # widen every existing row with holes at the front
            self._pad_front(n - T)
            T = n
        for mine, theirs in zip(_layers(self.cache), _layers(single), strict=True):
            append_layer_row(mine, theirs.keys, theirs.values)
        valid = torch.zeros((1, T), dtype=torch.bool)
        valid[0, T - n :] = True
        position = torch.full((1, T), -1, dtype=torch.long)
        position[0, T - n :] = torch.arange(n)
        self.valid = torch.cat([self.valid, valid])
        self.position = torch.cat([self.position, position])
        self.rows.append(row)

    @torch.inference_mode()
    def remove(self, row: CachedLM) -> None:
        if row not in self.rows:
            return
        if len(self.rows) == 1:
            self.rows = []
            self.cache, self.valid, self.position = (
                None,
                torch.zeros((0, 0), dtype=torch.bool),
                torch.zeros((0, 0), dtype=torch.long),
            )
            return
        # the last row takes the leaving row's index: one row's slots move, not every row's
        b, last = self.index(row), len(self.rows) - 1
        for layer in _layers(self.cache):
            remove_layer_row(layer, b)
        self.rows[b] = self.rows[last]
        self.rows.pop()
        if b != last:
            self.valid[b], self.position[b] = self.valid[last], self.position[last]
        self.valid, self.position = self.valid[:last], self.position[:last]
        self._compact_if_sparse()

    @torch.inference_mode()
    def rollback(self, row: CachedLM, length: int) -> None:
        """Keep only the row's first ``length`` tokens (later slots become holes)."""
        if row in self.rows:
            b = self.index(row)
            self.valid[b] &= self.position[b] < length

    # --- storage maintenance --------------------------------------------------------------

    def _pad_front(self, n: int) -> None:
        def pad(x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, 0, n, 0))

        for layer in _layers(self.cache):
            set_layer_kv(layer, pad(layer.keys), pad(layer.values))
        B = len(self.rows)
        self.valid = torch.cat([torch.zeros((B, n), dtype=torch.bool), self.valid], dim=1)
        self.position = torch.cat([torch.full((B, n), -1, dtype=torch.long), self.position], dim=1)

    def _compact_if_sparse(self) -> None:
        """Drop holes when they outnumber valid slots: each row's valid slots move to the right
        end, in order (so the next appended tokens still follow them physically)."""
        if self.cache is None:
            return
        counts = self.valid.sum(dim=1)
        T, L = self.physical_length, int(counts.max())
        if T <= 2 * L + 32:
            return
        B = len(self.rows)
        # for each row, the physical indices of its valid slots, right-aligned into L columns
        order = torch.argsort(self.valid.int(), dim=1, stable=True)[:, T - L :]  # valid slots last, in order
        for layer in _layers(self.cache):
            idx = order[:, None, :, None].expand(B, layer.keys.shape[1], L, layer.keys.shape[3])
            set_layer_kv(layer, torch.gather(layer.keys, 2, idx), torch.gather(layer.values, 2, idx))
        self.valid = torch.gather(self.valid, 1, order)
        self.position = torch.where(self.valid, torch.gather(self.position, 1, order), -1)

    # --- the batched forward ---------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, requests: list[_Request]) -> None:
        """One forward for every row; each request's row gets its tokens, others only holes."""
        B, T = len(self.rows), self.physical_length
        L = max(r.tokens.shape[1] for r in requests)
        by_row = {id(r.row): r for r in requests}
        input_ids = torch.zeros((B, L), dtype=torch.long)
        new_valid = torch.zeros((B, L), dtype=torch.bool)
        new_pos = torch.full((B, L), -1, dtype=torch.long)
        for b, row in enumerate(self.rows):
            req = by_row.get(id(row))
            if req is None:
                continue
            n = req.tokens.shape[1]
            input_ids[b, :n] = req.tokens[0]
            new_valid[b, :n] = True
            new_pos[b, :n] = row.length + torch.arange(n)
        attention = torch.cat([self.valid, new_valid], dim=1).long()
        try:
            logits = model_logits(
                self.model, input_ids, self.cache, attention_mask=attention, position_ids=new_pos.clamp(min=0)
            )
        except BaseException:
            self.truncate(T)  # layers the failed forward already extended: back to T slots
            raise
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self.position = torch.cat([self.position, new_pos], dim=1)
        for b, row in enumerate(self.rows):
            req = by_row.get(id(row))
            if req is None:
                continue
            n = req.tokens.shape[1]
            keep = n if req.keep == 0 else min(req.keep, n)
            req.result = logits[b : b + 1, n - keep : n]
            row.length += n
        self.trim_and_compact()
        del T

    def trim_and_compact(self) -> None:
        """After a forward: crop trailing all-hole columns; compact if holes outnumber valid slots."""
        self._trim_tail()
        self._compact_if_sparse()

    def truncate(self, length: int) -> None:
        """Drop every slot from physical position ``length`` on (a failed forward's partial writes)."""
        for layer in _layers(self.cache):
            if layer.keys is not None and layer.keys.shape[-2] > length:
                layer.crop(length)

    def _trim_tail(self) -> None:
        """Crop trailing columns that are holes in every row."""
        if self.cache is None:
            return
        used = self.valid.any(dim=0).nonzero()
        last = int(used.max()) + 1 if len(used) else 0
        extra = self.physical_length - last
        if extra > 0:
            self.cache.crop(-extra)
            self.valid, self.position = self.valid[:, :last], self.position[:, :last]
