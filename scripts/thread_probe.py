"""`ar` tok/s on the bundled target at a forced thread count (docs/performance.md §8).

python scripts/thread_probe.py THREADS [relaxspec-first]: with a second argument relaxspec is
imported before torch (so its OMP_WAIT_POLICY default applies); otherwise the environment's
OpenMP settings stand. Prints the median of 3 runs of 64 greedy tokens.
"""

import os
import sys
import time

threads = int(sys.argv[1])
if len(sys.argv) > 2:
    import relaxspec  # noqa: F401

import torch  # noqa: E402 - after the optional relaxspec import, on purpose

from relaxspec.core.sampling import SamplingParams  # noqa: E402
from relaxspec.methods import build_engine, load_models  # noqa: E402

torch.set_num_threads(threads)
engine = build_engine("ar", load_models("ar"))
prompt = "Question: what is 12 + 30?\nAnswer:"
engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8))
params = SamplingParams(temperature=0, max_new_tokens=64, ignore_eos=True)
rates = []
for _ in range(3):
    started = time.perf_counter()
    out = engine.generate(prompt, params)
    rates.append(len(out.tokens) / (time.perf_counter() - started))
policy = os.environ.get("OMP_WAIT_POLICY", "-")
print(
    f"threads={threads} OMP_WAIT_POLICY={policy} GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', '-')} "
    f"tok/s={sorted(rates)[1]:.1f}"
)
