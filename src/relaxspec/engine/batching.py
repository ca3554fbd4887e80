"""Continuous batching: concurrent generations share one batched forward per model per step.

Each request runs the ordinary :class:`~relaxspec.engine.loop.Engine` loop in its own thread. Inside a
:func:`~relaxspec.engine.kv.lm_factory` block created by a :class:`Batcher`, every :class:`CachedLM` an
engine builds is a :class:`RowLM`: a *row* of a :class:`SharedCache` that holds one KV cache for
all sequences decoded with that model. A ``RowLM.forward`` does not run the model itself; it hands
its tokens to the batcher and waits. When every active sequence is waiting on some forward (the
engine loops run in lockstep), the last thread to arrive runs one batched forward per model and
wakes the others. Requests join and leave between steps; rows accept different amounts.

The shared cache is exact per row without copying caches around:

- all rows have the same physical length ``T``; each row keeps a validity mask over its ``T``
  slots and the logical position of each slot;
- a forward appends ``L`` slots to every row (``L`` = the longest input of the step); a row with
  fewer new tokens leaves the rest as holes;
- rolling a row back only marks its slots beyond the kept length as holes;
- the model sees the validity mask as a 2D attention mask and the logical positions as
  ``position_ids``, so a row attends exactly to its own committed tokens, in order, as it would
  alone; holes are compacted away when they outnumber valid slots.

A new row's prompt is prefilled alone and then inserted, so long prompts never pad the batch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from relaxspec.core.sampling import check_finite
from relaxspec.engine.kv import CachedLM, lm_factory, model_logits


@dataclass
class _Request:
    row: RowLM
    tokens: torch.Tensor  # [1, L_i]
    keep: int  # logits of the last `keep` fed positions (0 = all)
    result: torch.Tensor | None = None
    error: BaseException | None = None
    done: bool = False


def _layers(cache: DynamicCache):
    return cache.layers


class SharedCache:
    """One model's KV cache for many rows, with per-row validity masks (see the module doc)."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.rows: list[RowLM] = []
        self.cache: DynamicCache | None = None
        self.valid = torch.zeros((0, 0), dtype=torch.bool)  # [B, T]
        self.position = torch.zeros((0, 0), dtype=torch.long)  # [B, T] logical position of each slot

    @property
    def physical_length(self) -> int:
        return int(self.valid.shape[1])

    def index(self, row: RowLM) -> int:
        return self.rows.index(row)

    # --- row membership -------------------------------------------------------------------

    @torch.inference_mode()
    def insert(self, row: RowLM, single: DynamicCache, n: int) -> None:
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
            pad = T - n
            k = torch.nn.functional.pad(theirs.keys, (0, 0, pad, 0))
            v = torch.nn.functional.pad(theirs.values, (0, 0, pad, 0))
            mine.keys = torch.cat([mine.keys, k], dim=0)
            mine.values = torch.cat([mine.values, v], dim=0)
        valid = torch.zeros((1, T), dtype=torch.bool)
        valid[0, T - n :] = True
        position = torch.full((1, T), -1, dtype=torch.long)
        position[0, T - n :] = torch.arange(n)
        self.valid = torch.cat([self.valid, valid])
        self.position = torch.cat([self.position, position])
        self.rows.append(row)

    @torch.inference_mode()
    def remove(self, row: RowLM) -> None:
        if row not in self.rows:
            return
        keep = [i for i, r in enumerate(self.rows) if r is not row]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache, self.valid, self.position = (
                None,
                torch.zeros((0, 0), dtype=torch.bool),
                torch.zeros((0, 0), dtype=torch.long),
            )
            return
        idx = torch.tensor(keep)
        for layer in _layers(self.cache):
            layer.keys, layer.values = layer.keys[idx], layer.values[idx]
        self.valid, self.position = self.valid[idx], self.position[idx]
        self._compact_if_sparse()

    @torch.inference_mode()
    def rollback(self, row: RowLM, length: int) -> None:
        """Keep only the row's first ``length`` tokens (later slots become holes)."""
        if row in self.rows:
            b = self.index(row)
            self.valid[b] &= self.position[b] < length

    # --- storage maintenance --------------------------------------------------------------

    def _pad_front(self, n: int) -> None:
        for layer in _layers(self.cache):
            layer.keys = torch.nn.functional.pad(layer.keys, (0, 0, n, 0))
            layer.values = torch.nn.functional.pad(layer.values, (0, 0, n, 0))
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
            layer.keys = torch.gather(layer.keys, 2, idx)
            layer.values = torch.gather(layer.values, 2, idx)
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
        logits = model_logits(
            self.model, input_ids, self.cache, attention_mask=attention, position_ids=new_pos.clamp(min=0)
        )
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
        self._trim_tail()
        self._compact_if_sparse()
        del T

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


class RowLM(CachedLM):
    """A :class:`CachedLM` whose cache is one row of a :class:`SharedCache` (batched forwards)."""

    def __init__(self, model: PreTrainedModel, name: str, batcher: Batcher) -> None:
        self.batcher = batcher
        super().__init__(model, name)

    def reset(self) -> None:
        batcher = getattr(self, "batcher", None)
        if batcher is not None:
            batcher.release(self)
        self.length = 0

    def forward(self, tokens: torch.Tensor, logits_to_keep: int = 0) -> torch.Tensor:
        self._check_room(tokens.shape[1])
        logits = self.batcher.submit(self, tokens, logits_to_keep)
        self.calls += 1
        check_finite(logits, f"the {self.name}")
        return logits

    def rollback(self, length: int) -> None:
        if length < self.length:
            self.batcher.rollback(self, length)
            self.length = length


@dataclass
class Batcher:
    """Lockstep coordinator of the sequences registered with it (one per running request)."""

    active: int = 0
    steps: int = 0  # batched forward passes run
    rows_per_step: list[int] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _pending: list[_Request] = field(default_factory=list)
    _shared: dict[int, SharedCache] = field(default_factory=dict)

    @contextmanager
    def building(self) -> Iterator[list[RowLM]]:
        """Engines built inside this block get batched rows; yields the list of rows made."""
        rows: list[RowLM] = []

        def make(model: PreTrainedModel, name: str) -> CachedLM:
            row = RowLM(model, name, self)
            rows.append(row)
            return row

        with lm_factory(make):
            yield rows

    @contextmanager
    def running(self, rows: list[RowLM]) -> Iterator[None]:
        """Register one generation (its engine's ``rows``) while it runs; free its rows after."""
        with self._cond:
            self.active += 1
        try:
            yield
        finally:
            with self._cond:
                for row in rows:
                    self._release_locked(row)
                self.active -= 1
                self._maybe_run_locked()

    def _shared_for(self, model: PreTrainedModel) -> SharedCache:
        shared = self._shared.get(id(model))
        if shared is None:
            shared = self._shared[id(model)] = SharedCache(model)
        return shared

    def submit(self, row: RowLM, tokens: torch.Tensor, keep: int) -> torch.Tensor:
        with self._cond:
            req = _Request(row, tokens.cpu(), keep)
            self._pending.append(req)
            self._maybe_run_locked()
            while not req.done:
                self._cond.wait()
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def rollback(self, row: RowLM, length: int) -> None:
        with self._cond:
            shared = self._shared.get(id(row.model))
            if shared is not None:
                shared.rollback(row, length)

    def release(self, row: RowLM) -> None:
        with self._cond:
            self._release_locked(row)

    def _release_locked(self, row: RowLM) -> None:
        shared = self._shared.get(id(row.model))
        if shared is not None:
            shared.remove(row)

    def _maybe_run_locked(self) -> None:
        """Run the step once every active sequence is waiting on a forward."""
        if not self._pending or len(self._pending) < self.active:
            return
        pending, self._pending = self._pending, []
        groups: dict[int, list[_Request]] = {}
        for req in pending:
            groups.setdefault(id(req.row.model), []).append(req)
        for reqs in groups.values():
            self._run_group(reqs)
        for req in pending:
            req.done = True
        self._cond.notify_all()

    def _run_group(self, reqs: list[_Request]) -> None:
        shared = self._shared_for(reqs[0].row.model)
        batched = []
        for req in reqs:
            if req.row not in shared.rows:  # a new row: prefill alone, then join the batch
                try:
                    self._prefill(shared, req)
                except Exception as err:
                    req.error = err
            else:
                batched.append(req)
        if batched:
            try:
                shared.forward(batched)
                self.steps += 1
                self.rows_per_step.append(len(batched))
            except Exception as err:
                for req in batched:
                    req.error = err

    @torch.inference_mode()
    def _prefill(self, shared: SharedCache, req: _Request) -> None:
        single = DynamicCache(config=req.row.model.config)
        n = req.tokens.shape[1]
        logits = model_logits(req.row.model, req.tokens, single)
        keep = n if req.keep == 0 else min(req.keep, n)
        req.result = logits[:, n - keep :]
        shared.insert(req.row, single, n)
        req.row.length = n
