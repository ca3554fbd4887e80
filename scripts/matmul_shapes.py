"""Why verifying K + 1 tokens costs more than one decode step on this CPU (issue 14).

Times the target's MLP up-projection, ``[M, 384] × [384, 1024]`` fp32 at one thread, for M = 1
(decode) and M = 5, 9, 16 (verify K + 1), with PyTorch's linear and with MKL's packed GEMM (the
kernel inductor's CPU freezing uses), and prints µs, the ratio to M = 1 and GFLOP/s.

    python scripts/matmul_shapes.py
"""

from __future__ import annotations

import time

import torch


def fastest_us(fn, reps: int = 300, rounds: int = 7) -> float:
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best * 1e6


def main() -> None:
    torch.set_num_threads(1)
    weight = torch.randn(1024, 384)
    base = None
    print(f"{'M':>3} {'linear us':>10} {'ratio':>6} {'GFLOP/s':>8} {'mkl packed us':>14}")
    for m in (1, 5, 9, 16):
        x = torch.randn(m, 384)
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, m)
        linear = fastest_us(lambda x=x: torch.nn.functional.linear(x, weight))
        mkl = fastest_us(lambda x=x, p=packed: torch.ops.mkl._mkl_linear(x, p, weight, None, x.shape[0]))
        base = base or linear
        gflops = 2 * m * 384 * 1024 / linear / 1e3
        print(f"{m:>3} {linear:>10.1f} {linear / base:>6.2f} {gflops:>8.1f} {mkl:>14.1f}")


if __name__ == "__main__":
    main()
