"""The JSON the endpoints answer with: OpenAI completion and chat objects, full or as stream
chunks, their ``usage`` (with a ``relaxspec`` object of decoding statistics), and one server-sent
event (:func:`sse`)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from relaxspec.engine import GenerationResult
from relaxspec.serve.jobs import Job


def finish_reason(result: GenerationResult) -> str:
    """OpenAI's finish reason: "stop" for EOS or a stop string, "length" for the token budget."""
    return "length" if result.stats.finish_reason == "length" else "stop"


def finish_of(job: Job, result: GenerationResult) -> str:
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
