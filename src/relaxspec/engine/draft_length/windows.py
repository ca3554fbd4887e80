"""Measured goodput of decision windows: committed tokens per row-second, per batch-size bucket
(:func:`rows_bucket`) and side (AR or drafting), over whole windows (:class:`WindowRates`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np


def rows_bucket(rows: int) -> int:
    """Batch sizes grouped by powers of two: 1, 2, 3–4, 5–8, … -> 0, 1, 2, 3, …"""
    return max(0, int(rows - 1).bit_length())


@dataclass
class WindowRates:
    """Measured goodput per (batch-size bucket, side): committed tokens per row-second over whole
    decision windows, pool-wide. The sides are AR (K = 0) and drafting (any K > 0, the K the
    prediction picked at the time): comparing one drafting cell with AR, rather than the best of
    ``k_max`` noisy cells, keeps the comparison free of the winner's curse (the largest of several
    noisy ratios is biased high; docs/performance.md §6 shows a K = 6 cell that won so).

    A window is the time one decision (K for every row of a bucket) held, less its first
    ``settle_seconds`` after a change of K and less the time the batch spent prefilling joining
    rows (that costs the same at every K; counted, it made the AR baseline measured while a batch
    fills 20 % slower than AR runs). Its tokens are what every row committed in it, its
    row-seconds ∫ rows dt; a cell keeps decayed sums of tokens, row-seconds and wall seconds over
    its windows, so its goodput is a ratio of sums and its evidence the seconds behind it. Unlike
    per-cycle timings this needs no attribution of a lockstep round's wait to a row.
    """

    decay: float = 0.85  # weight of a cell's earlier windows when a new one is added
    min_row_seconds: float = 0.05  # shorter windows (and windows without tokens) are dropped
    cells: dict[tuple[int, bool], tuple[float, float, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, bucket: int, k: int, tokens: float, row_seconds: float, seconds: float) -> None:
        """One window at draft length ``k``: ``tokens`` committed over ``row_seconds`` (∫ rows dt)
        in ``seconds`` of wall time."""
        if not (row_seconds >= self.min_row_seconds) or not np.isfinite(row_seconds) or not tokens > 0:
            return  # too short, or no cycle ended in it: no evidence either way
        with self._lock:
            old = self.cells.get((bucket, k > 0), (0.0, 0.0, 0.0))
            new = (tokens, row_seconds, max(seconds, 0.0))
            self.cells[bucket, k > 0] = tuple(self.decay * o + n for o, n in zip(old, new, strict=True))

    def measured(self, bucket: int, k: int) -> bool:
        with self._lock:
            return (bucket, k > 0) in self.cells

    def evidence(self, bucket: int, k: int) -> float:
        """Decayed wall seconds of the windows behind the cell of ``k``'s side (0: none)."""
        with self._lock:
            return self.cells.get((bucket, k > 0), (0.0, 0.0, 0.0))[2]

    def goodput(self, bucket: int, k: int) -> float | None:
        """Tokens per row-second of ``k``'s side (None: never measured)."""
        with self._lock:
            cell = self.cells.get((bucket, k > 0))
        return None if cell is None else cell[0] / cell[1]


@dataclass
class _Window:
    """The running decision window: counted from ``start`` (after settling), tokens committed
    and row-seconds integrated up to ``last``."""

    start: float
    paused: float = 0.0  # the batch's paused seconds (prefills) counted up to ``last``
    last: float = field(init=False)
    rows: int = 0  # the batch size seen at ``last`` (0: none yet)
    tokens: float = 0.0
    row_seconds: float = 0.0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.last = self.start

    def advance(self, now: float, rows: int, paused: float) -> None:
        """Integrate the rows from ``last`` to ``now`` — the batch size seen at ``last``, which held
        until this call when every change of size is reported — less the batch's paused time."""
        if now > self.last >= self.start:
            dt = max(0.0, now - self.last - max(0.0, paused - self.paused))
            self.row_seconds += (self.rows or rows) * dt
            self.seconds += dt
            self.last = now
        self.paused, self.rows = paused, rows
