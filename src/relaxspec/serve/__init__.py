"""Serving: the continuous-batching request pool, the OpenAI-compatible FastAPI server, and the
load test that drives it (docs/design.md §7). Builds on ``methods`` and the engine's batched cache."""

# Settings shared by `relaxspec serve`, the server and the load test (kept here, import-light).
API_KEY_ENV = "RELAXSPEC_API_KEY"  # the API key, when not given with --api-key
DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024  # request body cap; more is a 413 (--max-body-bytes)
