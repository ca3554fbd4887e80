"""Continuous batching: concurrent generations share one batched forward per model per step.

Each request runs the ordinary :class:`~relaxspec.engine.loop.Engine` loop in its own thread. Inside a
:func:`~relaxspec.engine.kv.lm_factory` block created by a :class:`Batcher`, every :class:`CachedLM` an
engine builds is a :class:`RowLM`: a *row* of a :class:`~relaxspec.engine.shared_cache.SharedCache`
that holds one KV cache for all sequences decoded with that model. A ``RowLM.forward`` hands its
tokens to the batcher and waits; when every active sequence waits, the last thread to arrive runs
one batched forward per model and wakes the others. Rows join and leave between steps.

:class:`Batcher` also holds the lanes (rows grouped by prompt length), fair scheduling
(docs/design.md §7: one request must not stall the others) and phase alignment (the whole batch
verifies in one forward); its docstring says how. Measured effects: docs/performance.md §1 and §6.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from transformers import PreTrainedModel

from relaxspec.core.sampling import check_finite
from relaxspec.engine.kv import (
    CachedLM,
    lm_factory,
    model_logits,
    new_cache,
)
from relaxspec.engine.shared_cache import SharedCache, _Generation, _Prefill, _Request
from relaxspec.errors import Cancelled

CANCEL_POLL_SECONDS = 0.05  # how often a waiting generation checks its cancel event


_PARAMETERS: dict[int, int] = {}


def _parameters(model: PreTrainedModel) -> int:
    """Parameter count of ``model`` (memoized by id: models live as long as the server)."""
    count = _PARAMETERS.get(id(model))
    if count is None:
        count = _PARAMETERS[id(model)] = sum(p.numel() for p in model.parameters())
    return count


class RowLM(CachedLM):
    """A :class:`CachedLM` whose cache is one row of a :class:`SharedCache` (batched forwards)."""

    def __init__(self, model: PreTrainedModel, name: str, batcher: Batcher) -> None:
        self.batcher = batcher
        self.lane = 0  # which of its model's shared caches it joins (set by its prompt's length)
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
    """Lockstep coordinator of the sequences registered with it (one per running request).

    long_input: a row's forward of more tokens than this is costly (it pads the whole batch);
    long_context: a row whose prompt has more tokens than this decodes in a lane of longer rows,
    and all its work is costly; prefill_chunk: prompt tokens a joining row feeds per step;
    share: the time the generations in debt earn, together, per second the others step.

    A new row's prompt is prefilled alone, ``prefill_chunk`` tokens per step, and then inserted, so
    long prompts never pad the batch and never hold a step for their whole length.

    Lanes. A batched forward attends over the shared cache's whole physical length, so a short row
    beside a 900-token row would pay for 900 slots (holes) at every step. A row therefore joins a
    *lane* of its model by its prompt's length (0 up to ``long_context`` tokens, then one lane per
    doubling); each lane has its own shared cache and its own forward.

    Fair scheduling. Lockstep alone would let one request with costly cycles set everyone's pace.
    So the batcher tells *cheap* work (a row's forward of at most ``long_input`` tokens in lane 0, a
    short prefill) from *costly* work: a row's forward of more tokens (it pads every row of the
    batch), every forward of a long-context lane, the chunks of a long prompt's prefill, and
    exclusive jobs, the forwards of models an engine runs privately (the diffusion drafter, whose
    block mask cannot share a batch), routed through the step loop one forward at a time. Each unit
    of a step (a lane's batched forward, a prefill chunk, a job) is timed; costly units are charged
    to their generations' ``credit`` (seconds), and so is, while others run, a generation's own
    work between forwards (sampling, the rule, stop strings: it competes for the CPU and the GIL).
    Cost thus follows the tokens processed and the context they attend to, not the number of
    requests. While cheap work of others is waiting, a generation in debt is deferred, and the
    generations deferred in a step share ``share`` × the time the others' work took: heavy requests
    together get about ``share`` seconds per second of the others', who keep about
    ``1 / (1 + share)`` of their pace alone; with nothing else waiting heavy work runs at full speed
    (work-conserving). A step runs at most one costly unit (that of the generation served longest
    ago), so a request that arrives waits at most one unit to join.

    Phase alignment. A batched forward runs every row of its model's shared cache, so it costs the
    same whether one row or all of them asked for it. Rows of a speculative method alternate
    between proposer forwards (K draft steps) and one verifier forward per cycle; rows that joined
    at different times land in different phases, and every step would run a full verify for the
    few rows that reached it plus a draft forward for the rest (docs/performance.md §6, "The batch
    verifies whole again"). So while rows of a smaller model are pending, requests for the largest
    model are held (at most ``max_hold`` steps in a row): the drafting rows catch up and the whole
    batch verifies in one forward. Holding costs little: the held rows wait for draft forwards of a
    model many times smaller.

    A forward that raises fails only the rows that cause it: the shared cache is restored and the
    rows are retried one by one. A generation whose ``cancel`` event is set leaves while it waits.
    """

    long_input: int = 32
    long_context: int = 256
    prefill_chunk: int = 32
    share: float = 0.15
    max_hold: int = 8  # steps a largest-model request may wait for smaller models' rows (phase alignment)
    active: int = 0
    steps: int = 0  # batched forward passes run
    steps_run: int = 0  # scheduling steps
    rows_per_step: list[int] = field(default_factory=list)
    exclusive_jobs: int = 0  # private-model forwards run through the step loop
    deferrals: int = 0  # times a generation in debt was held back for a step
    aligned_holds: int = 0  # requests held back a step for phase alignment
    retried_rows: int = 0  # rows re-run alone after a batched forward failed
    prefill_seconds: float = 0.0  # wall time of joining rows' prefills (the batch waits through them)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _pending: list[_Request] = field(default_factory=list)
    _shared: dict[tuple[int, int], SharedCache] = field(default_factory=dict)  # (id(model), lane)
    _local: threading.local = field(default_factory=threading.local)

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
    def running(
        self, rows: list[RowLM], cancel: threading.Event | None = None, engine: Any = None
    ) -> Iterator[None]:
        """Register one generation (its engine's ``rows``) while it runs in this thread; free its
        rows after. ``engine``: its private models' forwards become exclusive jobs (fair-share
        scheduled); ``cancel``: once set, a wait of this generation raises
        :class:`~relaxspec.errors.Cancelled`."""
        gen = _Generation(cancel)
        gated = self._gate(engine, gen) if engine is not None else []
        self._local.gen = gen
        with self._cond:
            self.active += 1
        try:
            yield
        finally:
            self._local.gen = None
            for lm, name in gated:
                delattr(lm, name)  # the class's own method again
            with self._cond:
                for row in rows:
                    self._release_locked(row)
                self.active -= 1
                self._maybe_run_locked()

    def _gate(self, engine: Any, gen: _Generation) -> list[tuple[CachedLM, str]]:
        """Route the forwards of ``engine``'s private (non-row) models through :meth:`_exclusive`."""
        gated = []
        for part in (engine.verifier, engine.shadow, engine.proposer):
            lm = getattr(part, "lm", None)
            if not isinstance(lm, CachedLM) or isinstance(lm, RowLM):
                continue
            for name in ("forward", "forward_block"):
                method = getattr(lm, name, None)
                if method is not None:

                    def gated_call(*args: Any, _method: Callable = method, **kwargs: Any) -> Any:
                        return self._exclusive(gen, lambda: _method(*args, **kwargs))

                    setattr(lm, name, gated_call)
                    gated.append((lm, name))
        return gated

    def lane_of(self, prompt_tokens: int) -> int:
        """The lane of a row joining with this many prompt tokens: 0 up to ``long_context``, then
        one per doubling. Each lane of a model has its own shared cache, so the forward of a short
        row never attends over (the holes beside) a long row's slots."""
        if prompt_tokens <= self.long_context:
            return 0
        return math.ceil(math.log2(prompt_tokens / self.long_context))

    def _shared_for(self, model: PreTrainedModel, lane: int = 0) -> SharedCache:
        shared = self._shared.get((id(model), lane))
        if shared is None:
            shared = self._shared[(id(model), lane)] = SharedCache(model)
        return shared

    def _shared_of(self, row: RowLM) -> SharedCache | None:
        return self._shared.get((id(row.model), row.lane))

    def submit(self, row: RowLM, tokens: torch.Tensor, keep: int) -> torch.Tensor:
        req = _Request(row, tokens.cpu(), keep, getattr(self._local, "gen", None))
        self._run(req)
        assert req.result is not None
        return req.result

    def _exclusive(self, gen: _Generation, job: Callable[[], Any]) -> Any:
        """Run ``job`` (a private model's forward) inside a step, as costly work of ``gen``."""
        req = _Request(None, None, 0, gen, job)
        self._run(req)
        return req.result

    def _run(self, req: _Request) -> None:
        """Queue ``req``, take part in the steps until it is done; raise its error."""
        cancel = req.gen.cancel if req.gen is not None else None
        if cancel is not None and cancel.is_set():
            raise Cancelled()  # within one forward of the cancel, not only at the next cycle
        gen = req.gen
        with self._cond:
            if gen is not None and gen.awake_since is not None and self.active > 1:
                # its own work since its last forward (sampling, the rule, stop strings, a
                # drafter's bookkeeping) ran beside the others' and held their steps back
                gen.credit -= time.perf_counter() - gen.awake_since
            self._pending.append(req)
            self._maybe_run_locked()
            while not req.done:
                # Wait only while another sequence has yet to ask for its forward; when every
                # active one is waiting already (e.g. this one's prompt has another prefill chunk
                # to feed), the next step runs at once instead of after a poll interval.
                if not (self._pending and len(self._pending) >= self.active):
                    self._cond.wait(CANCEL_POLL_SECONDS if cancel is not None else None)
                if not req.done and cancel is not None and cancel.is_set() and req in self._pending:
                    self._pending.remove(req)
                    raise Cancelled()
                if not req.done:
                    self._maybe_run_locked()  # e.g. the next chunk of its prefill
        if gen is not None:
            gen.awake_since = time.perf_counter()
        if req.error is not None:
            raise req.error

    def rollback(self, row: RowLM, length: int) -> None:
        with self._cond:
            shared = self._shared_of(row)
            if shared is not None:
                shared.rollback(row, length)

    def release(self, row: RowLM) -> None:
        with self._cond:
            self._release_locked(row)

    def _release_locked(self, row: RowLM) -> None:
        shared = self._shared_of(row)
        if shared is not None:
            shared.remove(row)

    # --- the step ---------------------------------------------------------------------------------

    def _joining(self, req: _Request) -> bool:
        """Whether ``req`` is a row's first forward (its prompt's prefill, before it joins)."""
        assert req.row is not None
        shared = self._shared_of(req.row)
        return shared is None or req.row not in shared.rows

    def _costly(self, req: _Request) -> bool:
        """Exclusive jobs, a prefill or forward of more than ``long_input`` tokens, and any
        forward of a row in a long-context lane (its cost grows with the context it attends to)."""
        if req.job is not None:
            return True
        assert req.row is not None and req.tokens is not None
        if self._joining(req):
            return req.tokens.shape[1] > self.long_input
        return req.tokens.shape[1] > self.long_input or req.row.lane > 0

    def _maybe_run_locked(self) -> None:
        """Run a step once every active sequence is waiting on a forward (or a job).

        Cheap work always runs; costly work runs if its generation is not in debt or if there is
        no cheap work to wait for it. Deferred work and unfinished prefills stay pending for the
        next step.
        """
        if self._pending and len(self._pending) >= self.active:
            self._step_locked()

    def _step_locked(self) -> None:
        """One step over the pending work. A waiter whose work is still pending (an unfinished
        prefill) starts the next one when it wakes, so the lock is free between steps for a
        request that is joining."""
        pending, self._pending = self._pending, []
        self.steps_run += 1
        costly = [req for req in pending if self._costly(req)]
        cheap = [req for req in pending if req not in costly]
        deferred = [r for r in costly if r.gen is not None and r.gen.credit < 0] if cheap else []
        held = self._held_for_alignment([r for r in pending if r not in deferred])
        runnable = [r for r in pending if r not in deferred and r not in held]
        later = self._beyond_one_costly_unit(runnable, costly)
        runnable = [r for r in runnable if r not in later]
        charges, others = self._run_units(runnable, costly)
        unfinished = [r for r in runnable if r.prefill is not None]
        for req in runnable:
            gen = req.gen
            if gen is not None and id(gen) in charges:
                # beside cheap work: pay for it (debt defers the next costly work); alone: free,
                # but an old debt is kept (else a request arriving next would find it paid off)
                charge = charges.pop(id(gen))
                gen.credit = min(gen.credit, 0.0) - (charge if cheap else 0.0)
            req.done = req.prefill is None
        debtors = {id(r.gen): r.gen for r in deferred if r.gen is not None}
        for gen in debtors.values():  # together they earn `share` of the others' time
            gen.credit += self.share * max(others, 1e-3) / len(debtors)
            gen.deferred += 1
        self.deferrals += len(deferred)
        for req in runnable:
            req.held = 0
        for req in held:
            req.held += 1
        self.aligned_holds += len(held)
        self._pending = deferred + held + unfinished + later
        self._cond.notify_all()

    def _beyond_one_costly_unit(self, runnable: list[_Request], costly: list[_Request]) -> list[_Request]:
        """The costly requests that wait for a later step: a step runs one costly unit (a lane's
        batched forward, a prefill chunk or a job), that of the generation served longest ago,
        so a step is never longer than one such unit beside the cheap work, and a request that
        arrives meanwhile waits at most that long to join."""
        units: dict[tuple[int, ...], list[_Request]] = {}
        for req in runnable:
            if req not in costly:
                continue
            if req.row is not None and not self._joining(req):
                key: tuple[int, ...] = (id(req.row.model), req.row.lane)
            else:
                key = (id(req),)
            units.setdefault(key, []).append(req)
        if len(units) < 2:
            return []

        def last_served(reqs: list[_Request]) -> int:
            return max(r.gen.served if r.gen is not None else -1 for r in reqs)

        first = min(units, key=lambda key: last_served(units[key]))
        for req in units[first]:
            if req.gen is not None:
                req.gen.served = self.steps_run
        return [req for key, reqs in units.items() if key != first for req in reqs]

    def _run_units(self, runnable: list[_Request], costly: list[_Request]) -> tuple[dict[int, float], float]:
        """Run a step's work one timed unit at a time: each (model, lane)'s batched forward, each
        joining row's next prefill chunk, each exclusive job. A unit's seconds are charged to the
        generations whose costly work it ran (split evenly), else they count as the others' time.

        Returns (seconds charged per ``id(generation)``, the others' seconds).
        """
        groups: dict[tuple[int, int], list[_Request]] = {}
        units: list[tuple[list[_Request], Callable[[], None]]] = []
        for req in runnable:
            if req.job is not None:
                units.append(([req], partial(self._run_job, req)))
            elif self._joining(req):
                assert req.row is not None and req.tokens is not None
                req.row.lane = self.lane_of(req.tokens.shape[1])
                shared = self._shared_for(req.row.model, req.row.lane)
                units.append(([req], partial(self._prefill, shared, req)))
            else:
                assert req.row is not None
                groups.setdefault((id(req.row.model), req.row.lane), []).append(req)
        units = [(reqs, partial(self._run_batched, reqs)) for reqs in groups.values()] + units
        charges: dict[int, float] = {}
        others = 0.0
        for reqs, run in units:
            t0 = time.perf_counter()
            run()
            spent = time.perf_counter() - t0
            payers = [r.gen for r in reqs if r.gen is not None and r in costly]
            for gen in payers:
                charges[id(gen)] = charges.get(id(gen), 0.0) + spent / len(payers)
            if not payers:
                others += spent
        return charges, others

    def _run_job(self, req: _Request) -> None:
        assert req.job is not None
        try:
            req.result = req.job()
        except Exception as err:
            req.error = err
        self.exclusive_jobs += 1

    def _held_for_alignment(self, requests: list[_Request]) -> list[_Request]:
        """The requests to hold this step (class doc, phase alignment), lane by lane: rows of
        different lanes never share a forward, so a long row's drafting never holds a short row."""
        lanes: dict[int, list[_Request]] = {}
        for req in requests:
            if req.row is not None:  # (a joining row's prefill goes with lane 0, as before lanes)
                lanes.setdefault(0 if self._joining(req) else req.row.lane, []).append(req)
        return [req for reqs in lanes.values() for req in self._held_in_lane(reqs)]

    def _held_in_lane(self, requests: list[_Request]) -> list[_Request]:
        """Those for the strictly largest model while rows of smaller models are drafting
        (forwards of rows already in the batch are pending; a joining row's prefill is not a
        drafting phase), unless one of them was held ``max_hold`` steps in a row."""
        by_model: dict[int, list[_Request]] = {}
        for req in requests:
            if req.row is not None:
                by_model.setdefault(id(req.row.model), []).append(req)
        if len(by_model) < 2:
            return []
        sizes = {key: _parameters(reqs[0].row.model) for key, reqs in by_model.items()}
        largest = max(sizes, key=sizes.__getitem__)
        if sum(size == sizes[largest] for size in sizes.values()) > 1:
            return []  # no single largest model (e.g. a block proposer as large as its verifier)
        if all(self._joining(r) for key, reqs in by_model.items() if key != largest for r in reqs):
            # only joining rows' prefills of the smaller models: no drafting phase to wait for (a
            # row decoding at K = 0 never drafts), and holding would add a lockstep round per join
            return []
        waiting = by_model[largest]
        if any(req.held >= self.max_hold for req in waiting):
            return []
        return waiting

    def _run_batched(self, reqs: list[_Request]) -> None:
        """One forward for the rows of ``reqs`` (one model and lane, rows already in the batch)."""
        assert reqs[0].row is not None
        shared = self._shared_for(reqs[0].row.model, reqs[0].row.lane)
        try:
            shared.forward(reqs)
            self.steps += 1
            self.rows_per_step.append(len(reqs))
        except Exception as err:
            if len(reqs) == 1:
                reqs[0].error = err
                return
            for req in reqs:  # isolate the failure: each row alone, only its own fails
                self.retried_rows += 1
                try:
                    shared.forward([req])
                    self.steps += 1
                    self.rows_per_step.append(1)
                except Exception as row_err:
                    req.error = row_err

    @torch.inference_mode()
    def _prefill(self, shared: SharedCache, req: _Request) -> None:
        """Feed the next ``prefill_chunk`` tokens of a joining row's prompt (``req.prefill`` keeps
        the progress); once all are fed, insert the row into ``shared``. Chunks let the others step
        between the pieces of a long prompt (and its chunks are charged, see ``_costly``)."""
        t0 = time.perf_counter()
        try:
            self._prefill_chunk(shared, req)
        except Exception as err:
            req.error, req.prefill = err, None
        finally:
            self.prefill_seconds += time.perf_counter() - t0

    def _prefill_chunk(self, shared: SharedCache, req: _Request) -> None:
        assert req.row is not None and req.tokens is not None
        n = req.tokens.shape[1]
        state = req.prefill = req.prefill or _Prefill(new_cache(req.row.model))
        a, b = state.fed, min(n, state.fed + self.prefill_chunk)
        first_kept = n - (n if req.keep == 0 else min(req.keep, n))
        kept = b - max(a, first_kept)  # this chunk's positions among those the caller wants
        keep = 0 if kept >= b - a else max(kept, 1)  # (logits_to_keep = 0: all positions)
        logits = model_logits(req.row.model, req.tokens[:, a:b], state.cache, keep)
        if kept > 0:
            state.logits.append(logits[:, logits.shape[1] - kept :])
        state.fed = b
        if b < n:
            return
        req.result = torch.cat(state.logits, dim=1) if len(state.logits) > 1 else state.logits[0]
        shared.insert(req.row, state.cache, n)
        req.row.length = n
        req.prefill = None
