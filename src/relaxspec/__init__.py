"""relaxspec: speculative decoding with relaxed verification (NSD, verifier skipping, ProVe)."""

import os
import sys

# OpenMP threads sleep at barriers instead of spinning (unless the user chose otherwise): on a
# shared CPU a spinning thread burns the time slice its sibling needs, and the engine collapses
# beside a busy neighbour (docs/performance.md, "Sharing the CPU"). libgomp reads this once, when
# torch loads it, so it only takes effect if relaxspec is imported first (the CLI always is).
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from relaxspec.errors import RelaxSpecError

__version__ = "0.1.0"
__all__ = ["RelaxSpecError", "__version__"]
