"""End-to-end AR and SD tok/s with the bundled target's weights in float32 vs bfloat16 (issue 14).

Same process, the draft in float32 for both, runs interleaved (a warm-up round, then a measured
one), 8 held-out math prompts × 128 greedy tokens, one thread::

    taskset -c 0 python scripts/dtype_compare.py
"""

from __future__ import annotations

import time

import torch

from relaxspec.core.sampling import SamplingParams
from relaxspec.eval.datasets import math_examples
from relaxspec.methods import ModelSet, build_engine
from relaxspec.models import load_model, model_dir


def main() -> None:
    torch.set_num_threads(1)
    draft = load_model(model_dir("draft"))
    targets = {
        "float32": load_model(model_dir("target")),
        "bfloat16": load_model(model_dir("target"), dtype=torch.bfloat16),
    }
    prompts = [example.prompt for example in math_examples(limit=8)]
    params = SamplingParams(temperature=0, max_new_tokens=128, ignore_eos=True)
    speed: dict[tuple[str, str], tuple[float, float]] = {}
    for measured in (False, True):
        for name, target in targets.items():
            for method in ("ar", "sd"):
                models = ModelSet(target=target, draft=draft)
                engine = build_engine(method, models, **({"k": 4} if method == "sd" else {}))
                tokens, seconds, taus = 0, 0.0, []
                for prompt in prompts:
                    t0 = time.perf_counter()
                    stats = engine.generate(prompt, params).stats
                    seconds += time.perf_counter() - t0
                    tokens += stats.new_tokens
                    taus.append(stats.tau)
                if measured:
                    speed[(name, method)] = (tokens / seconds, sum(taus) / len(taus))
    for method in ("ar", "sd"):
        (fp32, tau32), (bf16, tau16) = speed[("float32", method)], speed[("bfloat16", method)]
        print(f"{method}: float32 {fp32:.1f} tok/s (τ {tau32:.2f}), bfloat16 {bf16:.1f} tok/s "
              f"(τ {tau16:.2f}), {bf16 / fp32:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
