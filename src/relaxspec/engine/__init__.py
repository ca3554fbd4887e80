"""The decoding engine: KV caches, the verifier pass, proposers, schedulers, decode-time survival
signals, request batching, and the one loop propose → schedule → verify → rule → commit (docs/design.md §4).
It builds on :mod:`relaxspec.core` (the rules) and loads no model by itself."""

from relaxspec.engine.loop import CycleRecord, Engine
from relaxspec.engine.stats import GenerationResult, GenerationStats, tau

__all__ = ["CycleRecord", "Engine", "GenerationResult", "GenerationStats", "tau"]
