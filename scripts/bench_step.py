"""The decode-step microbenchmark (issue 32): ms per forward of one model, per kernel choice.

For each ``--kernels`` choice (engine/packed.py ``KERNELS``) and layer loop (``--loops``: ``cpp``,
the default — the C++ loop of engine/native.py with its own kernels (few-row bf16 products, a
decode step's attention) and decode steps fused; ``cpp-unfused``, the same with the loop's ATen
operators between the products;
``cpp-torch``, the C++ loop on torch's kernels (oneDNN's products, torch's attention);
``python``, the Python loop on torch's kernels, as before session 32) a :class:`CachedLM` of the model is
filled with a ``--context``-token prompt; then, in interleaved rounds (every choice, every width,
in the same round, so load on the machine hits all alike), one forward of T = 1 (a decode step)
and one of T = K + 1 (a verify) after that context, rolled back after each. Each forward records
its wall time (``perf_counter``) and this thread's CPU time (``thread_time``: what a loaded core
does not inflate). Prints medians with 95 % bootstrap intervals, the verify/decode ratio and each
row's speed over the first row's (ratio of total times with the bench's paired jackknife over
rounds, eval/intervals.py ``speed_ratio``), and writes the samples and summaries as JSON. Pin it
to one core, one thread::

    RELAXSPEC_THREADS=1 taskset -c 0 python scripts/bench_step.py --kernels packed-bf16,packed-int8 \\
        --loops python,cpp-torch,cpp-unfused,cpp --out results/bench_step/target.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import numpy as np
import torch

from relaxspec.engine.kv import CachedLM
from relaxspec.engine.native import python_layers, torch_kernels, unfused
from relaxspec.engine.threads import configure_threads
from relaxspec.eval.intervals import speed_ratio
from relaxspec.methods import load_role
from relaxspec.models import model_dir

LOOPS = {  # --loops choice -> the contexts it runs in
    "cpp": (),
    "cpp-unfused": (unfused,),
    "cpp-torch": (torch_kernels,),
    "python": (python_layers, torch_kernels),
}


def median_interval(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """``(median, low, high)``: the sample median and a 95 % percentile-bootstrap interval."""
    x = np.asarray(values)
    draws = np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))
    low, high = np.quantile(np.median(x[draws], axis=1), [0.025, 0.975])
    return float(np.median(x)), float(low), float(high)


def paired_ratio(base: list[float], other: list[float]) -> tuple[float, float, float]:
    """``(ratio, low, high)``: total time of ``base`` over total time of ``other`` — the bench's
    speed ratio (eval/intervals.py ``speed_ratio``, jackknife over rounds: one forward per round
    and row, so rounds are the paired units)."""
    ones = [1.0] * len(base)
    iv = speed_ratio(ones, other, ones, base)
    return iv.estimate, iv.low, iv.high


def timed_forward(lm: CachedLM, width: int, generator: torch.Generator, loop: str) -> tuple[float, float]:
    """(wall s, CPU s) of one forward of ``width`` random tokens after the cached context."""
    tokens = torch.randint(5, 1000, (1, width), generator=generator)
    with contextlib.ExitStack() as stack:
        for setting in LOOPS[loop]:
            stack.enter_context(setting())
        wall, cpu = time.perf_counter(), time.thread_time()
        lm.forward(tokens, logits_to_keep=width)
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    lm.rollback(lm.length - width)
    return wall, cpu


def measure(
    role: str, kernels: list[str], loops: list[str], widths: list[int], rounds: int, context: int
) -> dict:
    """Samples ``{"kernels:loop": {width: {"wall": [...], "cpu": [...]}}}`` in seconds (round 0
    dropped)."""
    generator = torch.Generator().manual_seed(0)
    lms = {}
    for choice in kernels:
        model = load_role(role, model_dir(role), choice).model
        for loop in loops:
            lm = CachedLM(model, choice)
            lm.forward(torch.randint(5, 1000, (1, context), generator=generator))
            lms[f"{choice}:{loop}"] = lm
    samples = {k: {w: {"wall": [], "cpu": []} for w in widths} for k in lms}
    for round_ in range(rounds + 1):
        for choice, lm in lms.items():
            for width in widths:
                wall, cpu = timed_forward(lm, width, generator, choice.split(":")[1])
                if round_ > 0:  # round 0 warms up
                    samples[choice][width]["wall"].append(wall)
                    samples[choice][width]["cpu"].append(cpu)
    return samples


def summarise(samples: dict) -> dict:
    """Per kernels and width: medians (ms) with bootstrap intervals, wall and CPU."""
    out = {}
    for choice, by_width in samples.items():
        out[choice] = {}
        for width, clocks in by_width.items():
            out[choice][width] = {}
            for clock, xs in clocks.items():
                median, low, high = (1e3 * v for v in median_interval(xs))
                out[choice][width][clock] = {"median_ms": median, "low_ms": low, "high_ms": high}
    return out


def speedups(samples: dict, widths: list[int]) -> dict:
    """Per row, width and clock: the first row's total time over this row's, with its interval."""
    first = next(iter(samples.values()))
    return {
        choice: {w: {c: paired_ratio(first[w][c], by_width[w][c]) for c in ("cpu", "wall")} for w in widths}
        for choice, by_width in samples.items()
    }


def print_decode_table(summary: dict, speed: dict) -> None:
    """``--k 0``: decode steps back to back, no verify between them (what AR runs)."""
    print(f"{'kernels:loop':<19} {'clock':<5} {'decode T=1 ms':>22} {'decode speed vs row 1':>22}")
    for choice, by_width in summary.items():
        for clock in ("cpu", "wall"):
            c, (r, lo, hi) = by_width[1][clock], speed[choice][1][clock]
            cell = f"{c['median_ms']:6.2f} [{c['low_ms']:.2f}, {c['high_ms']:.2f}]"
            print(f"{choice:<19} {clock:<5} {cell:>22} {f'{r:.2f}x [{lo:.2f}, {hi:.2f}]':>22}")


def print_table(summary: dict, speed: dict, widths: list[int]) -> None:
    if len(widths) == 1:
        return print_decode_table(summary, speed)
    decode, verify = widths
    head = f"{'kernels:loop':<19} {'clock':<5} {'decode T=1 ms':>22} {f'verify T={verify} ms':>22}"
    print(f"{head} {'verify/decode':>13} {'decode speed vs row 1':>22} {'verify speed vs row 1':>22}")
    for choice, by_width in summary.items():
        for clock in ("cpu", "wall"):
            a, b = by_width[decode][clock], by_width[verify][clock]
            cells = [f"{c['median_ms']:6.2f} [{c['low_ms']:.2f}, {c['high_ms']:.2f}]" for c in (a, b)]
            ratio = b["median_ms"] / a["median_ms"]
            fast = [speed[choice][w][clock] for w in widths]
            rel = [f"{r:.2f}x [{lo:.2f}, {hi:.2f}]" for r, lo, hi in fast]
            times = f"{cells[0]:>22} {cells[1]:>22} {ratio:>12.2f}x"
            print(f"{choice:<19} {clock:<5} {times} {rel[0]:>22} {rel[1]:>22}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--role", default="target", help="bundled model role (target, draft)")
    parser.add_argument("--kernels", default="packed,packed-bf16,packed-int8", help="comma-separated")
    parser.add_argument("--loops", default="cpp", help=f"comma-separated: {', '.join(LOOPS)}")
    parser.add_argument(
        "--k", type=int, default=4, help="draft length: a verify of K + 1 tokens (0: decode steps only)"
    )
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--context", type=int, default=64, help="tokens in the cache before each forward")
    parser.add_argument("--out", type=Path, default=None, help="JSON file for samples and summary")
    args = parser.parse_args()
    threads = configure_threads()
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    widths = [1, args.k + 1] if args.k > 0 else [1]
    loops = [loop.strip() for loop in args.loops.split(",") if loop.strip()]
    if not set(loops) <= set(LOOPS):
        parser.error(f"--loops takes {', '.join(LOOPS)}, not {args.loops!r}")
    samples = measure(args.role, kernels, loops, widths, args.rounds, args.context)
    summary, speed = summarise(samples), speedups(samples, widths)
    print(f"{args.role}, {args.context}-token context, {threads} thread(s), {args.rounds} interleaved rounds")
    print_table(summary, speed, widths)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"role": args.role, "context": args.context, "threads": threads, "rounds": args.rounds,
                  "widths": widths, "summary": summary, "speed_vs_first": speed,
                  "samples_s": samples}  # fmt: skip
        args.out.write_text(json.dumps(record, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
