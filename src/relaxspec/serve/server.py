"""OpenAI-compatible HTTP server over a :class:`~relaxspec.serve.pool.ServingPool`.

``create_app(pool, model_name, tokenizer, context_length)`` returns a FastAPI app with

- ``POST /v1/completions`` and ``POST /v1/chat/completions`` (OpenAI request/response shapes,
  streaming as server-sent events ending with ``data: [DONE]``),
- ``GET /v1/models``, ``GET /health`` and ``GET /metrics`` (Prometheus text format).

Every request body is validated here (size, JSON nesting and numbers, types, ranges, unsupported
OpenAI features, stop strings, the context window) and then through the pool (method names and
parameter bounds); bad input is answered with a 4xx and an OpenAI-style
``{"error": {"message", "type", "param", "code"}}`` body, a full pool with 429 and ``Retry-After``,
and an unexpected failure with a 500 for that request only whose body says "internal error" and
nothing more (the traceback goes to the log) (docs/design.md §7). The body is read with a size cap (413)
and decoded, validated and tokenized on a worker thread, never on the event loop. With an API key,
every endpoint but ``/health`` needs ``Authorization: Bearer <key>`` (401 otherwise).

The pool's blocking ``submit`` runs on a worker thread per request; committed text reaches the
event loop through ``loop.call_soon_threadsafe`` into an :class:`asyncio.Queue`. A client that
disconnects (detected by polling while the response has not started, and by Starlette cancelling
the stream afterwards) has its request's cancel event set, which stops that generation within
one engine cycle (at its next forward when batched) and frees its slot.

Chat template (our models are base LMs, not chat-tuned; :mod:`relaxspec.data.chat`, which the
bundled tokenizers carry as their chat template for vLLM): each message becomes one line
``"<Role>: <content>"`` with roles ``System``, ``User`` and ``Assistant`` (``developer`` renders as
``System``), and the prompt ends with ``"Assistant:"``; generation stops at ``"\\nUser:"``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from relaxspec.core.sampling import SamplingParams
from relaxspec.data.chat import CUE, ROLE_LABELS, STOP, render_chat
from relaxspec.engine import GenerationResult, GenerationStats
from relaxspec.engine.logprobs import LogprobsUnsupported, TokenLogprobs
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ROLE_LOADERS, ModelSet, get_method, load_role, method_names
from relaxspec.models import LoadedModel, model_dir
from relaxspec.serve import DEFAULT_MAX_BODY_BYTES
from relaxspec.serve.admission import PromptGate, release_memory
from relaxspec.serve.logprobs import (
    BadValue,
    Formatter,
    LogprobRequest,
    TokenText,
    chat_options,
    choice_logprobs,
    completion_options,
    completion_prompts,
)
from relaxspec.serve.pool import Cancelled, Overloaded, ServingPool

log = logging.getLogger("relaxspec.serve.server")

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RETRY_AFTER_SECONDS = 1

# Limits on what one request may ask for (docs/design.md §7; docs/server.md "Limits").
MAX_JSON_DEPTH = 32  # nesting of the JSON body (OpenAI bodies need about 5)
MAX_JSON_INT_DIGITS = 64  # digits of an integer in the body (more: 400 before any conversion)
MAX_STOP_STRINGS = 16  # OpenAI allows 4
MAX_STOP_CHARS = 256  # characters per stop string
MAX_INT = 2**31 - 1  # token ids, max_tokens, top_k
ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}  # metrics label
LARGE_BODY_BYTES = 64 * 1024  # bodies above this are parsed LARGE_BODY_PARSES at a time
LARGE_BODY_PARSES = 2


# ---------------------------------------------------------------------------------------------
# Errors


class APIError(Exception):
    """An OpenAI-style error answer: HTTP status plus ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return ErrorResponse(self.body(), status_code=self.status, headers=self.headers)


class ErrorResponse(JSONResponse):
    """JSON with non-ASCII characters escaped: an error message that quotes the request (a parameter
    name with a lone surrogate, say) always encodes, so the client gets the 4xx the metrics count."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def internal_error() -> APIError:
    """The 500 a client sees: no exception text (that goes to the log only)."""
    return APIError(500, "internal error", type_="server_error", code="internal_error")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _validation_error(err: ValidationError) -> APIError:
    """The first pydantic error as a 400 naming the offending field.

    A value that matches no member of a union (e.g. ``prompt``) fails once per member, each with
    the member's type in its location; those are reported once, at their common location.
    """
    errors = err.errors()
    first = errors[0]
    same_field = [tuple(e["loc"]) for e in errors if e["loc"][:1] == first["loc"][:1]]
    loc_parts = _common_prefix(same_field)
    loc = ".".join(str(p) for p in loc_parts)
    if first["type"] == "missing":
        return bad_request(f"missing required field {loc!r}", param=loc, code="missing_field")
    if first["type"] == "extra_forbidden":
        message = f"{loc!r} is not supported by this server (extra inputs are not permitted)"
        return bad_request(message, param=loc, code="unsupported")
    messages = list(dict.fromkeys(e["msg"] for e in errors if tuple(e["loc"])[: len(loc_parts)] == loc_parts))
    where = f"{loc}: " if loc else ""
    detail = "; ".join(messages[:3])
    return bad_request(f"invalid request: {where}{detail}", param=loc or None, code="invalid_value")


def _common_prefix(locs: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    prefix = locs[0]
    for loc in locs[1:]:
        n = 0
        while n < min(len(prefix), len(loc)) and prefix[n] == loc[n]:
            n += 1
        prefix = prefix[:n]
    return prefix


def _error_from_exception(err: BaseException) -> APIError:
    """Map what ``pool.submit`` raised to the answer the client gets."""
    if isinstance(err, Overloaded):
        return APIError(
            429,
            str(err),
            type_="rate_limit_error",
            code="server_overloaded",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if isinstance(err, LogprobsUnsupported):
        return bad_request(str(err), "logprobs", "unsupported")
    if isinstance(err, RelaxSpecError):
        return bad_request(str(err))
    log.error("request failed", exc_info=err)
    return internal_error()


# ---------------------------------------------------------------------------------------------
# Request bodies (strict JSON types; nulls mean "default")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class RelaxSpecOptions(_Strict):
    """The ``"relaxspec"`` extension field: a method preset and its parameters for this request."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
    method: str | None = None
    params: dict[str, Any] | None = None


class StreamOptions(_Strict):
    include_usage: bool | None = None


TokenId = Annotated[int, Field(ge=0, le=MAX_INT)]


class _Sampling(_Strict):
    """Fields shared by completions and chat completions.

    Every field is honoured or refused: a field this schema does not know is a 400 naming it
    (``extra="forbid"``), and a known one the server cannot honour is a 400 unless it has its
    "off" value (``_UNSUPPORTED``), so no parameter is silently ignored.
    """

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_INT)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=MAX_INT)  # extension (0 = off)
    ignore_eos: bool | None = None  # extension (as in vLLM): generate through EOS up to max_tokens
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    repetition_penalty: float | None = None  # vLLM extension (`vllm bench serve` sends 1.0)
    min_p: float | None = None  # vLLM extension
    min_tokens: int | None = None  # vLLM extension
    response_format: dict[str, Any] | None = None
    relaxspec: RelaxSpecOptions | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: int | None = Field(None, ge=0, le=MAX_INT)  # 0: only with echo (prompt logprobs)
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_INT)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[Any] | None = None
    function_call: str | dict[str, Any] | None = None


_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "stop")

# Fields that change OpenAI semantics in ways this server does not implement, with the values that
# mean "off" (None always does).
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "suffix": ("",),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "repetition_penalty": (1,),
    "min_p": (0,),
    "min_tokens": (0,),
    "response_format": ({"type": "text"},),
}


def _reject_unsupported(req: _Sampling) -> None:
    """400 for a feature the request asks for that the server cannot honour (e.g. n > 1)."""
    for name, off in _UNSUPPORTED.items():
        value = getattr(req, name, None)
        if value is None or any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in off):
            continue
        if name == "n":
            raise bad_request(f"only n=1 is supported, got n={value}", param="n", code="unsupported_value")
        raise bad_request(f"{name}={value!r} is not supported by this server", param=name, code="unsupported")


# ---------------------------------------------------------------------------------------------
# Chat template


@dataclass(frozen=True)
class ChatTemplate:
    """Messages as plain-text turns for a base LM, ending with the assistant's cue."""

    roles: tuple[tuple[str, str], ...] = tuple(ROLE_LABELS.items())
    cue: str = CUE
    stop: tuple[str, ...] = STOP

    def render(self, messages: Iterable[ChatMessage]) -> str:
        return render_chat(((m.role, _message_text(m)) for m in messages), dict(self.roles), self.cue)


def _message_text(message: ChatMessage) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    return "".join(part.text for part in message.content)


# ---------------------------------------------------------------------------------------------
# A validated request, ready for the pool


@dataclass
class Job:
    """What one HTTP request asks the pool for."""

    endpoint: str  # "completions" or "chat"
    prompt: str | list[int]
    prompt_tokens: int
    sampling: SamplingParams
    method: str
    method_params: dict[str, Any] | None
    stream: bool
    include_usage: bool
    index: int = 0  # the choice's index (a completions request may carry several prompts)
    options: LogprobRequest = field(default_factory=LogprobRequest)  # logprobs, echo
    prompt_text: str = ""  # what echo puts before the completion


@dataclass
class ServerConfig:
    """Everything the endpoints need besides the pool."""

    model_name: str
    tokenizer: Any
    context_length: int
    max_tokens_cap: int | None = None
    default_max_tokens: int = 16
    poll_interval: float = 0.2
    chat_template: ChatTemplate = field(default_factory=ChatTemplate)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    api_key: str | None = None
    prompt_gate: PromptGate | None = None  # None: built from the tokenizer and context length

    def __post_init__(self) -> None:
        if self.prompt_gate is None:
            self.prompt_gate = PromptGate.for_tokenizer(self.tokenizer, self.context_length)


# ---------------------------------------------------------------------------------------------
# The request body: size, JSON, nesting, numbers, text


def too_large(cap: int) -> APIError:
    return APIError(
        413, f"the request body exceeds this server's limit of {cap} bytes", code="request_too_large"
    )


class _NumberTooLarge(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text) > MAX_JSON_INT_DIGITS + 1:  # before int(): no quadratic conversion of 4,000 digits
        raise _NumberTooLarge
    return int(text)


def decode_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body; a 400 for anything else: bad JSON, nesting deeper than
    :data:`MAX_JSON_DEPTH`, an integer of more than :data:`MAX_JSON_INT_DIGITS` digits, text (keys
    included) that is not valid Unicode (lone surrogates written as ``\\ud800``)."""
    try:
        body = json.loads(raw, parse_int=_parse_int)
    except _NumberTooLarge:
        raise bad_request(
            f"an integer in the request body has more than {MAX_JSON_INT_DIGITS} digits", code="invalid_value"
        ) from None
    except RecursionError:
        raise _too_deep() from None
    except json.JSONDecodeError as err:
        raise bad_request(f"the request body is not valid JSON: {err}", code="invalid_json") from None
    except ValueError:  # UnicodeDecodeError (not UTF-8/16/32) and other decoding failures
        raise bad_request("the request body is not valid JSON text", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    _check_tree(body)
    return body


def _too_deep() -> APIError:
    return bad_request(
        f"the request body is nested too deeply (at most {MAX_JSON_DEPTH} levels)", code="invalid_json"
    )


def _check_tree(body: dict[str, Any]) -> None:
    """Depth and Unicode of a decoded body, without recursion (``param``: the dotted path)."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(body, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        if isinstance(node, dict):
            for key, value in node.items():
                if not _is_unicode(key):
                    raise _not_unicode(path, "a key in it is not")
                if isinstance(value, dict | list | str):
                    stack.append((value, depth + 1, (*path, key)))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                if isinstance(value, dict | list | str):
                    stack.append((value, depth + 1, (*path, i)))
        elif not _is_unicode(node):
            raise _not_unicode(path, "not")


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_unicode(path: tuple[Any, ...], what: str) -> APIError:
    """400 naming the field (``path``, dotted) whose text, or one of whose keys, is not Unicode."""
    where = ".".join(str(p) for p in path) or None
    return bad_request(
        f"{where or 'the body'}: {what} valid Unicode text (a lone surrogate)", where, "invalid_value"
    )


def _count_tokens(config: ServerConfig, prompt: str | list[int], param: str) -> int:
    """Prompt length in tokens (as the engine will encode it); 400 for text that cannot be encoded
    and for a prompt that cannot fit the context, found without tokenizing all of it
    (:class:`~relaxspec.serve.admission.PromptGate`)."""
    if isinstance(prompt, list):
        return len(prompt)
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:
        raise bad_request(f"{param}: not valid Unicode text ({err.reason})", param, "invalid_value") from None
    assert config.prompt_gate is not None
    try:
        count = config.prompt_gate.count(prompt)
    except Exception as err:
        log.warning("a %s could not be tokenized: %r", param, err)
        raise bad_request(f"{param}: cannot be tokenized", param, "invalid_value") from None
    if count is None:
        raise bad_request(
            f"the prompt ({len(prompt)} characters) is longer than the model's context window of "
            f"{config.context_length} tokens; shorten it",
            param,
            "context_length_exceeded",
        )
    return count


def _max_tokens(
    config: ServerConfig,
    requested: int | None,
    prompt_tokens: int,
    default: int | None,
    params: tuple[str, str] = ("prompt", "max_tokens"),
) -> int:
    """The token budget: checked against the context window left after the prompt and the cap.

    ``params`` names the request's prompt and budget fields (for the error's ``param``).
    """
    prompt_param, budget_param = params
    room = config.context_length - prompt_tokens
    if room <= 0:
        raise bad_request(
            f"the prompt has {prompt_tokens} tokens but the model's context window is "
            f"{config.context_length}; shorten it",
            prompt_param,
            "context_length_exceeded",
        )
    cap = min(room, config.max_tokens_cap or room)
    if requested is None:
        return min(cap, default) if default is not None else cap
    if requested > room:
        raise bad_request(
            f"{budget_param}={requested} is too large: the prompt has {prompt_tokens} tokens and the "
            f"context window is {config.context_length}, so at most {room} new tokens fit",
            budget_param,
            "context_length_exceeded",
        )
    if requested > cap:
        raise bad_request(
            f"{budget_param}={requested} exceeds this server's limit of {cap}",
            budget_param,
            "max_tokens_exceeded",
        )
    return requested


def _stops(stop: str | list[str] | None, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The stop strings: non-empty, at most MAX_STOP_STRINGS of at most MAX_STOP_CHARS each (the
    engine scans them at every committed chunk)."""
    given = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not s for s in given):
        raise bad_request("stop strings must be non-empty", "stop", "invalid_value")
    if len(given) > MAX_STOP_STRINGS:
        raise bad_request(
            f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(given)}", "stop", "invalid_value"
        )
    if any(len(s) > MAX_STOP_CHARS for s in given):
        raise bad_request(
            f"a stop string may have at most {MAX_STOP_CHARS} characters", "stop", "invalid_value"
        )
    return tuple(dict.fromkeys([*given, *extra]))


def _method(pool: ServingPool, options: RelaxSpecOptions | None) -> tuple[str, dict[str, Any] | None]:
    """The request's method and parameter overrides, validated through the pool (400 if bad)."""
    method = options.method if options is not None else None
    params = options.params if options is not None else None
    if method is not None:
        try:
            spec = get_method(method)
        except RelaxSpecError as err:
            raise bad_request(str(err), "relaxspec.method", "unknown_method") from None
        missing = [role for role in spec.needs if getattr(pool.models, role, None) is None]
        if missing:
            raise bad_request(
                f"method {method!r} needs a {missing[0]} model, which this server did not load",
                "relaxspec.method",
                "method_unavailable",
            )
    try:
        resolved, _ = pool.resolve(method, params)
    except RelaxSpecError as err:
        raise bad_request(str(err), "relaxspec.params", "invalid_parameter") from None
    return resolved, params


def build_jobs(
    config: ServerConfig, pool: ServingPool, req: CompletionRequest | ChatCompletionRequest
) -> list[Job]:
    """The jobs of a request: one per prompt of a completions request (choice ``index`` = the
    prompt's), one for a chat request."""
    if isinstance(req, ChatCompletionRequest):
        return [build_job(config, pool, req)]
    prompts = _prompts(req)
    if len(prompts) > 1 and req.stream:
        raise bad_request("streaming is supported for one prompt per request", "stream", "unsupported")
    return [build_job(config, pool, req, prompt, i) for i, prompt in enumerate(prompts)]


def _prompts(req: CompletionRequest) -> list[str | list[int]]:
    try:
        return completion_prompts(req.prompt)
    except BadValue as err:
        raise bad_request(str(err), err.param, err.code) from None


def _options(req: CompletionRequest | ChatCompletionRequest) -> LogprobRequest:
    """The request's logprobs / echo options, validated (400 naming the field)."""
    try:
        if isinstance(req, ChatCompletionRequest):
            return chat_options(req.logprobs, req.top_logprobs)
        return completion_options(req.logprobs, req.echo, req.max_tokens)
    except BadValue as err:
        raise bad_request(str(err), err.param, err.code) from None


def build_job(
    config: ServerConfig,
    pool: ServingPool,
    req: CompletionRequest | ChatCompletionRequest,
    prompt: str | list[int] | None = None,
    index: int = 0,
) -> Job:
    """Validate a parsed request (for completions: its prompt ``prompt``, choice ``index``)
    against the model, the server limits and the pool."""
    if req.model and req.model != config.model_name:
        raise APIError(
            404,
            f"model {req.model!r} not found; this server serves {config.model_name!r}",
            param="model",
            code="model_not_found",
        )
    _reject_unsupported(req)
    options = _options(req)
    if isinstance(req, ChatCompletionRequest):
        endpoint = "chat"
        prompt = config.chat_template.render(req.messages)
        stop = _stops(req.stop, config.chat_template.stop)
        requested, default = req.max_completion_tokens or req.max_tokens, None
        names = ("messages", "max_completion_tokens" if req.max_completion_tokens else "max_tokens")
    else:
        endpoint = "completions"
        prompt = _prompts(req)[0] if prompt is None else prompt
        stop = _stops(req.stop)
        # echo with max_tokens 0: one token is decoded in the prompt's forward and dropped (vLLM)
        requested = req.max_tokens if options.generate else 1
        default = config.default_max_tokens
        names = ("prompt", "max_tokens")
    prompt_tokens = _count_tokens(config, prompt, names[0])
    max_tokens = _max_tokens(config, requested, prompt_tokens, default, names)
    method, params = _method(pool, req.relaxspec)
    try:
        sampling = SamplingParams(
            temperature=1.0 if req.temperature is None else float(req.temperature),
            top_k=req.top_k or 0,
            top_p=1.0 if req.top_p is None else float(req.top_p),
            seed=req.seed,
            max_new_tokens=max_tokens,
            stop=stop,
            ignore_eos=bool(req.ignore_eos),
        )
    except RelaxSpecError as err:
        # SamplingParams' messages start with the field they are about (e.g. a temperature of
        # 1e-300, which underflows): name it, as pydantic's 400s do.
        field = str(err).split(" ", 1)[0]
        raise bad_request(str(err), param=field if field in _SAMPLING_FIELDS else None) from None
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    echo = "" if not options.echo else prompt if isinstance(prompt, str) else config.tokenizer.decode(prompt)
    return Job(
        endpoint, prompt, prompt_tokens, sampling, method, params, bool(req.stream), include_usage,
        index, options, echo,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Response shapes


def finish_reason(result: GenerationResult) -> str:
    """OpenAI's finish reason: "stop" for EOS or a stop string, "length" for the token budget."""
    return "length" if result.stats.finish_reason == "length" else "stop"


def _finish_of(job: Job, result: GenerationResult) -> str:
    """The finish reason of a choice; ``"length"`` for ``max_tokens: 0`` (the budget)."""
    return finish_reason(result) if job.options.generate else "length"


def usage(job: Job, result: GenerationResult) -> dict[str, Any]:
    """OpenAI ``usage`` plus a ``relaxspec`` object with the decoding statistics."""
    return usage_of([job], [result])


def usage_of(jobs: list[Job], results: list[GenerationResult]) -> dict[str, Any]:
    """The ``usage`` of a request's choices (the sums; a choice of ``max_tokens: 0`` completes
    nothing, though it decoded one token)."""
    s = results[0].stats
    for result in results[1:]:
        s = s.merge(result.stats)
    prompt = sum(job.prompt_tokens for job in jobs)
    completion = sum(r.stats.new_tokens for job, r in zip(jobs, results, strict=True) if job.options.generate)
    finish = [r.stats.finish_reason for r in results]
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "relaxspec": {
            "method": jobs[0].method,
            "tau": s.tau,
            "verifier_calls": s.verifier_calls,
            "draft_calls": s.draft_calls,
            "cycles": s.cycles,
            "proposed_tokens": s.proposed_tokens,
            "accepted_tokens": s.accepted_tokens,
            "finish_reason": finish[0] if len(finish) == 1 else finish,
            "seconds": s.total_seconds,
        },
    }


@dataclass
class Shape:
    """The JSON objects of one response (completion or chat), full or as stream chunks."""

    endpoint: str
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def _head(self, obj: str) -> dict[str, Any]:
        prefix = "chatcmpl" if self.endpoint == "chat" else "cmpl"
        return {"id": f"{prefix}-{self.id}", "object": obj, "created": self.created, "model": self.model}

    def choice(
        self, index: int, text: str, finish: str, logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        if self.endpoint == "chat":
            message = {"role": "assistant", "content": text}
            return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def full(
        self, text: str, finish: str, usage_: dict[str, Any], logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return self.response([self.choice(0, text, finish, logprobs)], usage_)

    def response(self, choices: list[dict[str, Any]], usage_: dict[str, Any]) -> dict[str, Any]:
        obj = "chat.completion" if self.endpoint == "chat" else "text_completion"
        return {**self._head(obj), "choices": choices, "usage": usage_}

    def chunk(
        self,
        text: str | None,
        finish: str | None = None,
        role: bool = False,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One stream chunk: a text delta (with its tokens' logprobs), or the final one
        (``finish`` set, no text)."""
        if self.endpoint == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage_: dict[str, Any]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage_}


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


# ---------------------------------------------------------------------------------------------
# Metrics


class Metrics:
    """Prometheus metrics of one app (its own registry, so several apps can share a process)."""

    def __init__(self, pool: ServingPool) -> None:
        self.registry = CollectorRegistry()
        self.pool = pool
        self._lock = threading.Lock()
        self._totals: dict[str, GenerationStats] = {}  # per method, over completed requests
        r = self.registry
        self.http_requests = Counter(
            "relaxspec_http_requests",
            "Generation requests by endpoint and HTTP status",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "relaxspec_prompt_tokens", "Prompt tokens of completed requests", ["method"], registry=r
        )
        self.completion_tokens = Counter(
            "relaxspec_completion_tokens", "New tokens of completed requests", ["method"], registry=r
        )
        self.verifier_calls = Counter(
            "relaxspec_verifier_calls",
            "Verifier forward passes of completed requests",
            ["method"],
            registry=r,
        )
        self.draft_calls = Counter(
            "relaxspec_draft_calls", "Proposer forward passes of completed requests", ["method"], registry=r
        )
        self.latency = Histogram(
            "relaxspec_request_latency_seconds",
            "End-to-end latency of completed requests",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "relaxspec_time_to_first_token_seconds",
            "Time from request arrival to the first committed token",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        r.register(self)  # collect(): gauges read at scrape time

    def request_done(self, endpoint: str, status: int | str) -> None:
        self.http_requests.labels(endpoint, str(status)).inc()

    def generation_done(self, job: Job, result: GenerationResult, latency: float, ttft: float | None) -> None:
        s, m = result.stats, job.method
        self.prompt_tokens.labels(m).inc(job.prompt_tokens)
        self.completion_tokens.labels(m).inc(s.new_tokens)
        self.verifier_calls.labels(m).inc(s.verifier_calls)
        self.draft_calls.labels(m).inc(s.draft_calls)
        self.latency.labels(m).observe(latency)
        if ttft is not None:
            self.ttft.labels(m).observe(ttft)
        with self._lock:
            self._totals[m] = self._totals.get(m, GenerationStats()).merge(s)

    def collect(self) -> Iterable[Any]:
        """Gauges and pool counters computed at scrape time."""
        active = GaugeMetricFamily("relaxspec_active_sequences", "Sequences being decoded now")
        active.add_metric([], self.pool.active)
        yield active
        queued = GaugeMetricFamily("relaxspec_queued_requests", "Requests waiting for a decoding slot")
        queued.add_metric([], self.pool.waiting)
        yield queued
        tau = GaugeMetricFamily(
            "relaxspec_tau", "Tokens per verifier call (tau) over completed requests", labels=["method"]
        )
        with self._lock:
            for method, total in sorted(self._totals.items()):
                tau.add_metric([method], total.tau)
        yield tau
        chosen = CounterMetricFamily(
            "relaxspec_draft_length_cycles",
            "Cycles per draft length chosen by the adaptive policy (K = 0: an AR step)",
            labels=["policy", "k"],
        )
        for policy, counts in sorted(self.pool.draft_length_stats().items()):
            for k, cycles in counts.items():
                chosen.add_metric([policy, str(k)], cycles)
        yield chosen
        outcomes = CounterMetricFamily(
            "relaxspec_pool_requests", "Requests seen by the serving pool by outcome", labels=["outcome"]
        )
        stats = self.pool.stats
        for outcome in ("completed", "failed", "cancelled", "rejected"):
            outcomes.add_metric([outcome], getattr(stats, outcome))
        yield outcomes

    def render(self) -> bytes:
        return generate_latest(self.registry)


# ---------------------------------------------------------------------------------------------
# Running one request on a worker thread


class _Done:
    """Queue sentinel: the worker finished (its result or exception is on the future)."""


DONE = _Done()


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
        self.queue: asyncio.Queue[Piece | _Done] = asyncio.Queue()
        self._pending_get: asyncio.Task | None = None
        self.future = self.loop.run_in_executor(executor, self._work)

    def _put(self, item: Piece | _Done) -> None:
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

    async def next_event(self, request: Request | None, poll: float) -> Piece | _Done:
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
                if isinstance(item, _Done):
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


# ---------------------------------------------------------------------------------------------
# The app


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
            api = _error_from_exception(err)
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
            raise _validation_error(err) from None
        return build_jobs(self.config, self.pool, req)

    def admit(self, scope: Scope) -> APIError | None:
        """Checks made before a request is routed and its body read: the API key (every path but
        ``/health``) and a declared body size over the cap."""
        headers = dict(scope.get("headers") or [])
        key = self.config.api_key
        if key is not None and scope.get("path") != "/health":
            given = headers.get(b"authorization")
            if given is None:
                return _unauthorized("missing API key: send the header 'Authorization: Bearer <key>'")
            scheme, _, token = given.strip().partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), key.encode()):
                return _unauthorized("invalid API key")
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                return bad_request("invalid Content-Length header", code="invalid_request")
            if int(declared) > self.config.max_body_bytes:
                return too_large(self.config.max_body_bytes)
        return None

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
        return shape.choice(job.index, text, _finish_of(job, result), logprobs)

    async def _stream(self, request: Request, run: Run) -> Response:
        """Start the SSE stream once the request produced text or finished.

        Waiting for that first event means that an error before any text (a full pool, a prompt
        the method's models reject) is still answered with a 4xx/5xx status and a JSON body.
        """
        try:
            first = await run.next_event(request, self.config.poll_interval)
            failed = isinstance(first, _Done) and run.future.exception() is not None
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
        api = _error_from_exception(err)
        self.metrics.request_done(job.endpoint, api.status)
        return api.response()

    async def _events(self, run: Run, first: str | _Done) -> AsyncIterator[str]:
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
            while not isinstance(item, _Done):
                if job.options.generate and (item.text or item.logprobs):
                    yield sse(shape.chunk(item.text, logprobs=fmt(item.logprobs)))
                item = await run.next_event(None, self.config.poll_interval)
            try:
                result = run.future.result()
            except Cancelled:
                return
            except Exception as err:
                api = _error_from_exception(err)
                status = api.status
                yield sse(api.body())
                yield sse("[DONE]")
                return
            self.metrics.generation_done(job, result, time.perf_counter() - run.started, run.ttft)
            rest = run.recorder.take() if run.recorder is not None and job.options.generate else None
            if rest:  # the logprob of the EOS token that ended the generation (no text)
                yield sse(shape.chunk("", logprobs=fmt(rest)))
            yield sse(shape.chunk(None, _finish_of(job, result)))
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


def _unauthorized(message: str) -> APIError:
    return APIError(
        401, message, code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="relaxspec"'}
    )


class Guard:
    """ASGI middleware in front of the routes: :meth:`Server.admit` (API key, declared body size)
    answered before any body is read; such refusals of a generation endpoint count in the metrics."""

    def __init__(self, app: ASGIApp, server: Server) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = self.server.admit(scope) if scope["type"] == "http" else None
        if error is None:
            await self.app(scope, receive, send)
            return
        endpoint = ENDPOINTS.get(scope.get("path", ""))
        if endpoint is not None and scope.get("method") == "POST":
            self.server.metrics.request_done(endpoint, error.status)
        await error.response()(scope, receive, send)


def create_app(
    pool: ServingPool,
    model_name: str,
    tokenizer: Any,
    context_length: int,
    *,
    max_tokens_cap: int | None = None,
    default_max_tokens: int = 16,
    poll_interval: float = 0.2,
    chat_template: ChatTemplate | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    api_key: str | None = None,
) -> FastAPI:
    """The OpenAI-compatible app over ``pool``.

    ``tokenizer`` and ``context_length`` are those of the served model (prompt length checks);
    ``max_tokens_cap`` bounds ``max_tokens`` (None: only the context window does);
    ``default_max_tokens`` is the completions default (OpenAI's is 16; chat defaults to the room
    left in the context, within the cap); ``poll_interval`` is how often a waiting request checks
    whether its client is still connected; ``max_body_bytes`` caps a request body (413 beyond);
    ``api_key``: if set, every endpoint but ``/health`` needs ``Authorization: Bearer <api_key>``.
    """
    disable_created_metrics()  # no *_created series next to every counter (process-wide setting)
    if context_length < 2:
        raise RelaxSpecError(f"context_length must be >= 2, got {context_length}")
    if max_tokens_cap is not None and max_tokens_cap < 1:
        raise RelaxSpecError(f"max_tokens_cap must be >= 1, got {max_tokens_cap}")
    if default_max_tokens < 1:
        raise RelaxSpecError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
    if max_body_bytes < 1024:
        raise RelaxSpecError(f"max_body_bytes must be >= 1024, got {max_body_bytes}")
    if api_key is not None and (not api_key or not api_key.isprintable() or not api_key.isascii()):
        raise RelaxSpecError("the API key must be a non-empty string of printable ASCII characters")
    config = ServerConfig(
        model_name,
        tokenizer,
        context_length,
        max_tokens_cap,
        default_max_tokens,
        poll_interval,
        chat_template or ChatTemplate(),
        max_body_bytes,
        api_key,
    )
    server = Server(pool, config)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        server.shutdown()

    app = FastAPI(title="relaxspec", version="0.1.0", lifespan=lifespan)
    app.state.server = server
    app.add_middleware(Guard, server=server)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return APIError(exc.status_code, str(exc.detail), param=None, code=code).response()

    @app.exception_handler(Exception)
    async def server_error(_request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=exc)
        return internal_error().response()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        """OpenAI text completions (``prompt``), optionally streamed."""
        return await server.generate(request, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        """OpenAI chat completions (``messages`` rendered with the plain-text chat template)."""
        return await server.generate(request, "chat")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return server.models()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        """OpenAI's retrieve-model: the served model's entry, or a 404 naming the id."""
        entry = server.model(model_id)
        if entry is None:
            message = f"model {model_id!r} not found; this server serves {config.model_name!r}"
            return APIError(404, message, param="model", code="model_not_found").response()
        return JSONResponse(entry)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return server.health()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


# ---------------------------------------------------------------------------------------------
# Loading models for `relaxspec serve`


def load_serving_models(
    method: str, paths: dict[str, str | Path | None], extra_roles: bool = True, kernels: str = "auto"
) -> ModelSet:
    """The models ``relaxspec serve`` holds.

    The default method's models are required (a given directory or the bundled one); models of
    other roles are loaded from a given directory, or, with ``extra_roles``, from the bundled one
    when it exists, so that requests can switch to the methods that use them. A bundled extra
    model that fails to load is skipped with a warning. ``kernels``: see :func:`load_role`.
    """
    spec = get_method(method)
    models = ModelSet()
    for role in ROLE_LOADERS:
        required = role in spec.needs
        given = paths.get(role)
        if given is not None:
            setattr(models, role, load_role(role, Path(given), kernels))
            continue
        if not (required or extra_roles or role in spec.optional):
            continue
        path = model_dir(role, None, f"method {method!r}", required=required)
        if path is None:
            continue
        try:
            setattr(models, role, load_role(role, path, kernels))
        except RelaxSpecError as err:
            if required:
                raise
            log.warning("skipping the bundled %s model: %s", role, err)
    return models


def serving_tokenizer_and_context(models: ModelSet, method: str) -> tuple[Any, int]:
    """The tokenizer prompts are counted with (the default method's first model's) and the
    context window requests are checked against (the smallest of the loaded models')."""
    loaded = [m for m in (getattr(models, role) for role in ROLE_LOADERS) if isinstance(m, LoadedModel)]
    primary = [getattr(models, role) for role in get_method(method).needs]
    primary = [m for m in primary if isinstance(m, LoadedModel)]
    if not primary:
        raise RelaxSpecError(f"method {method!r} has no loaded Hugging Face model to take a tokenizer from")
    return primary[0].tokenizer, min(m.context_length for m in loaded)


# ---------------------------------------------------------------------------------------------
# Serving in-process


class BackgroundServer:
    """Run an app with uvicorn on a loopback port in a daemon thread (tests, notebooks).

    ``with BackgroundServer(app) as url: ...`` binds a free port (``port=0``) before starting, so
    ``url`` is usable as soon as the block starts; leaving the block shuts the server down.
    """

    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ) -> None:
        import uvicorn

        self.host = host
        self.port = port
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on"))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> str:
        import socket

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = int(sock.getsockname()[1])
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True, name="relaxspec-server"
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RelaxSpecError(f"the server did not start on {self.url}")
            time.sleep(0.01)
        return self.url

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
