"""relaxspec: speculative decoding with relaxed verification (NSD, verifier skipping, ProVe)."""

import os
import sys

# OpenMP threads spin briefly at a barrier, then sleep (unless the user chose a policy): spinning
# forever burns the time slice a sibling sharing its core needs (the engine collapses beside a
# busy neighbour), sleeping at once pays a wake-up per parallel region (half the speed on an idle
# machine); docs/performance.md, "Sharing the CPU". libgomp reads this once, when torch loads it,
# so it only takes effect if relaxspec is imported first (the CLI always is).
SPIN_COUNT = "10000"  # busy-wait iterations (~10-50 µs)
if "torch" not in sys.modules and not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & os.environ.keys():
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT

from relaxspec.errors import RelaxSpecError  # noqa: E402 - after the OpenMP setting, on purpose

__version__ = "0.1.0"
__all__ = ["RelaxSpecError", "__version__"]
