"""`ar` tok/s on the bundled target under a thread setting (docs/performance.md §8).

    python scripts/thread_probe.py --threads 2            # forced count; the environment's OpenMP settings
    python scripts/thread_probe.py --threads auto         # relaxspec's choice (start-up sample + governor)
    python scripts/thread_probe.py --threads auto --late-neighbour          # a busy loop starts after loading
    python scripts/thread_probe.py --threads auto --late-neighbour --no-follow   # ... without the governor

``--relaxspec-first`` imports relaxspec before torch (so its OpenMP wait default applies;
``--threads auto`` implies it). The late neighbour is one busy process pinned to the highest CPU
of this process's set, started after the engine is loaded and warmed up (so the start-up sample
cannot see it). Prints the median of ``--rounds`` runs of ``--tokens`` greedy tokens.
"""

import argparse
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", default="auto")
ap.add_argument("--relaxspec-first", action="store_true")
ap.add_argument("--late-neighbour", action="store_true")
ap.add_argument("--no-follow", action="store_true")
ap.add_argument("--tokens", type=int, default=64)
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()
if args.relaxspec_first or args.threads == "auto":
    import relaxspec  # noqa: F401

import torch  # noqa: E402 - after the optional relaxspec import, on purpose

from relaxspec.core.sampling import SamplingParams  # noqa: E402
from relaxspec.engine.threads import configure_threads  # noqa: E402
from relaxspec.eval.contention import busy_neighbours  # noqa: E402
from relaxspec.methods import build_engine, load_models  # noqa: E402

if args.threads == "auto":
    configure_threads(follow=not args.no_follow)
else:
    torch.set_num_threads(int(args.threads))
engine = build_engine("ar", load_models("ar"))
prompt = "Question: what is 12 + 30?\nAnswer:"
engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8))
params = SamplingParams(temperature=0, max_new_tokens=args.tokens, ignore_eos=True)
rates = []
with busy_neighbours(1 if args.late_neighbour else 0):
    for _ in range(args.rounds):
        started = time.perf_counter()
        out = engine.generate(prompt, params)
        rates.append(len(out.tokens) / (time.perf_counter() - started))
env = " ".join(f"{k}={os.environ.get(k, '-')}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"))
print(
    f"threads={args.threads} late_neighbour={args.late_neighbour} follow={not args.no_follow} {env} "
    f"torch_threads_at_end={torch.get_num_threads()} tok/s={sorted(rates)[len(rates) // 2]:.1f}",
    file=sys.stdout,
)
