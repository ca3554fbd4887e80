"""Serving: the continuous-batching request pool, the OpenAI-compatible FastAPI server, and the
load test that drives it (DESIGN §7). Builds on ``methods`` and the engine's batched cache."""
