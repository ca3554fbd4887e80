"""Verify-of-(K+1) vs one decode step of the bundled target, fp32 vs bf16 weights (issue 14).

Interleaves, for each weight dtype, forwards of T = 1 and T = 9 new tokens after a 64-token
context through the engine's cached model call (``CachedLM``), one thread; prints the median ms
and the ratio. Pin it to a core for stable numbers: ``taskset -c 0 python scripts/verify_cost.py``.
"""

from __future__ import annotations

import statistics
import time

import torch

from relaxspec.engine.kv import CachedLM
from relaxspec.models import load_model, model_dir


def timed_forward(lm: CachedLM, n: int) -> float:
    tokens = torch.randint(5, 1000, (1, n))
    t0 = time.perf_counter()
    lm.forward(tokens, logits_to_keep=n)
    seconds = time.perf_counter() - t0
    lm.rollback(lm.length - n)
    return seconds


def main(rounds: int = 40, widths: tuple[int, ...] = (1, 9)) -> None:
    torch.set_num_threads(1)
    lms = {}
    for dtype in (torch.float32, torch.bfloat16):
        lm = CachedLM(load_model(model_dir("target"), dtype=dtype).model.eval(), str(dtype))
        lm.forward(torch.randint(5, 1000, (1, 64)))
        lms[dtype] = lm
    times: dict[tuple[torch.dtype, int], list[float]] = {(d, n): [] for d in lms for n in widths}
    for _ in range(rounds):
        for dtype, lm in lms.items():
            for n in widths:
                times[(dtype, n)].append(timed_forward(lm, n))
    for dtype in lms:
        ms = {n: 1000 * statistics.median(times[(dtype, n)]) for n in widths}
        cells = "  ".join(f"T={n}: {v:6.2f} ms" for n, v in ms.items())
        print(f"{dtype!s:15} {cells}  verify/decode {ms[widths[-1]] / ms[widths[0]]:.2f}")


if __name__ == "__main__":
    main()
