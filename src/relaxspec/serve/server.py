"""The OpenAI-compatible HTTP server, by the names the CLI, scripts and tests import.

The server lives in rooms of one concern each: :mod:`~relaxspec.serve.schema` (request bodies,
chat template), :mod:`~relaxspec.serve.body` (size, JSON, nesting, Unicode),
:mod:`~relaxspec.serve.jobs` (checks against the model, limits and pool),
:mod:`~relaxspec.serve.runs` (a generation on a worker thread), :mod:`~relaxspec.serve.shapes`
(response JSON and SSE), :mod:`~relaxspec.serve.metrics`, :mod:`~relaxspec.serve.auth`,
:mod:`~relaxspec.serve.handlers` (the endpoints' logic), :mod:`~relaxspec.serve.app`
(:func:`create_app`), :mod:`~relaxspec.serve.loading` (models for ``relaxspec serve``) and
:mod:`~relaxspec.serve.background` (:class:`BackgroundServer`). docs/server.md describes the API.
"""

from __future__ import annotations

from relaxspec.serve.app import create_app
from relaxspec.serve.background import BackgroundServer
from relaxspec.serve.loading import load_serving_models, serving_tokenizer_and_context
from relaxspec.serve.schema import ChatMessage, ChatTemplate

__all__ = [
    "BackgroundServer",
    "ChatMessage",
    "ChatTemplate",
    "create_app",
    "load_serving_models",
    "serving_tokenizer_and_context",
]
