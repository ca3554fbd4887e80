"""AR and SD tok/s with the engine's position-indexed KV cache vs transformers' DynamicCache.

Same process, the engine's cache factory swapped, runs interleaved (a warm-up round, then a
measured one), 8 held-out math prompts × 128 greedy tokens, one thread (issue 14)::

    taskset -c 0 python scripts/cache_compare.py
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine import kv
from relaxspec.eval.datasets import math_examples
from relaxspec.methods import build_engine, load_models


def dynamic_cache(model: torch.nn.Module) -> DynamicCache:
    return DynamicCache(config=model.config)


def main() -> None:
    torch.set_num_threads(1)
    models = load_models("sd")
    prompts = [example.prompt for example in math_examples(limit=8)]
    params = SamplingParams(temperature=0, max_new_tokens=128, ignore_eos=True)
    factories = {"position": kv.new_cache, "dynamic": dynamic_cache}
    speed: dict[tuple[str, str], float] = {}
    for measured in (False, True):
        for kind, factory in factories.items():
            kv.new_cache = factory  # CachedLM looks it up (module global) when built and reset
            for method in ("ar", "sd"):
                engine = build_engine(method, models, **({"k": 4} if method == "sd" else {}))
                tokens, seconds = 0, 0.0
                for prompt in prompts:
                    t0 = time.perf_counter()
                    tokens += engine.generate(prompt, params).stats.new_tokens
                    seconds += time.perf_counter() - t0
                assert engine.verifier.lm.cache_kind == kind
                if measured:
                    speed[(kind, method)] = tokens / seconds
    kv.new_cache = factories["position"]
    for method in ("ar", "sd"):
        position, dynamic = speed[("position", method)], speed[("dynamic", method)]
        ratio = position / dynamic
        print(f"{method}: position {position:.1f} tok/s, DynamicCache {dynamic:.1f} tok/s, {ratio:.2f}x")


if __name__ == "__main__":
    main()
