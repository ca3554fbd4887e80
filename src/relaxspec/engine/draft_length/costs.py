"""What a cycle costs: one forward over n tokens (:class:`StepCosts`, measured once on an idle
server by :func:`measure_step_costs`, corrected by every real forward in :class:`LiveStepCosts`),
and whole cycles per (batch-size bucket, K) (:class:`CycleCosts`: measured cells, else the
forwards' prediction plus K + 1 rounds of the measured per-round overhead)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import PreTrainedModel

from relaxspec.engine.kv import model_logits, new_cache
from relaxspec.errors import RelaxSpecError

TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

Costs = Callable[[float], float]  # seconds of one forward over n tokens


def ema(old: float | None, new: float, rate: float) -> float:
    """Exponential moving average step (the first value starts it)."""
    return new if old is None else old + rate * (new - old)


@dataclass(frozen=True)
class StepCosts:
    """Seconds of one forward over ``n`` new tokens, interpolated from measured points.

    ``tokens`` strictly increasing; beyond the last point the cost grows linearly with the last
    segment's slope (more tokens never cost less).
    """

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) < 2 or len(self.tokens) != len(self.seconds):
            raise RelaxSpecError("step costs need at least two (tokens, seconds) points")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:], strict=False)):
            raise RelaxSpecError("step-cost token counts must be strictly increasing")
        if any(not (s > 0) for s in self.seconds):
            raise RelaxSpecError("step costs must be positive seconds")

    def __call__(self, n_tokens: float) -> float:
        x, y = self.tokens, self.seconds
        if n_tokens <= x[-1]:
            return float(np.interp(n_tokens, x, y))
        slope = max((y[-1] - y[-2]) / (x[-1] - x[-2]), 0.0)
        return y[-1] + slope * (n_tokens - x[-1])


@dataclass
class LiveStepCosts:
    """:class:`StepCosts` measured once (``prior``), corrected by the forwards actually run.

    Each observed forward (n tokens, s seconds) moves the ratio ``s / prior(n)`` at the grid point
    nearest n (in log₂ n) by an exponential moving average, and a global ratio used at grid
    points never observed; the cost is ``prior(n)`` × the interpolated ratio. So what the server
    runs today corrects the shape and the level of the calibration without a cost point it never
    uses drifting apart from the ones it does.
    """

    prior: StepCosts
    rate: float = 0.2
    global_rate: float = 0.05
    ratios: list[float | None] = field(default_factory=list)
    global_ratio: float = 1.0
    observed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.ratios = [None] * len(self.prior.tokens)
        self._log_tokens = np.log2(np.asarray(self.prior.tokens, dtype=float))

    def observe(self, n_tokens: int, seconds: float) -> None:
        if n_tokens < 1 or not (seconds > 0) or not np.isfinite(seconds):
            return
        ratio = seconds / self.prior(n_tokens)
        j = int(np.argmin(np.abs(self._log_tokens - np.log2(n_tokens))))
        with self._lock:
            self.ratios[j] = ema(self.ratios[j], ratio, self.rate)
            self.global_ratio = ema(self.global_ratio if self.observed else None, ratio, self.global_rate)
            self.observed += 1

    def __call__(self, n_tokens: float) -> float:
        with self._lock:
            ratios = [self.global_ratio if r is None else r for r in self.ratios]
        ratio = float(np.interp(np.log2(max(n_tokens, 1.0)), self._log_tokens, ratios))
        return self.prior(n_tokens) * ratio


def isotonic(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return [m for m, c in blocks for _ in range(int(c))]


@torch.inference_mode()
def measure_step_costs(
    model: PreTrainedModel,
    token_counts: Sequence[int] = TOKEN_COUNTS,
    context: int = 64,
    rounds: int = 5,
) -> StepCosts:
    """Time ``model``'s forward over n new tokens after a ``context``-token prefix, for each n in
    ``token_counts``; returns :class:`StepCosts`.

    One warm-up round, then ``rounds`` rounds over all n; each n keeps its fastest time (other
    load only ever adds time, and interleaving the rounds keeps one burst of it from hitting
    every measurement of one n), made non-decreasing in n by :func:`isotonic`. Token counts that
    do not fit the model's context window are skipped.
    """
    limit = int(getattr(model.config, "max_position_embeddings", 2048))
    vocab = model.get_input_embeddings().weight.shape[0]
    counts = [n for n in token_counts if context + n <= limit]
    if len(counts) < 2:
        raise RelaxSpecError(f"the model's context ({limit}) is too short to measure step costs")
    generator = torch.Generator().manual_seed(0)
    cache = new_cache(model)
    model_logits(model, torch.randint(0, vocab, (1, context), generator=generator), cache, 1)
    inputs = [torch.randint(0, vocab, (1, n), generator=generator) for n in counts]
    fastest = [float("inf")] * len(counts)
    for round_ in range(rounds + 1):
        for i, tokens in enumerate(inputs):
            t0 = time.perf_counter()
            model_logits(model, tokens, cache, tokens.shape[1])
            if round_ > 0:  # round 0 warms up
                fastest[i] = min(fastest[i], time.perf_counter() - t0)
            cache.crop(context)
    return StepCosts(tuple(counts), tuple(max(s, 1e-7) for s in isotonic(fastest)))


@dataclass
class CycleCosts:
    """Measured seconds of whole cycles, per (batch-size bucket, K): the median of each cell's
    last ``window`` cycles (robust to the slow cycles around a change of decision).

    ``estimate`` returns the measured cell where there is one, else the forwards' ``predicted``
    seconds plus ``K + 1`` rounds of the bucket's measured per-round overhead. A cycle at draft
    length K is K + 1 rounds (K draft forwards, one verify): in a lockstep batch each round also
    pays the wake-up of every row's thread, their sampling and bookkeeping under the GIL and the
    batch's masks, a cost that scales with rounds and rows, not with the forward's tokens. It is
    learned from the AR cycles (one round each) as ``seconds − predicted``, so the AR baseline
    alone already prices the rounds a K > 0 cycle would add. A bucket never measured uses the
    global overhead (0 before any AR cycle).

    A drafting round does more than an AR round beyond its forward (proposal bookkeeping, the
    rule over K + 1 rows, the cache's rollback), so that AR-priced estimate of a drafting cell is
    optimistic. ``drafting_correction`` learns by how much: the moving ratio of each measured
    drafting cycle's seconds to its AR-priced estimate, applied to drafting cells not measured
    yet (at a new batch size: the ratio learned at the others).
    """

    rate: float = 0.1
    window: int = 16
    cells: dict[tuple[int, int], deque[float]] = field(default_factory=dict)
    overheads: dict[int, float] = field(default_factory=dict)  # bucket -> seconds per round
    global_overhead: float | None = None
    drafting_correction: float = 1.0
    max_correction: float = 4.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(self, bucket: int, k: int, seconds: float, predicted: float) -> None:
        if not (seconds > 0) or not np.isfinite(seconds) or not (predicted > 0):
            return
        if k > 0:
            ratio = seconds / (predicted + (k + 1) * self.overhead(bucket))
        with self._lock:
            self.cells.setdefault((bucket, k), deque(maxlen=self.window)).append(seconds)
            if k == 0:  # an AR cycle is one round: its excess over the forward is the round's
                per_round = max(0.0, seconds - predicted)
                self.overheads[bucket] = ema(self.overheads.get(bucket), per_round, self.rate)
                self.global_overhead = ema(self.global_overhead, per_round, self.rate)
            else:
                updated = ema(self.drafting_correction, ratio, self.rate)
                self.drafting_correction = min(max(updated, 1 / self.max_correction), self.max_correction)

    def measured(self, bucket: int, k: int) -> bool:
        with self._lock:
            return bool(self.cells.get((bucket, k)))

    def overhead(self, bucket: int) -> float:
        """Seconds per round beyond the forwards in ``bucket`` (the global value if unmeasured)."""
        with self._lock:
            return self.overheads.get(bucket, self.global_overhead or 0.0)

    def estimate(self, bucket: int, k: int, predicted: float) -> float:
        with self._lock:
            measured = self.cells.get((bucket, k))
            if measured:
                return float(np.median(measured))
            correction = self.drafting_correction if k > 0 else 1.0
        return (predicted + (k + 1) * self.overhead(bucket)) * correction
