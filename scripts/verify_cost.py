"""Verify-of-(K+1) vs one decode step of the bundled target on each kernel choice (issue 14).

Interleaves, for each ``--kernels`` choice (engine/packed.py: ``hf`` = transformers' forward,
``packed`` = oneDNN-packed fp32 weights, ``packed-bf16``), forwards of T = 1, 5 and 9 new tokens
after a 64-token context through the engine's cached model call (``CachedLM``), one thread; prints
the median ms per forward and the verify/decode ratios. Pin it to a core for stable numbers::

    taskset -c 0 python scripts/verify_cost.py
"""

from __future__ import annotations

import statistics
import time

import torch

from relaxspec.engine.kv import CachedLM
from relaxspec.methods import load_role
from relaxspec.models import model_dir


def timed_forward(lm: CachedLM, n: int) -> float:
    tokens = torch.randint(5, 1000, (1, n))
    t0 = time.perf_counter()
    lm.forward(tokens, logits_to_keep=n)
    seconds = time.perf_counter() - t0
    lm.rollback(lm.length - n)
    return seconds


def main(rounds: int = 60, widths: tuple[int, ...] = (1, 5, 9), role: str = "target") -> None:
    torch.set_num_threads(1)
    lms = {}
    for kernels in ("hf", "packed", "packed-bf16"):
        lm = CachedLM(load_role(role, model_dir(role), kernels).model, kernels)
        lm.forward(torch.randint(5, 1000, (1, 64)))
        lms[kernels] = lm
    times: dict[tuple[str, int], list[float]] = {(k, n): [] for k in lms for n in widths}
    for round_ in range(rounds + 1):
        for kernels, lm in lms.items():
            for n in widths:
                seconds = timed_forward(lm, n)
                if round_ > 0:  # round 0 warms up
                    times[(kernels, n)].append(seconds)
    hf_decode = statistics.median(times[("hf", 1)])
    print(f"{role}, 64-token context, one thread, median of {rounds} forwards each")
    for kernels in lms:
        ms = {n: 1000 * statistics.median(times[(kernels, n)]) for n in widths}
        cells = "  ".join(f"T={n}: {v:6.2f} ms" for n, v in ms.items())
        ratios = "  ".join(f"T={n}/T=1 {ms[n] / ms[1]:.2f}" for n in widths[1:])
        print(f"{kernels:12} {cells}  {ratios}  decode vs hf {hf_decode * 1000 / ms[1]:.2f}x")


if __name__ == "__main__":
    import sys

    main(role=sys.argv[1] if len(sys.argv) > 1 else "target")
