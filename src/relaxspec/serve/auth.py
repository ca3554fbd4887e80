"""What is refused before a request is routed and its body read: a missing or wrong API key
(every path but ``/health`` needs ``Authorization: Bearer <key>`` when the server has one; 401)
and a declared body size over the cap (413), as the ASGI middleware :class:`Guard`."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from relaxspec.serve.api_errors import APIError, bad_request
from relaxspec.serve.body import too_large
from relaxspec.serve.jobs import ServerConfig
from relaxspec.serve.metrics import ENDPOINTS, Metrics


def admit(config: ServerConfig, scope: Scope) -> APIError | None:
    """Checks made before a request is routed and its body read: the API key (every path but
    ``/health``) and a declared body size over the cap."""
    headers = dict(scope.get("headers") or [])
    key = config.api_key
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
        if int(declared) > config.max_body_bytes:
            return too_large(config.max_body_bytes)
    return None


def _unauthorized(message: str) -> APIError:
    return APIError(
        401, message, code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="relaxspec"'}
    )


class Guard:
    """ASGI middleware in front of the routes: :func:`admit` (API key, declared body size)
    answered before any body is read; such refusals of a generation endpoint count in ``metrics``."""

    def __init__(self, app: ASGIApp, config: ServerConfig, metrics: Metrics) -> None:
        self.app = app
        self.config = config
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = admit(self.config, scope) if scope["type"] == "http" else None
        if error is None:
            await self.app(scope, receive, send)
            return
        endpoint = ENDPOINTS.get(scope.get("path", ""))
        if endpoint is not None and scope.get("method") == "POST":
            self.metrics.request_done(endpoint, error.status)
        await error.response()(scope, receive, send)
