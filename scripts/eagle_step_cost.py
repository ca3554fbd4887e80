"""Where an EAGLE drafted token's time goes on our engine: one head step and the LM head on its
feature, over the full vocabulary and over a draft vocabulary (EAGLE-3's reduced LM head, as the
proposer runs it: the rows' product, then spread to the full vocabulary), microseconds per call.

    taskset -c 0 python scripts/eagle_step_cost.py [--head models/eagle] [--rows 1024]

Single thread; run it with the other cores idle. Figures: docs/models.md (EAGLE-3's training-time
test section).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.packed import packed_forward
from relaxspec.engine.proposers.draft_vocab import ReducedHead
from relaxspec.engine.proposers.rows import drafter_logits
from relaxspec.methods import build_engine, load_models


def per_call_us(fn: Callable[[], object], n: int) -> float:
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head", default="models/eagle")
    ap.add_argument(
        "--rows", type=int, default=1024, help="draft vocabulary size (the reduced LM head's rows)"
    )
    ap.add_argument("--repeats", type=int, default=2000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    models = load_models("sd", {"draft": args.head})
    engine = build_engine("sd", models, k=8)
    engine.generate("def f(x):\n    return", SamplingParams(temperature=0, max_new_tokens=16))
    proposer, target = engine.proposer, models.target.model
    packed = packed_forward(target)
    hidden = torch.randn(1, 1, target.config.hidden_size)
    reduced_head = ReducedHead(target, torch.randperm(target.config.vocab_size)[: args.rows].sort().values)
    token = torch.tensor([[5]])

    def head_step() -> torch.Tensor:
        n = proposer.cache.get_seq_length()
        out = proposer._step(hidden, token, n)
        proposer.cache.crop(n)
        return out

    with torch.inference_mode():
        rows = [
            (
                "head step (token row, fc feature half, layer; 1 token)",
                per_call_us(head_step, args.repeats // 2),
            ),
            ("LM head, all rows", per_call_us(lambda: drafter_logits(target, hidden), args.repeats)),
            (
                f"LM head, {args.rows}-token draft vocabulary",
                per_call_us(lambda: reduced_head(hidden), args.repeats),
            ),
        ]
    print(f"kernels: {packed.weights if packed is not None else 'hf'}")
    for name, us in rows:
        print(f"{name:50s} {us:8.0f} µs")


if __name__ == "__main__":
    main()
