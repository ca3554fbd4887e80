"""Busy neighbours for the contention benchmark (``relaxspec bench --busy-neighbour N``).

A shared machine is the common case: the benchmark can start N processes that each spin on one
CPU for the whole run, so the docs can show the engine's speed beside a busy neighbour against
its idle speed (docs/performance.md, "Sharing the CPU").
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from relaxspec.errors import RelaxSpecError

# Spin, and exit once orphaned (argv[1]: the parent's pid): a benchmark killed by a signal runs
# no `finally`, and must not leave a busy loop behind.
SPIN = "import os, sys\nwhile os.getppid() == int(sys.argv[1]):\n    for _ in range(100_000):\n        pass\n"


def neighbour_cpus(n: int, cpus: set[int]) -> list[int]:
    """The CPUs N neighbours are pinned to: the highest-numbered ones of ``cpus``, one each
    (round-robin when N exceeds them)."""
    ordered = sorted(cpus, reverse=True)
    return [ordered[i % len(ordered)] for i in range(n)]


@contextmanager
def busy_neighbours(n: int) -> Iterator[list[int]]:
    """Run ``n`` busy-loop processes, each pinned to one CPU of this process's affinity set, for
    the duration of the block; yields their CPUs. They are stopped however the block ends."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 64:
        raise RelaxSpecError(f"--busy-neighbour must be an integer in 0..64, got {n!r}")
    procs: list[subprocess.Popen] = []
    cpus = neighbour_cpus(n, set(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else []
    try:
        for cpu in cpus:
            proc = subprocess.Popen([sys.executable, "-c", SPIN, str(os.getpid())], stdin=subprocess.DEVNULL)
            procs.append(proc)
            os.sched_setaffinity(proc.pid, {cpu})
        yield cpus
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
