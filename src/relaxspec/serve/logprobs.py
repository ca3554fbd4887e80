"""The OpenAI ``logprobs`` / ``echo`` surface of the server: what a request asks, and the shapes.

- Completions: ``logprobs: n`` (0..20) returns, per choice, ``{"tokens", "token_logprobs",
  "top_logprobs", "text_offset"}``: each token's text, its logprob, a ``{token text: logprob}``
  dict of the ``n`` most likely tokens plus the chosen one, and its character offset in the
  choice's ``text``. ``echo: true`` puts the prompt before the completion (its tokens too, the
  first with a null logprob); with ``max_tokens: 0`` only the prompt is returned: its
  log-likelihood, what lm-evaluation-harness's loglikelihood requests ask for. As in vLLM, such
  a request decodes one token (in the prompt's own forward) and drops it.
- Chat: ``logprobs: true`` with ``top_logprobs: n`` returns ``{"content": [{"token", "logprob",
  "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...]}``.

The logprobs are the target's raw ``log_softmax`` (temperature 1, no top-k / top-p), as vLLM
returns by default, taken from the verifier forwards that already ran
(:mod:`relaxspec.engine.logprobs`). A logprob is clamped at -9999 (JSON has no -inf; vLLM does
the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relaxspec.engine.logprobs import MAX_TOP_LOGPROBS, LogprobRecorder, TokenLogprobs

LOGPROB_FLOOR = -9999.0
MAX_PROMPTS = 64  # prompts in one completions request


@dataclass(frozen=True)
class LogprobRequest:
    """What one request asks: ``top_n`` alternatives per token (None: no logprobs at all),
    ``echo`` the prompt, and whether to ``generate`` (False for ``echo`` with ``max_tokens: 0``)."""

    top_n: int | None = None
    echo: bool = False
    generate: bool = True

    def recorder(self) -> LogprobRecorder | None:
        if self.top_n is None:
            return None
        return LogprobRecorder(self.top_n, prompt=self.echo)


class BadValue(ValueError):
    """A bad logprobs / echo / prompt value: ``param`` names the field, ``code`` the error."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def _count(value: Any, param: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise BadValue(f"{param} must be an integer in [0, {MAX_TOP_LOGPROBS}], got {value!r}", param)
    return value


def completion_options(logprobs: int | None, echo: bool | None, max_tokens: int | None) -> LogprobRequest:
    """A completions request's ``logprobs`` (None or 0..20), ``echo`` and ``max_tokens: 0``."""
    top_n = None if logprobs is None else _count(logprobs, "logprobs")
    if max_tokens == 0 and not echo:
        raise BadValue("max_tokens=0 is only allowed with echo=true (the prompt's logprobs)", "max_tokens")
    return LogprobRequest(top_n, bool(echo), max_tokens != 0)


def chat_options(logprobs: bool | None, top_logprobs: int | None) -> LogprobRequest:
    """A chat request's ``logprobs: true`` and ``top_logprobs`` (0..20, only with logprobs)."""
    top_n = 0 if top_logprobs is None else _count(top_logprobs, "top_logprobs")
    if not logprobs:
        if top_n:
            raise BadValue("top_logprobs needs logprobs=true", "top_logprobs")
        return LogprobRequest()
    return LogprobRequest(top_n)


def completion_prompts(prompt: str | list[Any]) -> list[str | list[int]]:
    """The prompts of a completions request: a string, token ids, or a list of either (up to
    :data:`MAX_PROMPTS`)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompts = list(prompt)
    else:
        prompts = [prompt]
    if len(prompts) > MAX_PROMPTS:
        raise BadValue(f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}", "prompt")
    for i, one in enumerate(prompts):
        if not one:
            where = "the prompt" if len(prompts) == 1 else f"prompt {i}"
            raise BadValue(f"{where} is empty", "prompt", "empty_prompt")
    return prompts


class TokenText:
    """Each token's text alone (``decode([id])``), memoized: a response of 20 top logprobs per
    token decodes the same ids many times."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self._cache.get(token)
        if text is None:
            text = self._cache[token] = self.tokenizer.decode([token])
        return text


def _lp(value: float) -> float:
    return max(float(value), LOGPROB_FLOOR)


def completion_logprobs(lp: TokenLogprobs, text_of: TokenText, offset: int = 0) -> dict[str, Any]:
    """OpenAI completions ``logprobs`` of ``lp``; ``offset``: the first token's character offset."""
    tokens, offsets, top = [], [], []
    for token, logprob, alternatives in zip(lp.tokens, lp.logprobs, lp.top, strict=True):
        text = text_of(token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if logprob is None or alternatives is None:
            top.append(None)
            continue
        best = {text_of(t): _lp(v) for t, v in alternatives}
        best.setdefault(text, _lp(logprob))  # the chosen token is always there (vLLM too)
        top.append(best)
    values = [None if v is None else _lp(v) for v in lp.logprobs]
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": top, "text_offset": offsets}


def merge_completion_logprobs(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One completions ``logprobs`` object from consecutive parts (prompt, then completion)."""
    return {key: [x for part in parts for x in part[key]] for key in parts[0]}


def _chat_entry(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": _lp(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(lp: TokenLogprobs, text_of: TokenText) -> dict[str, Any]:
    """OpenAI chat ``logprobs``: ``{"content": [...]}``, one entry per generated token."""
    content = []
    for token, logprob, alternatives in zip(lp.tokens, lp.logprobs, lp.top, strict=True):
        entry = _chat_entry(text_of(token), logprob if logprob is not None else LOGPROB_FLOOR)
        entry["top_logprobs"] = [_chat_entry(text_of(t), v) for t, v in alternatives or []]
        content.append(entry)
    return {"content": content}


class Formatter:
    """The ``logprobs`` objects of one choice, part by part (prompt, chunks of the completion):
    completions offsets continue from part to part; ``None`` for a request without logprobs."""

    def __init__(self, chat: bool, text_of: TokenText) -> None:
        self.chat = chat
        self.text_of = text_of
        self.offset = 0

    def __call__(self, lp: TokenLogprobs | None) -> dict[str, Any] | None:
        if lp is None:
            return None
        if self.chat:
            return chat_logprobs(lp, self.text_of)
        out = completion_logprobs(lp, self.text_of, self.offset)
        self.offset += sum(len(token) for token in out["tokens"])
        return out


def choice_logprobs(
    recorder: LogprobRecorder | None, options: LogprobRequest, chat: bool, text_of: TokenText
) -> dict[str, Any] | None:
    """A whole choice's ``logprobs``: the prompt's with echo, then the completion's (unless
    ``max_tokens: 0``, whose one decoded token is dropped)."""
    if recorder is None:
        return None
    fmt = Formatter(chat, text_of)
    parts = []
    if options.echo and not chat and recorder.prompt_logprobs is not None:
        parts.append(fmt(recorder.prompt_logprobs))
    if options.generate:
        parts.append(fmt(recorder.generated))
    if chat:
        return parts[0]
    return merge_completion_logprobs(parts)
