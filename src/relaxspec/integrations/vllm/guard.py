"""The front door of ``relaxspec serve --engine vllm``: one ASGI middleware before every route.

vLLM's own ``--api-key`` guards only paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``;
:class:`Guard` wraps the whole app instead, so a route a future vLLM adds is guarded without a list
to update. It enforces the API key (every path but ``/health``), ``max_body_bytes`` (413),
``max_tokens_cap`` (400), ``default_max_tokens`` and ``chat_stop`` (:class:`GuardConfig`;
docs/vllm.md, "The server's front door" and "The plugin, file by file").

vLLM builds the middleware from its import path (``--middleware``), without arguments, so
:func:`configure` sets this process's :class:`GuardConfig` first (the API server runs in the
process that calls :func:`relaxspec.integrations.vllm.serve.serve`). Unconfigured, it refuses to
start rather than serve an open door.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from relaxspec.errors import RelaxSpecError

BUDGET_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
OPEN_PATH = "/health"  # the one path served without a key (load balancers, the load test)
COMPLETIONS_PATH = "/v1/completions"  # where default_max_tokens applies (OpenAI's default: 16)
CHAT_PATH = "/v1/chat/completions"  # where chat_stop applies
MAX_STOPS = 4  # OpenAI's (and vLLM's) limit on stop strings
MIDDLEWARE = f"{__name__}.Guard"  # what vLLM's --middleware imports


@dataclass(frozen=True)
class GuardConfig:
    """What :class:`Guard` enforces; None turns a check off."""

    api_key: str | None = None
    max_body_bytes: int | None = None
    max_tokens_cap: int | None = None
    default_max_tokens: int | None = None
    chat_stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        key = self.api_key
        if key is not None and (not key or not key.isprintable() or not key.isascii()):
            raise RelaxSpecError("the API key must be a non-empty string of printable ASCII characters")
        for name, low in (("max_body_bytes", 1024), ("max_tokens_cap", 1), ("default_max_tokens", 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise RelaxSpecError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {value!r}")


_config: GuardConfig | None = None


def configure(config: GuardConfig) -> str:
    """Set what :class:`Guard` enforces in this process; returns the path ``--middleware`` takes."""
    global _config
    _config = config
    return MIDDLEWARE


class Refusal(Exception):
    """An answer the guard gives itself: status, OpenAI-style error body, headers."""

    def __init__(self, status: int, message: str, code: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}

    def body(self) -> bytes:
        kind = "authentication_error" if self.status == 401 else "invalid_request_error"
        error = {"message": self.message, "type": kind, "param": None, "code": self.code}
        return json.dumps({"error": error}).encode()


def too_large(cap: int) -> Refusal:
    return Refusal(413, f"the request body exceeds this server's limit of {cap} bytes", "request_too_large")


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def check_key(headers: dict[bytes, bytes], key_digest: bytes) -> None:
    """401 unless ``Authorization: Bearer <key>``; the digests are compared in constant time."""
    given = headers.get(b"authorization")
    realm = {"WWW-Authenticate": 'Bearer realm="relaxspec"'}
    if given is None:
        message = "missing API key: send the header 'Authorization: Bearer <key>'"
        raise Refusal(401, message, "invalid_api_key", realm)
    scheme, _, token = given.strip().partition(b" ")
    if not hmac.compare_digest(_digest(token.strip()), key_digest) or scheme.lower() != b"bearer":
        raise Refusal(401, "invalid API key", "invalid_api_key", realm)


def checked_body(config: GuardConfig, path: str, raw: bytes) -> bytes:
    """The body to pass on: refused (400) if it asks for more tokens than the cap; a completions
    body without ``max_tokens`` gets the default. Anything that is not a JSON object passes as is
    (vLLM answers it)."""
    if config.max_tokens_cap is None and config.default_max_tokens is None and not config.chat_stop:
        return raw
    if raw.lstrip()[:1] != b"{":
        return raw
    try:
        body = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(body, dict):
        return raw
    cap = config.max_tokens_cap
    for name in BUDGET_FIELDS:
        value = body.get(name)
        if cap is not None and isinstance(value, int) and not isinstance(value, bool) and value > cap:
            raise Refusal(400, f"{name}={value} exceeds this server's limit of {cap}", "max_tokens_exceeded")
    changed = False
    if path == COMPLETIONS_PATH and config.default_max_tokens is not None and body.get("max_tokens") is None:
        body["max_tokens"] = min(config.default_max_tokens, cap or config.default_max_tokens)
        changed = True
    stops = with_stops(body.get("stop"), config.chat_stop) if path == CHAT_PATH else None
    if stops is not None:
        body["stop"], changed = stops, True
    return json.dumps(body).encode() if changed else raw


def with_stops(given: Any, extra: tuple[str, ...]) -> list[str] | None:
    """``given`` (None, a string or a list of strings) with ``extra`` added; None where nothing is
    to add or the result would not be a valid ``stop`` (vLLM answers the body as it is)."""
    if given is None:
        given = []
    elif isinstance(given, str):
        given = [given]
    if not isinstance(given, list) or not all(isinstance(x, str) for x in given):
        return None
    stops = [*given, *(x for x in extra if x not in given)]
    return stops if len(given) < len(stops) <= MAX_STOPS else None


async def read_body(receive: Any, cap: int | None) -> bytes | None:
    """The whole request body (413 once it passes ``cap``); None if the client went away."""
    raw = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        raw += message.get("body", b"")
        if cap is not None and len(raw) > cap:
            raise too_large(cap)
        if not message.get("more_body", False):
            return bytes(raw)


def replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that hands the app the buffered body, then the client's own messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_again() -> Any:
        return pending.pop() if pending else await receive()

    return receive_again


def with_length(scope: dict[str, Any], length: int) -> dict[str, Any]:
    """``scope`` with its ``content-length`` header set to ``length`` (the body was rewritten)."""
    framing = (b"content-length", b"transfer-encoding")
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in framing]
    return {**scope, "headers": [*headers, (b"content-length", str(length).encode())]}


class Guard:
    """The ASGI middleware (see the module docstring); vLLM adds it with ``--middleware``."""

    def __init__(self, app: Any) -> None:
        if _config is None:
            raise RuntimeError(f"{MIDDLEWARE} is not configured: call guard.configure() first")
        self.app = app
        self.config = _config
        self.key_digest = _digest(_config.api_key.encode()) if _config.api_key is not None else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        try:
            self.admit(scope, headers)
            if scope["type"] == "websocket":
                await self.app(scope, receive, send)
                return
            declared = headers.get(b"content-length", b"")
            cap = self.config.max_body_bytes
            if cap is not None and declared.isdigit() and int(declared) > cap:
                raise too_large(cap)
            raw = await read_body(receive, cap)
            if raw is None:
                return
            body = checked_body(self.config, route_path(scope), raw)
        except Refusal as refusal:
            await refuse(scope, send, refusal)
            return
        scope = scope if body is raw else with_length(scope, len(body))
        await self.app(scope, replay(body, receive), send)

    def admit(self, scope: dict[str, Any], headers: dict[bytes, bytes]) -> None:
        """The API key, on every path but ``/health`` and CORS preflights."""
        if self.key_digest is None or route_path(scope) == OPEN_PATH:
            return
        if scope.get("method") == "OPTIONS" and b"access-control-request-method" in headers:
            return
        check_key(headers, self.key_digest)


def route_path(scope: dict[str, Any]) -> str:
    """The path the router matches (``root_path`` removed, as vLLM's own middleware does)."""
    return str(scope["path"]).removeprefix(scope.get("root_path", "") or "") or "/"


async def refuse(scope: dict[str, Any], send: Any, refusal: Refusal) -> None:
    """Answer ``refusal`` without calling the app (a websocket is closed, code 1008: policy)."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": refusal.message[:120]})
        return
    body = refusal.body()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in refusal.headers.items()]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
