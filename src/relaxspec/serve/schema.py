"""Request bodies of the OpenAI-compatible endpoints, as strict pydantic models, and the plain-text
chat template (docs/server.md).

Every field is honoured or refused: an unknown field is a 400 naming it, and a known one the server
cannot honour (``n > 1``, penalties, tools) is a 400 unless it has its "off" value
(:data:`UNSUPPORTED`). Our models are base LMs, not chat-tuned: :class:`ChatTemplate` renders each
message as one line ``"<Role>: <content>"`` (roles ``System``, ``User``, ``Assistant``;
``developer`` renders as ``System``), ends the prompt with ``"Assistant:"`` and stops at
``"\\nUser:"`` (:mod:`relaxspec.data.chat`, which the bundled tokenizers carry for vLLM).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from relaxspec.data.chat import CUE, ROLE_LABELS, STOP, render_chat
from relaxspec.serve.api_errors import bad_request

MAX_INT = 2**31 - 1  # token ids, max_tokens, top_k


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
    "off" value (``UNSUPPORTED``), so no parameter is silently ignored.
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


SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "stop")

# Fields that change OpenAI semantics in ways this server does not implement, with the values that
# mean "off" (None always does).
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
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


def reject_unsupported(req: _Sampling) -> None:
    """400 for a feature the request asks for that the server cannot honour (e.g. n > 1)."""
    for name, off in UNSUPPORTED.items():
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
