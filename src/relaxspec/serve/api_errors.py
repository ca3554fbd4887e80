"""The server's error answers: OpenAI's ``{"error": {"message", "type", "param", "code"}}`` body
with its HTTP status (docs/design.md §7, docs/server.md "Errors").

Bad input is a 4xx naming the field, a full pool a 429 with ``Retry-After``, and an unexpected
failure a 500 for that request only whose body says "internal error" and nothing more (the
traceback goes to the log).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from relaxspec.engine.logprobs import LogprobsUnsupported
from relaxspec.errors import RelaxSpecError
from relaxspec.serve.pool import Overloaded

log = logging.getLogger("relaxspec.serve.server")

RETRY_AFTER_SECONDS = 1


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


def validation_error(err: ValidationError) -> APIError:
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


def error_from_exception(err: BaseException) -> APIError:
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
