"""The endpoints' logic over one pool (:class:`Server`; docs/design.md §7).

A generation request's body is read with a size cap (413) and decoded, validated and tokenized on
a worker thread, never on the event loop; large bodies are parsed a few at a time. It then runs as
one :class:`~relaxspec.serve.runs.Run` per prompt: answered whole, or streamed as server-sent
events once the first text (or an error) is known, so that an early failure still gets a 4xx/5xx
status and a JSON body.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from relaxspec.engine import GenerationResult
from relaxspec.methods import get_method, method_names
from relaxspec.serve.admission import release_memory
from relaxspec.serve.api_errors import APIError, error_from_exception, validation_error
from relaxspec.serve.body import LARGE_BODY_BYTES, LARGE_BODY_PARSES, decode_body, too_large
from relaxspec.serve.jobs import Job, ServerConfig, build_jobs
from relaxspec.serve.logprobs import Formatter, TokenText, choice_logprobs
from relaxspec.serve.metrics import Metrics
from relaxspec.serve.pool import Cancelled, ServingPool
from relaxspec.serve.runs import Done, Run
from relaxspec.serve.schema import ChatCompletionRequest, CompletionRequest
from relaxspec.serve.shapes import Shape, finish_of, sse, usage, usage_of


class Server:
    """The endpoints' logic over one pool (the FastAPI app holds one as ``app.state.server``)."""

    def __init__(self, pool: ServingPool, config: ServerConfig) -> None:
        self.pool = pool
        self.config = config
        self.metrics = Metrics(pool)
        workers = pool.max_concurrency + pool.max_queue + max(8, pool.max_concurrency)
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="relaxspec-request")
        self.runs: set[Run] = set()
        self._large_parses: asyncio.Semaphore | None = None  # made on the event loop
        self._large_in_flight = 0
        self.text_of = TokenText(config.tokenizer)  # token texts for logprobs

    async def generate(self, request: Request, endpoint: str) -> Response:
        """Handle one completions/chat request end to end; never raises."""
        try:
            jobs = await self._parse(request, endpoint)
            run = Run(self.pool, jobs[0], self.executor) if jobs[0].stream else None
        except APIError as err:
            self.metrics.request_done(endpoint, err.status)
            return err.response()
        except ClientDisconnect:  # gone while sending the body
            self.metrics.request_done(endpoint, 499)
            return Response(status_code=499)
        except Exception as err:  # a bug in parsing: this request only
            api = error_from_exception(err)
            self.metrics.request_done(endpoint, api.status)
            return api.response()
        if run is None:
            return await self._complete(request, jobs)
        self.runs.add(run)
        return await self._stream(request, run)

    async def _parse(self, request: Request, endpoint: str) -> list[Job]:
        """Read the body (capped), then decode, validate and tokenize it on a worker thread."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > LARGE_BODY_BYTES:
            return await self._parse_large(request, endpoint)
        raw = await self._read_body(request)
        if len(raw) > LARGE_BODY_BYTES:  # a large body sent without a length (chunked)
            return await self._parse_large(raw, endpoint)
        return await run_in_threadpool(self._build, raw, endpoint)

    async def _parse_large(self, body: Request | bytes, endpoint: str) -> list[Job]:
        """A large body waits (on the event loop, holding no thread) for one of
        :data:`LARGE_BODY_PARSES` slots before it is read, decoded and tokenized: a flood of large
        prompts neither takes the worker threads from the small requests nor holds more than a few
        bodies in memory at once (the others wait in their sockets). The last large request of a
        burst gives the freed memory back to the OS."""
        if self._large_parses is None:
            self._large_parses = asyncio.Semaphore(LARGE_BODY_PARSES)
        self._large_in_flight += 1
        try:
            async with self._large_parses:
                raw = body if isinstance(body, bytes) else await self._read_body(body)
                return await run_in_threadpool(self._build, raw, endpoint)
        finally:
            self._large_in_flight -= 1
            if self._large_in_flight == 0:
                await run_in_threadpool(release_memory)

    async def _read_body(self, request: Request) -> bytes:
        """The body, refused (413) as soon as it passes ``max_body_bytes``, whatever its framing."""
        cap = self.config.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise too_large(cap)
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > cap:
                raise too_large(cap)
        return bytes(raw)

    def _build(self, raw: bytes, endpoint: str) -> list[Job]:
        body = decode_body(raw)
        model = ChatCompletionRequest if endpoint == "chat" else CompletionRequest
        try:
            req = model.model_validate(body)
        except ValidationError as err:
            raise validation_error(err) from None
        return build_jobs(self.config, self.pool, req)

    async def _complete(self, request: Request, jobs: list[Job]) -> Response:
        """Run a request's jobs and answer with all their choices. The prompts of one request run
        at most ``max_concurrency`` at a time, each through the pool like a request of its own
        (queued behind earlier requests, batched with the others); one that fails stops the rest
        and the request gets its error."""
        window = asyncio.Semaphore(self.pool.max_concurrency)
        runs: list[Run] = []

        async def one(job: Job) -> tuple[Run, GenerationResult]:
            async with window:
                if any(run.cancel.is_set() for run in runs):
                    raise Cancelled()
                run = Run(self.pool, job, self.executor)
                self.runs.add(run)
                runs.append(run)
                try:
                    result = await run.result(request, self.config.poll_interval)
                except BaseException:
                    for other in runs:
                        other.cancel.set()
                    raise
                finally:
                    self._finish(run)
            self.metrics.generation_done(job, result, time.perf_counter() - run.started, run.ttft)
            return run, result

        outcomes = await asyncio.gather(*(one(job) for job in jobs), return_exceptions=True)
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            first = next((e for e in errors if not isinstance(e, Cancelled)), errors[0])
            return self._failure(jobs[0], first)
        shape = Shape(jobs[0].endpoint, self.config.model_name)
        choices = [self._choice(shape, job, *outcome) for job, outcome in zip(jobs, outcomes, strict=True)]
        self.metrics.request_done(jobs[0].endpoint, 200)
        return JSONResponse(shape.response(choices, usage_of(jobs, [result for _, result in outcomes])))

    def _choice(self, shape: Shape, job: Job, run: Run, result: GenerationResult) -> dict[str, Any]:
        """One choice: the echoed prompt and the completion (none for ``max_tokens: 0``), with
        their logprobs if asked."""
        text = job.prompt_text + (result.text if job.options.generate else "")
        logprobs = choice_logprobs(run.recorder, job.options, job.endpoint == "chat", self.text_of)
        return shape.choice(job.index, text, finish_of(job, result), logprobs)

    async def _stream(self, request: Request, run: Run) -> Response:
        """Start the SSE stream once the request produced text or finished.

        Waiting for that first event means that an error before any text (a full pool, a prompt
        the method's models reject) is still answered with a 4xx/5xx status and a JSON body.
        """
        try:
            first = await run.next_event(request, self.config.poll_interval)
            failed = isinstance(first, Done) and run.future.exception() is not None
        except BaseException:
            self._finish(run)
            raise
        if failed:
            self._finish(run)
            return self._failure(run.job, run.future.exception())
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(self._events(run, first), media_type="text/event-stream", headers=headers)

    def _finish(self, run: Run) -> None:
        run.close()
        self.runs.discard(run)

    def _failure(self, job: Job, err: BaseException) -> Response:
        """The answer to a request whose generation raised ``err`` (499 if the client left)."""
        if isinstance(err, Cancelled):
            self.metrics.request_done(job.endpoint, 499)
            return Response(status_code=499)  # the client is gone; nobody reads this
        api = error_from_exception(err)
        self.metrics.request_done(job.endpoint, api.status)
        return api.response()

    async def _events(self, run: Run, first: str | Done) -> AsyncIterator[str]:
        """The SSE stream: text deltas, the final chunk (finish reason), usage if asked, [DONE]."""
        job = run.job
        shape = Shape(job.endpoint, self.config.model_name)
        status: int | str = 499  # until the stream completes
        try:
            if job.endpoint == "chat":
                yield sse(shape.chunk("", role=True))
            fmt = Formatter(job.endpoint == "chat", self.text_of)
            if job.options.echo:
                prompt = run.recorder.prompt_logprobs if run.recorder is not None else None
                yield sse(shape.chunk(job.prompt_text, logprobs=fmt(prompt)))
            item = first
            while not isinstance(item, Done):
                if job.options.generate and (item.text or item.logprobs):
                    yield sse(shape.chunk(item.text, logprobs=fmt(item.logprobs)))
                item = await run.next_event(None, self.config.poll_interval)
            try:
                result = run.future.result()
            except Cancelled:
                return
            except Exception as err:
                api = error_from_exception(err)
                status = api.status
                yield sse(api.body())
                yield sse("[DONE]")
                return
            self.metrics.generation_done(job, result, time.perf_counter() - run.started, run.ttft)
            rest = run.recorder.take() if run.recorder is not None and job.options.generate else None
            if rest:  # the logprob of the EOS token that ended the generation (no text)
                yield sse(shape.chunk("", logprobs=fmt(rest)))
            yield sse(shape.chunk(None, finish_of(job, result)))
            if job.include_usage:
                yield sse(shape.usage_chunk(usage(job, result)))
            yield sse("[DONE]")
            status = 200
        finally:
            self._finish(run)
            self.metrics.request_done(job.endpoint, status)

    def models(self) -> dict[str, Any]:
        entry = {
            "id": self.config.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "relaxspec",
            "context_length": self.config.context_length,
            "relaxspec": {"default_method": self.pool.default_method, "methods": self._methods()},
        }
        return {"object": "list", "data": [entry]}

    def model(self, model_id: str) -> dict[str, Any] | None:
        """The ``/v1/models`` entry whose id is ``model_id``, if any."""
        return next((entry for entry in self.models()["data"] if entry["id"] == model_id), None)

    def _methods(self) -> list[str]:
        """The presets whose models this server loaded."""
        names = []
        for name in method_names():
            if all(getattr(self.pool.models, role, None) is not None for role in get_method(name).needs):
                names.append(name)
        return names

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "model": self.config.model_name,
            "default_method": self.pool.default_method,
            "active": self.pool.active,
            "queued": self.pool.waiting,
            "max_concurrency": self.pool.max_concurrency,
            "max_queue": self.pool.max_queue,
        }

    def shutdown(self) -> None:
        for run in list(self.runs):
            run.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
