"""One generation on a worker thread, bridged to the event loop.

The pool's blocking ``submit`` runs on a worker thread per request; committed text reaches the
event loop through ``loop.call_soon_threadsafe`` into an :class:`asyncio.Queue`. A client that
disconnects (found by polling while the response has not started, and by Starlette cancelling the
stream afterwards) has its run's cancel event set, which stops that generation within one engine
cycle (at its next forward when batched) and frees its slot.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fastapi import Request

from relaxspec.engine import GenerationResult
from relaxspec.engine.logprobs import TokenLogprobs
from relaxspec.serve.jobs import Job
from relaxspec.serve.pool import ServingPool


class Done:
    """Queue sentinel: the worker finished (its result or exception is on the future)."""


DONE = Done()


@dataclass
class Piece:
    """Committed text for the stream, and the logprobs of the tokens committed with it."""

    text: str
    logprobs: TokenLogprobs | None = None


class Run:
    """One generation on a worker thread, its text chunks bridged to the event loop."""

    def __init__(self, pool: ServingPool, job: Job, executor: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.job = job
        self.cancel = threading.Event()
        self.started = time.perf_counter()
        self.first_token_at: float | None = None
        self.loop = asyncio.get_running_loop()
        self.recorder = job.options.recorder()  # None: no logprobs asked
        self.queue: asyncio.Queue[Piece | Done] = asyncio.Queue()
        self._pending_get: asyncio.Task | None = None
        self.future = self.loop.run_in_executor(executor, self._work)

    def _put(self, item: Piece | Done) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # event loop closed (server shutting down)
            self.cancel.set()

    def _on_chunk(self, text: str, ids: list[int]) -> None:
        """Forward committed text; the first chunk always (even without text: EOS, special tokens,
        text held back), since it tells a waiting stream that decoding has started."""
        first = self.first_token_at is None
        if ids and first:
            self.first_token_at = time.perf_counter()
        logprobs = self.recorder.take() if self.recorder is not None else None
        if text or first or logprobs:
            self._put(Piece(text, logprobs))

    def _work(self) -> GenerationResult:
        extra = {"logprobs": self.recorder} if self.recorder is not None else {}
        try:
            return self.pool.submit(
                self.job.prompt,
                self.job.sampling,
                method=self.job.method,
                method_params=self.job.method_params,
                on_chunk=self._on_chunk,
                cancel=self.cancel,
                **extra,
            )
        finally:
            self._put(DONE)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    async def next_event(self, request: Request | None, poll: float) -> Piece | Done:
        """The next text chunk, or DONE once the worker has finished (``future`` is then done).

        With a ``request``, polls whether its client is still there and cancels the run if not
        (once a stream has started, Starlette watches for the disconnect instead).
        """
        if self._pending_get is None:
            self._pending_get = asyncio.ensure_future(self.queue.get())
        while True:
            done, _ = await asyncio.wait({self._pending_get}, timeout=poll)
            if done:
                item = self._pending_get.result()
                self._pending_get = None
                if isinstance(item, Done):
                    await asyncio.wait({self.future})  # DONE is queued just before the result is set
                return item
            if request is not None and not self.cancel.is_set() and await request.is_disconnected():
                self.cancel.set()

    async def result(self, request: Request, poll: float) -> GenerationResult:
        """Wait for the whole generation (non-streaming), watching for a client disconnect."""
        while not self.future.done():
            done, _ = await asyncio.wait({self.future}, timeout=poll)
            if not done and not self.cancel.is_set() and await request.is_disconnected():
                self.cancel.set()
        return self.future.result()

    def close(self) -> None:
        """Stop the generation if it is still running (no-op when finished)."""
        self.cancel.set()
        if self._pending_get is not None:
            self._pending_get.cancel()
            self._pending_get = None
