"""A parsed request checked against the model, the server's limits and the pool, and turned into
:class:`Job` objects the pool can run (docs/design.md §7).

The checks: the model name, unsupported features, logprobs / echo options, the prompt's length
against the context window (:class:`~relaxspec.serve.admission.PromptGate`, without tokenizing all
of a huge prompt), the token budget, stop strings, and the method and its parameters (through
:meth:`ServingPool.resolve`). Each failure is a 4xx naming the field.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from relaxspec.core.sampling import SamplingParams
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import get_method
from relaxspec.serve import DEFAULT_MAX_BODY_BYTES
from relaxspec.serve.admission import PromptGate
from relaxspec.serve.api_errors import APIError, bad_request
from relaxspec.serve.logprobs import (
    BadValue,
    LogprobRequest,
    chat_options,
    completion_options,
    completion_prompts,
)
from relaxspec.serve.pool import ServingPool
from relaxspec.serve.schema import (
    SAMPLING_FIELDS,
    ChatCompletionRequest,
    ChatTemplate,
    CompletionRequest,
    RelaxSpecOptions,
    reject_unsupported,
)

log = logging.getLogger("relaxspec.serve.server")

MAX_STOP_STRINGS = 16  # OpenAI allows 4
MAX_STOP_CHARS = 256  # characters per stop string


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
    reject_unsupported(req)
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
        raise bad_request(str(err), param=field if field in SAMPLING_FIELDS else None) from None
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    echo = "" if not options.echo else prompt if isinstance(prompt, str) else config.tokenizer.decode(prompt)
    return Job(
        endpoint, prompt, prompt_tokens, sampling, method, params, bool(req.stream), include_usage,
        index, options, echo,
    )  # fmt: skip
