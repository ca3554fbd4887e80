"""The OpenAI-compatible FastAPI app over a :class:`~relaxspec.serve.pool.ServingPool`
(docs/server.md; docs/design.md §7).

:func:`create_app` serves ``POST /v1/completions`` and ``POST /v1/chat/completions`` (OpenAI
request and response shapes, streaming as server-sent events ending with ``data: [DONE]``),
``GET /v1/models``, ``GET /health`` and ``GET /metrics`` (Prometheus text format). Requests are
checked in :mod:`~relaxspec.serve.auth`, :mod:`~relaxspec.serve.body`,
:mod:`~relaxspec.serve.schema` and :mod:`~relaxspec.serve.jobs`, and handled by
:class:`~relaxspec.serve.handlers.Server`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, disable_created_metrics
from starlette.exceptions import HTTPException as StarletteHTTPException

from relaxspec.errors import RelaxSpecError
from relaxspec.serve import DEFAULT_MAX_BODY_BYTES
from relaxspec.serve.api_errors import APIError, internal_error
from relaxspec.serve.auth import Guard
from relaxspec.serve.handlers import Server
from relaxspec.serve.jobs import ServerConfig
from relaxspec.serve.pool import ServingPool
from relaxspec.serve.schema import ChatTemplate

log = logging.getLogger("relaxspec.serve.server")


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
    _check_settings(context_length, max_tokens_cap, default_max_tokens, max_body_bytes, api_key)
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
    app.add_middleware(Guard, config=config, metrics=server.metrics)

    _add_error_handlers(app)
    _add_routes(app, server)
    return app


def _check_settings(
    context_length: int,
    max_tokens_cap: int | None,
    default_max_tokens: int,
    max_body_bytes: int,
    api_key: str | None,
) -> None:
    """One clear error for a setting :func:`create_app` cannot serve with."""
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


def _add_error_handlers(app: FastAPI) -> None:
    """Starlette's own errors (404, 405) as OpenAI error bodies; anything unhandled as a bare 500."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return APIError(exc.status_code, str(exc.detail), param=None, code=code).response()

    @app.exception_handler(Exception)
    async def server_error(_request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=exc)
        return internal_error().response()


def _add_routes(app: FastAPI, server: Server) -> None:
    """The endpoints, each a thin call into ``server``."""

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
            message = f"model {model_id!r} not found; this server serves {server.config.model_name!r}"
            return APIError(404, message, param="model", code="model_not_found").response()
        return JSONResponse(entry)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return server.health()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)
