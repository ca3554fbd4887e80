"""The sampler's counters where the API server reads them for ``/metrics`` (docs/vllm.md).

Each sampler process keeps one file ``<pid>.stats`` in ``RELAXSPEC_VLLM_STATS_DIR``: little-endian
int64 slots — a magic number, the capacity C, the draft positions counted so far, rows verified,
tokens emitted, then drafted / accepted / relaxed-only counts per position, C each — mapped into
memory, so a step updates its counts with a few stores instead of writing and renaming a file
(what that cost per step: docs/vllm-proposers.md, "Session 36"). A new file (the first step, or a
draft length past C) is written whole under another name and renamed into place, so a reader never
sees a partial header; a reader may see one step's counts half-updated, a step late at worst.
"""

from __future__ import annotations

import glob
import mmap
import os
from typing import Any

import numpy as np

MAGIC = 0x7273_7374_6174_7331  # "rsstats1"
HEADER = 5  # magic, capacity, positions, rows, emitted
MIN_CAPACITY = 64
SUFFIX = ".stats"
PER_POSITION = ("drafted_per_pos", "accepted_per_pos", "relaxed_per_pos")


class StatsFile:
    """One process's counters file, mapped into memory (see the module doc)."""

    def __init__(self, where: str, capacity: int) -> None:
        self.path = os.path.join(where, f"{os.getpid()}{SUFFIX}")
        self.capacity = capacity
        slots = np.zeros(HEADER + 3 * capacity, dtype="<i8")
        slots[0], slots[1] = MAGIC, capacity
        tmp = f"{self.path}.tmp"
        with open(tmp, "wb") as f:
            f.write(slots.tobytes())
        os.replace(tmp, self.path)
        with open(self.path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), slots.nbytes)
        self.slots = np.ndarray(slots.shape, dtype="<i8", buffer=self._map)

    def write(self, rows: int, emitted: int, per_position: tuple[list[int], list[int], list[int]]) -> None:
        """Store the counts (each list at most ``capacity`` long)."""
        self.slots[2:5] = (len(per_position[0]), rows, emitted)
        for i, values in enumerate(per_position):
            start = HEADER + i * self.capacity
            self.slots[start : start + len(values)] = values


_open: dict[tuple[str, int], StatsFile] = {}


def stats_file(where: str, positions: int) -> StatsFile:
    """This process's file in ``where``, with room for ``positions`` draft positions (a larger
    file replaces a smaller one)."""
    key = (where, os.getpid())
    current = _open.get(key)
    if current is None or current.capacity < positions:
        capacity = max(MIN_CAPACITY, 2 * positions if current else positions)
        current = _open[key] = StatsFile(where, capacity)
    return current


def read_one(path: str) -> dict[str, Any] | None:
    """The counts in one file, or None if it is not (or not yet) a counters file."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    slots = np.frombuffer(raw[: len(raw) // 8 * 8], dtype="<i8")
    if len(slots) < HEADER or slots[0] != MAGIC or len(slots) != HEADER + 3 * int(slots[1]):
        return None
    cap, positions = int(slots[1]), min(int(slots[2]), int(slots[1]))
    out: dict[str, Any] = {"rows": int(slots[3]), "emitted": int(slots[4])}
    for i, key in enumerate(PER_POSITION):
        out[key] = slots[HEADER + i * cap : HEADER + i * cap + positions].tolist()
    return out


def read_stats(where: str) -> dict[str, Any]:
    """Sum of the counts every sampler process left in ``where``."""
    total: dict[str, Any] = {"rows": 0, "emitted": 0, **{key: [] for key in PER_POSITION}}
    for path in glob.glob(os.path.join(where, f"*{SUFFIX}")):
        data = read_one(path)
        if data is None:
            continue
        total["rows"] += data["rows"]
        total["emitted"] += data["emitted"]
        for key in PER_POSITION:
            acc = total[key]
            acc.extend([0] * (len(data[key]) - len(acc)))
            for i, v in enumerate(data[key]):
                acc[i] += v
    return total
