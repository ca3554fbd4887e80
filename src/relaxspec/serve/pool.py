"""Serving many requests on one set of models: admission control and continuous batching.

:class:`ServingPool` is what the HTTP server calls. ``submit`` runs one generation in the caller's
thread with its own :class:`Engine` (its own decoding state and random generator). With
``batching=True`` the engines' caches are rows of shared batched caches
(:mod:`relaxspec.engine.batching`), so concurrent requests share one verifier forward (and one draft
forward) per step, join and leave between steps, and each row accepts its own number of tokens.
The pool caps concurrent sequences and queued requests and answers past the caps with
:class:`Overloaded`. A cancelled request (client gone) stops within one engine cycle: the engine
checks its cancel event at every cycle, and so does the batcher while the request waits for a step
(so its slot is free again at once); a queued one leaves the queue at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine import Engine, GenerationResult
from relaxspec.engine.batching import Batcher, RowLM
from relaxspec.engine.draft_length import GoodputDraftLength, LiveStepCosts, measure_step_costs, needs_fixed_k
from relaxspec.engine.kv import observe_forwards
from relaxspec.engine.logprobs import LogprobRecorder, check_supported
from relaxspec.engine.proposers import DraftModel
from relaxspec.engine.proposers.eagle import LoadedEagle
from relaxspec.errors import Cancelled, RelaxSpecError
from relaxspec.methods import ModelSet, build_engine, get_method, resolve_params

__all__ = ["Cancelled", "Overloaded", "PoolStats", "ServingPool"]


class Overloaded(RelaxSpecError):
    """Too many requests in flight and queued (HTTP 429/503)."""


@dataclass
class PoolStats:
    requests: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    verifier_calls: int = 0
    draft_calls: int = 0
    # seconds, of the most recent completed requests (bounded: a server runs for days)
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    first_token_latencies: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))


class ServingPool:
    """Admission control + per-request engines over shared models.

    max_concurrency: sequences decoded at once; max_queue: requests allowed to wait for a slot
    (more are rejected with :class:`Overloaded`); batching: share batched forwards across the
    running requests (off: each request decodes alone, in parallel threads).
    ``default_method``/``default_params`` apply when a request does not override them.
    adaptive_k: draft-model methods choose each cycle's draft length in ``0 .. k`` for goodput
    from the number of running requests and the acceptance measured on this server
    (:mod:`relaxspec.engine.draft_length`; one policy per method, parameters and temperature).
    The models' step costs are measured at start-up (and for a model first used later, when its
    first request arrives), then corrected by every forward the pool runs.
    clock: the time source in seconds for idle time and latencies (tests pass a fake one).
    """

    def __init__(
        self,
        models: ModelSet,
        default_method: str = "nsd",
        default_params: dict[str, Any] | None = None,
        max_concurrency: int = 8,
        max_queue: int = 64,
        batching: bool = True,
        adaptive_k: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if max_concurrency < 1 or max_queue < 0:
            raise RelaxSpecError("max_concurrency must be >= 1 and max_queue >= 0")
        self.models = models
        self.default_method = default_method
        self.default_params = resolve_params(default_method, default_params or {})
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self._slots = threading.Semaphore(max_concurrency)
        self._lock = threading.Lock()
        self._waiting = 0
        self._active = 0
        self._in_flight = 0  # submitted and not returned (set up, queued or running)
        self._clock = clock
        self._idle_seconds, self._idle_since = 0.0, clock()  # for paused_seconds
        self.stats = PoolStats()
        self.batcher = Batcher() if batching else None
        self.adaptive_k = adaptive_k
        self._step_costs: dict[int, LiveStepCosts] = {}  # id(model) -> forward seconds
        self._draft_lengths: dict[tuple, GoodputDraftLength] = {}
        self._adaptive_lock = threading.Lock()
        self._check_method_models(default_method)
        if adaptive_k:  # measure while the server is idle, not beside the first requests
            for loaded in (models.target, models.draft):
                if getattr(loaded, "model", None) is not None:  # an EAGLE head has no model of its own
                    self._costs(loaded.model)

    def _rows_per_step(self) -> int:
        return max(1, self.batcher.active) if self.batcher is not None else 1

    def _load(self) -> int:
        return self._in_flight

    def paused_seconds(self) -> float:
        """Seconds so far in which running requests did nothing that depends on the draft length:
        prefills of rows joining the batch, and time with no request running (the adaptive
        policy's windows leave both out: an idle minute between two loads is not a minute of
        zero tokens per second)."""
        with self._lock:
            idle = self._idle_seconds
            if self._idle_since is not None:
                idle += self._clock() - self._idle_since
        return idle + (self.batcher.prefill_seconds if self.batcher is not None else 0.0)

    def _costs(self, model: Any) -> LiveStepCosts:
        costs = self._step_costs.get(id(model))
        if costs is None:
            costs = self._step_costs[id(model)] = LiveStepCosts(measure_step_costs(model))
            observe_forwards(model, costs.observe)
        return costs

    def draft_length_policy(
        self, method: str, params: dict[str, Any], sampling: SamplingParams, engine: Any
    ) -> GoodputDraftLength | None:
        """The shared adaptive draft-length policy for requests like this one (None: fixed K).

        Seeded and greedy requests whose output depends on K keep K fixed (:func:`needs_fixed_k`):
        the same request gives the same output whatever else is in flight.
        """
        if not self.adaptive_k or not isinstance(engine.proposer, DraftModel):
            return None
        if needs_fixed_k(engine.greedy_rule if sampling.greedy else engine.rule, sampling):
            return None
        key = (method, tuple(sorted((n, repr(v)) for n, v in params.items())), sampling.temperature)
        with self._adaptive_lock:
            policy = self._draft_lengths.get(key)
            if policy is None:
                policy = self._draft_lengths[key] = GoodputDraftLength(
                    target_costs=self._costs(engine.verifier.lm.model),
                    draft_costs=self._costs(engine.proposer.lm.model),
                    k_max=engine.k,
                    rows=self._rows_per_step,
                    load=self._load,
                    paused=self.paused_seconds,
                )
        return policy

    def draft_length_stats(self) -> dict[str, dict[int, int]]:
        """Cycles per chosen draft length, per policy (for /metrics and the load test)."""
        with self._adaptive_lock:
            policies = self._draft_lengths.items()
            return {f"{key[0]} T={key[2]}": dict(sorted(p.chosen.items())) for key, p in policies}

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return self._waiting

    def _check_method_models(self, method: str) -> None:
        for role in get_method(method).needs:
            if getattr(self.models, role) is None:
                raise RelaxSpecError(
                    f"method {method!r} needs a {role} model, which this server did not load"
                )

    def resolve(self, method: str | None, params: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        """The method and validated parameters of a request (its overrides over the defaults)."""
        method = method or self.default_method
        if method == self.default_method:
            merged = {**self.default_params, **(params or {})}
        else:
            merged = dict(params or {})
        resolved = resolve_params(method, merged)
        self._check_method_models(method)
        return method, resolved

    def submit(
        self,
        prompt: str | list[int],
        sampling: SamplingParams,
        method: str | None = None,
        method_params: dict[str, Any] | None = None,
        on_chunk: Callable[[str, list[int]], None] | None = None,
        cancel: threading.Event | None = None,
        logprobs: LogprobRecorder | None = None,
    ) -> GenerationResult:
        """Run one request to completion in the calling thread (blocking).

        ``on_chunk`` must not block: with batching, every running request waits for the slowest
        one at each step. ``logprobs`` collects the target's logprobs of the committed tokens
        (and of the prompt, if it asks); a method that cannot give them is refused before the
        request takes a slot (:class:`~relaxspec.engine.logprobs.LogprobsUnsupported`).
        """
        with self._lock:
            self._in_flight += 1
        try:
            return self._submit(prompt, sampling, method, method_params, on_chunk, cancel, logprobs)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _submit(
        self,
        prompt: str | list[int],
        sampling: SamplingParams,
        method: str | None,
        method_params: dict[str, Any] | None,
        on_chunk: Callable[[str, list[int]], None] | None,
        cancel: threading.Event | None,
        logprobs: LogprobRecorder | None = None,
    ) -> GenerationResult:
        method, params = self.resolve(method, method_params)
        # An EAGLE head reads the verifier's hidden states, which the shared batched cache does not
        # keep: such a request runs in an engine of its own, beside the batch.
        spec = get_method(method)
        drafter = getattr(self.models, params.get("drafter", "draft"), None)
        eagle = isinstance(drafter, LoadedEagle) and "draft" in spec.needs
        if self.batcher is not None and not eagle:
            with self.batcher.building() as rows:
                engine = build_engine(method, self.models, **params)
        else:
            engine, rows = build_engine(method, self.models, **params), []
        engine.encode(prompt)  # validate the prompt before taking a slot
        if logprobs is not None:
            check_supported(engine, self.models.target.model if self.models.target is not None else None)
        engine.draft_length = self.draft_length_policy(method, params, sampling, engine)
        self._admit()
        started = self._clock()
        first_chunk_at: list[float] = []

        def chunk_hook(text: str, ids: list[int]) -> None:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            if not first_chunk_at:
                first_chunk_at.append(self._clock() - started)
            if on_chunk is not None:
                on_chunk(text, ids)

        self._take_slot(cancel)
        result = self._run(engine, rows, prompt, sampling, chunk_hook, cancel, logprobs)
        self._count_completed(result, self._clock() - started, first_chunk_at)
        return result

    def _admit(self) -> None:
        """Count the request and queue it, or refuse it when every slot and queue place is taken."""
        with self._lock:
            self.stats.requests += 1
            if self._active >= self.max_concurrency and self._waiting >= self.max_queue:
                self.stats.rejected += 1
                raise Overloaded(
                    f"server overloaded: {self._active} requests running and {self._waiting} queued"
                )
            self._waiting += 1

    def _take_slot(self, cancel: threading.Event | None) -> None:
        """Wait for a slot, but give up the queue place at once if the client goes away."""
        while not self._slots.acquire(timeout=0.05):
            if cancel is not None and cancel.is_set():
                with self._lock:
                    self._waiting -= 1
                    self.stats.cancelled += 1
                raise Cancelled()
        with self._lock:
            self._waiting -= 1
            self._active += 1
            if self._idle_since is not None:
                self._idle_seconds += self._clock() - self._idle_since
                self._idle_since = None

    def _run(
        self,
        engine: Engine,
        rows: list[RowLM],
        prompt: str | list[int],
        sampling: SamplingParams,
        chunk_hook: Callable[[str, list[int]], None],
        cancel: threading.Event | None,
        logprobs: LogprobRecorder | None,
    ) -> GenerationResult:
        """Generate in the slot taken (as a row of the shared batch where there is one), counting
        a cancelled or failed request; the slot is given back whatever happens."""
        try:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            if self.batcher is not None:
                with self.batcher.running(rows, cancel=cancel, engine=engine):
                    return engine.generate(prompt, sampling, chunk_hook, cancel=cancel, logprobs=logprobs)
            return engine.generate(prompt, sampling, chunk_hook, cancel=cancel, logprobs=logprobs)
        except Cancelled:
            with self._lock:
                self.stats.cancelled += 1
            raise
        except Exception:
            with self._lock:
                self.stats.failed += 1
            raise
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self._idle_since = self._clock()
            self._slots.release()

    def _count_completed(self, result: GenerationResult, latency: float, first_chunk_at: list[float]) -> None:
        with self._lock:
            s = self.stats
            s.completed += 1
            s.prompt_tokens += result.stats.prompt_tokens
            s.new_tokens += result.stats.new_tokens
            s.verifier_calls += result.stats.verifier_calls
            s.draft_calls += result.stats.draft_calls
            s.latencies.append(latency)
            if first_chunk_at:
                s.first_token_latencies.append(first_chunk_at[0])
