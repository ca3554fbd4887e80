"""Draft length chosen per cycle for goodput: speculation that adapts to load (issue 14).

A fixed draft length K is right for one request and wrong under load: in a batched step every row
verifies K + 1 tokens, so the verifier's forward grows with B·(K + 1) tokens while the tokens a
row gains per cycle do not. :class:`GoodputDraftLength` picks, before each cycle, the K in
``0 .. k_max`` (0 = a plain AR step) that maximises expected committed tokens per *second*:

    E[tokens | K] = Σ_{i=0}^{K} Π_{j=1}^{i} α_j        (the i = 0 term: the bonus / recovered token)
    T(K, B)       = t_target(B·(K+1)) + K · t_draft(B)        (predicted; then measured, below)
    K*            = argmax_K  E[tokens | K] / T(K, B)

where α_j is the measured rate at which draft position j is accepted given that positions
``< j`` were (:class:`AcceptanceTracker`, exponentially decayed so it follows the workload),
``t_model(n)`` the seconds of one forward over n new tokens (matrix multiplies on a CPU cost far
from linearly in n at small n): measured once on an idle server (:func:`measure_step_costs`),
then corrected by every real forward the server runs (:class:`LiveStepCosts`: load from other
processes, batching holes), and B the number of rows that share the step (1 without batching).
Forwards are not the whole cycle: sampling and the rule over K + 1 full-vocabulary rows, text
and stop strings, and the wait for the other rows of a lockstep batch all grow with B and K. So
the policy also times every whole cycle (:class:`CycleCosts`): where a (B, K) cell was measured,
its measured seconds replace the prediction; elsewhere the prediction adds K + 1 rounds of the
per-round overhead measured in B's bucket (a lockstep round costs the same thread wake-ups and
bookkeeping whether it runs a draft or a verify forward). Because ``K = 0`` is always a
candidate, the policy only speculates where it expects more tokens per second than AR.

What decides between AR and drafting is measured, not predicted, as evidence comes in:
committed tokens per row-second over whole decision windows (:class:`WindowRates`), one cell for
AR and one for drafting per batch-size bucket (the prediction only picks *which* K drafts, and
shapes the goodput over K). AR is measured first at each batch size; drafting's advantage over it
is the windows' ratio blended with the predicted ratio by evidence (``prior_seconds`` for the
prediction against the seconds of windows behind the measurement); drafting must beat AR by
``draft_margin`` and is credited with no more than smaller batches measured
(:meth:`GoodputDraftLength._smaller_batch_advantage`). Time the batch spent prefilling joining
rows is left out of the windows: it is the same at every K.

One choice holds for every row for ``decision_seconds`` (or until the batch size changes bucket),
so the rows of a lockstep batch draft alike. From K = 0, a batch size must hold for
``entry_seconds`` before it may start drafting (the switch costs a catch-up of the draft model on
every row; dips of the batch size as rows leave in waves last less than that). A policy that stays
on one side sees only that side's costs: after ``probe_interval`` seconds at K = 0 it drafts
anyway (its best K > 0) for a ``probe_window``, so that α and the cycle costs of K > 0 keep
tracking the workload, and after as long drafting it runs AR steps for a window, so that the AR
baseline does too (it is measured first, while a batch fills and every step also prefills joining
rows, which makes AR look slower than it runs in steady state). A probe after which the choice
stays on its side doubles the interval (up to ``max_probe_backoff`` ×); a change of side resets
it. While drafting's measured advantage is marginal (under ``marginal_advantage``), AR is probed
every ``marginal_probe_interval`` seconds instead, so that both sides carry comparable evidence.
Probes are windows of time, not every n-th choice, so that all rows of a lockstep batch probe
together: one drafting row would make the others' AR steps wait for it and make AR look as slow as
speculation.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import PreTrainedModel

from relaxspec.core.acceptance import Greedy, Rule
from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.kv import model_logits, new_cache
from relaxspec.errors import RelaxSpecError

TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

Costs = Callable[[float], float]  # seconds of one forward over n tokens


def needs_fixed_k(rule: Rule | None, params: SamplingParams) -> bool:
    """True when a request must keep its draft length fixed for its output to be reproducible.

    A seeded or greedy request promises the same output for the same request, whatever else is
    in flight; the adaptive policy follows measured timings, so it may only vary K where K
    cannot change the output. That is the case for exactly one kind of request: greedy decoding
    with the exact greedy rule, whose output is the target's argmax sequence at every K. With a
    relaxed rule the accepted text depends on which drafts are proposed, and with sampling the
    random stream each cycle consumes depends on K (even for exact rules, which are exact in
    distribution only). An unseeded sampling request promises nothing, so it adapts.
    """
    if rule is None or not (params.greedy or params.seed is not None):
        return False
    return not (params.greedy and isinstance(rule, Greedy))


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
class AcceptanceTracker:
    """Per-position conditional acceptance rates ``α_j``, exponentially decayed.

    ``reached[j]`` counts cycles that drafted position j + 1 with positions ``≤ j`` accepted,
    ``accepted[j]`` those that also accepted it. Each starts from ``prior_weight`` pseudo-cycles
    at rate ``prior``, so a fresh tracker speculates and learns.
    """

    k_max: int
    decay: float = 0.99
    prior: float = 0.7
    prior_weight: float = 2.0
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.k_max < 1 or not 0 < self.decay <= 1 or not 0 <= self.prior <= 1:
            raise RelaxSpecError("AcceptanceTracker needs k_max >= 1, decay in (0, 1], prior in [0, 1]")
        self.reached = [self.prior_weight] * self.k_max
        self.accepted = [self.prior_weight * self.prior] * self.k_max

    def observe(self, proposed: int, accepted: int) -> None:
        """Record one verified cycle that drafted ``proposed`` tokens and accepted ``accepted``."""
        with self._lock:
            self.reached = [r * self.decay for r in self.reached]
            self.accepted = [a * self.decay for a in self.accepted]
            for j in range(min(proposed, accepted + 1, self.k_max)):
                self.reached[j] += 1.0
                if j < accepted:
                    self.accepted[j] += 1.0

    def rates(self) -> list[float]:
        """``[α_1 .. α_{k_max}]``."""
        with self._lock:
            return [a / r for a, r in zip(self.accepted, self.reached, strict=True)]


def expected_tokens(rates: Sequence[float], k: int) -> float:
    """``E[tokens | K = k] = Σ_{i=0}^{k} Π_{j≤i} α_j``: committed tokens per verified cycle."""
    total, survive = 1.0, 1.0
    for alpha in rates[:k]:
        survive *= alpha
        total += survive
    return total


def best_draft_length(
    rates: Sequence[float], k_max: int, seconds: Callable[[int], float]
) -> tuple[int, list[float]]:
    """``(K*, goodput per K)``: expected tokens per second for K = 0 .. k_max, where
    ``seconds(K)`` is the time of one cycle at draft length K (module doc)."""
    goodput = [expected_tokens(rates, k) / seconds(k) for k in range(k_max + 1)]
    return int(np.argmax(goodput)), goodput


def rows_bucket(rows: int) -> int:
    """Batch sizes grouped by powers of two: 1, 2, 3–4, 5–8, … -> 0, 1, 2, 3, …"""
    return max(0, int(rows - 1).bit_length())


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


@dataclass
class WindowRates:
    """Measured goodput per (batch-size bucket, side): committed tokens per row-second over whole
    decision windows, pool-wide. The sides are AR (K = 0) and drafting (any K > 0, the K the
    prediction picked at the time): comparing one drafting cell with AR, rather than the best of
    ``k_max`` noisy cells, keeps the comparison free of the winner's curse (the largest of several
    noisy ratios is biased high: measured, a K = 6 cell at 1.8x AR from one short window).

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


@dataclass
class GoodputDraftLength:
    """Choose each cycle's draft length from the batch size and measured acceptance.

    ``rows()`` returns how many rows share a step now (the batcher's active generations; 1 for a
    request decoded alone), ``load()`` how many requests the server holds (running, queued or
    being set up): a decision is for the larger of the two, so that the batch does not switch to
    drafting while rows leave and the next requests join (their prefills run one by one: at 32
    clients the batch sits at ~8-12 rows for ~0.3 s per wave of requests) — the window's tokens
    per row-second count the rows that run; ``paused()`` the seconds so far in which the rows did
    nothing that depends on K (prefills of joining rows, and no request running at all), which no window
    counts. One instance is shared by the requests of one method, so acceptance is learned across
    them.
    """

    target_costs: Costs  # a StepCosts or LiveStepCosts
    draft_costs: Costs
    k_max: int
    rows: Callable[[], int] = lambda: 1
    load: Callable[[], int] = lambda: 0  # requests in the server (decisions: the larger of the two)
    decision_seconds: float = 2.0  # how long one choice of K holds for every row
    probe_interval: float = 10.0  # seconds at K = 0 before a probe
    probe_window: float = 1.0  # seconds a probe lasts (settling, then evidence)
    max_probe_backoff: float = 32.0  # a probe that confirms the side doubles the interval, up to this
    settle_seconds: float = 0.2  # cycles ending this soon after a change of K are not measured
    entry_seconds: float = 0.25  # at K = 0, a new batch size must hold this long before drafting
    integrate_seconds: float = 0.05  # a window's row-seconds are integrated at least this often
    draft_margin: float = 0.05  # drafting must beat AR's goodput by this much
    min_evidence_seconds: float = 0.5  # seconds of windows that establish a side (AR first; probes)
    marginal_advantage: float = 1.15  # drafting measured below this over AR: AR probed often
    marginal_probe_interval: float = 3.0  # seconds drafting between AR probes where marginal
    prior_seconds: float = 0.5  # weight of the predicted drafting advantage, in seconds of windows
    paused: Callable[[], float] = lambda: 0.0  # seconds on work every K pays alike, or idle
    clock: Callable[[], float] = time.perf_counter
    tracker: AcceptanceTracker | None = None
    cycles: CycleCosts = field(default_factory=CycleCosts)
    windows: WindowRates = field(default_factory=WindowRates)
    _chosen: dict[int, int] = field(default_factory=dict)  # K -> cycles (see ``chosen``)
    _choices: deque[int] = field(default_factory=deque)  # choices not yet counted into _chosen
    _drafting: bool = False  # the side (AR or K > 0) of the decisions since _side_since
    _side_since: float | None = None
    _probe_until: float = float("-inf")
    _probe_k: int = 0  # the draft length of the running probe
    _probe_bucket: int = -1  # the batch-size bucket it was started in
    _probe_backoff: float = 1.0
    _probed: bool = False  # a probe ran and no decision has followed it yet
    _decision: int = 0
    _decided_at: float = float("-inf")
    _changed_at: float = float("-inf")
    _decided_bucket: int = -1
    _entry_until: float = float("-inf")  # end of the running hold at AR after a change of batch size
    _window: _Window = field(default_factory=lambda: _Window(start=float("inf")))
    _predicted: dict[tuple[int, int], float] = field(default_factory=dict)  # (rows, K) -> seconds
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.k_max < 1:
            raise RelaxSpecError(f"adaptive draft length needs k_max >= 1, got {self.k_max}")
        if self.tracker is None:
            self.tracker = AcceptanceTracker(self.k_max)

    def choose(self, k_cap: int) -> int:
        """The draft length for the next cycle, at most ``min(k_cap, k_max)``."""
        cap = max(0, min(k_cap, self.k_max))
        if cap == 0:
            return 0
        assert self.tracker is not None
        rows = max(1, self.rows(), self.load())
        bucket = rows_bucket(rows)
        # Every row of a batch asks every cycle, right after the same step: the common case (the
        # decision holds) takes no lock, so 16-32 threads do not queue on one (each attribute read
        # is atomic; a decision made meanwhile applies from the row's next cycle).
        if bucket != self._decided_bucket or self.clock() - self._decided_at >= self.decision_seconds:
            with self._lock:
                now = self.clock()
                if bucket != self._decided_bucket or now - self._decided_at >= self.decision_seconds:
                    self._decide(rows, bucket, now)
        k = min(self._decision, cap)
        self._choices.append(k)  # deque.append is thread-safe; counted into ``chosen`` on read
        return k

    @property
    def chosen(self) -> dict[int, int]:
        """K -> cycles it was chosen (stats)."""
        with self._lock:
            while self._choices:
                k = self._choices.popleft()
                self._chosen[k] = self._chosen.get(k, 0) + 1
            return dict(self._chosen)

    def _decide(self, rows: int, bucket: int, now: float) -> None:
        """The draft length every row uses until the next decision (one per ``decision_seconds``
        or batch-size bucket change): rows of a lockstep batch wait for the longest draft, so
        mixed choices would cost every row the largest K and blur the measured cycle costs."""
        self._close_window(now)
        self._predicted = {}
        # From AR, drafting starts with a catch-up: every row feeds the draft model all it
        # committed at K = 0, and the first verifies pad the whole batch. Batch sizes that last a
        # fraction of a second (32 clients: rows leave in waves, the batch dips to ~16 rows for
        # ~0.1 s) paid that for nothing (load test: 0.89x AR at 32 clients, 1.01x with K forced
        # to 0). So at AR a change of batch size holds AR for ``entry_seconds`` (further changes
        # meanwhile do not restart it: a batch flipping between two sizes still decides), then
        # the next choice decides.
        if self._entry_until > float("-inf"):
            if now < self._entry_until:
                self._hold_ar(bucket, now, self._entry_until - now)
                return
            self._entry_until = float("-inf")
        elif (
            self.entry_seconds > 0
            and self._decision == 0
            and 0 <= self._decided_bucket != bucket
            and now >= self._probe_until
        ):
            self._entry_until = now + self.entry_seconds
            self._hold_ar(bucket, now, self.entry_seconds)
            return
        advantage = self._smaller_batch_advantage(bucket)  # what smaller batches credit drafting with
        goodput = self._goodputs(rows, bucket, advantage)
        best_drafting = 1 + int(np.argmax(goodput[1:]))
        # drafting must clearly beat AR: measured windows scatter by ~10 % under request churn,
        # and a prediction is no better than its cost model
        k = best_drafting if goodput[best_drafting] >= (1 + self.draft_margin) * goodput[0] else 0
        if not self._established(bucket, 0):
            k = 0  # measure the AR baseline of this batch size first: drafting is compared to it
        # A probe holds for its window while the batch stays within one bucket of the probed one:
        # rows come and go every few steps (1 <-> 2 rows at two clients), and a probe cut short at
        # each change was restarted by the next decision (the side's wait had long passed): AR
        # for good. A probe cut short by a larger change restarts the wait instead.
        if now < self._probe_until and abs(bucket - self._probe_bucket) > 1:
            self._probe_until, self._probed, self._side_since = float("-inf"), False, now
        if now < self._probe_until:
            k = self._probe_k
        else:
            drafting = k > 0
            if self._probed:  # the first decision after a probe: did it change the answer?
                self._probed, self._side_since = False, now
                backoff = 2 * self._probe_backoff if drafting == self._drafting else 1.0
                self._probe_backoff = min(backoff, self.max_probe_backoff)
            if drafting and not self._drafting and not self._established(bucket, k):
                # drafting is predicted to pay but not measured here yet: try it for a probe
                # window, not a whole decision; its measured windows then decide
                self._start_probe(k, bucket, now)
            elif drafting != self._drafting or self._side_since is None:  # a new side: base interval
                self._drafting, self._side_since, self._probe_backoff = drafting, now, 1.0
            elif now - self._side_since >= self._probe_wait(bucket, drafting) and (
                # no probe to drafting where smaller batches credit it under the margin: the cap
                # in _goodputs makes it unable to change the choice, and it costs a catch-up
                drafting or advantage is None or advantage >= 1 + self.draft_margin
            ):
                # try the other side for a window: at AR, α and the K > 0 costs stay measured;
                # while drafting, the AR baseline stays measured under today's load
                k = 0 if drafting else best_drafting
                self._start_probe(k, bucket, now)
        # a probe's decision holds only for the probe window
        held_from = now - self.decision_seconds + self.probe_window if now < self._probe_until else now
        if k != self._decision:
            self._changed_at = now
        start = now + self.settle_seconds if k != self._decision else now
        self._window = _Window(start=start, paused=self.paused())
        self._decision, self._decided_at, self._decided_bucket = k, held_from, bucket

    def _hold_ar(self, bucket: int, now: float, seconds: float) -> None:
        """Stay at K = 0 in ``bucket`` for ``seconds``; then the next choice decides."""
        self._window = _Window(start=now, paused=self.paused())
        self._decided_at, self._decided_bucket = now - self.decision_seconds + seconds, bucket

    def _probe_wait(self, bucket: int, drafting: bool) -> float:
        """Seconds on one side before probing the other. While drafting with a measured advantage
        under ``marginal_advantage``, AR is probed every ``marginal_probe_interval`` seconds (no
        back-off): otherwise the AR cell keeps the few seconds measured while the batch filled
        and one probe, the drafting cell many times that, and a ±10 % window scatter decides."""
        measured = self._advantage(bucket) if drafting else None
        if measured is not None and measured < self.marginal_advantage:
            return self.marginal_probe_interval
        return self.probe_interval * self._probe_backoff

    def _established(self, bucket: int, k: int) -> bool:
        """Whether ``k``'s side of ``bucket`` has ``min_evidence_seconds`` of windows behind it."""
        return self.windows.evidence(bucket, k) >= self.min_evidence_seconds

    def _goodputs(self, rows: int, bucket: int, advantage: float | None) -> list[float]:
        """Tokens per row-second for K = 0 .. k_max in this bucket (module doc).

        The shape over K is predicted from acceptance and the cycle costs. AR's level is its
        windows' once established; drafting's advantage over AR blends the windows' ratio with the
        predicted one, by evidence. Then drafting is credited with at most ``advantage``, the
        advantage measured at smaller batch sizes (:meth:`_smaller_batch_advantage`; None: none).
        """
        assert self.tracker is not None
        _, goodput = best_draft_length(
            self.tracker.rates(),
            self.k_max,
            lambda k: self.cycles.estimate(bucket, k, self.predicted_seconds(rows, k)),
        )
        predicted_ar = goodput[0]
        if self._established(bucket, 0):
            scale = self.windows.goodput(bucket, 0) / predicted_ar  # type: ignore[operator]
            goodput = [g * scale for g in goodput]
        seconds = self.windows.evidence(bucket, 1)
        if seconds > 0 and self.windows.measured(bucket, 0):
            # drafting's advantage over AR: the measured ratio and the predicted one, weighted by
            # the seconds behind the measurement and ``prior_seconds`` (one short, noisy window
            # neither makes nor breaks the case for drafting; a few seconds of windows decide)
            measured = self.windows.goodput(bucket, 1) / self.windows.goodput(bucket, 0)  # type: ignore[operator]
            predicted = max(goodput[1:]) / goodput[0]
            ratio = (seconds * measured + self.prior_seconds * predicted) / (seconds + self.prior_seconds)
            goodput[1:] = [g * ratio / predicted for g in goodput[1:]]
        # Speculation gains less the more rows share a step (a verify grows with B·(K + 1)
        # tokens, the tokens a row gains do not). Windows at a large batch are few and scatter;
        # the cap keeps a noisy one from making the policy draft where it loses.
        if advantage is not None:
            goodput[1:] = [min(g, advantage * goodput[0]) for g in goodput[1:]]
        return goodput

    def _close_window(self, now: float) -> None:
        """Record the window of the decision that ends now (caller holds the lock)."""
        w = self._window
        w.advance(now, max(1, self.rows()), self.paused())
        if self._decided_bucket >= 0:
            self.windows.add(self._decided_bucket, self._decision, w.tokens, w.row_seconds, w.seconds)

    def observe_tokens(self, n: int) -> None:
        """Tokens one row committed in its cycle (counted in the current decision's window)."""
        rows = max(1, self.rows())
        with self._lock:
            now, w = self.clock(), self._window
            if now < w.start:
                return
            # every row reports every cycle: integrate when the batch changed size, else at most
            # every ``integrate_seconds`` (the paused clock takes the pool's lock)
            if rows != w.rows or now - w.last >= self.integrate_seconds:
                w.advance(now, rows, self.paused())
            w.tokens += n

    def _advantage(self, bucket: int) -> float | None:
        """Drafting's measured goodput over AR's in ``bucket`` (None: either not established)."""
        if not (self._established(bucket, 0) and self._established(bucket, 1)):
            return None
        return self.windows.goodput(bucket, 1) / self.windows.goodput(bucket, 0)  # type: ignore[operator]

    def _smaller_batch_advantage(self, bucket: int) -> float | None:
        """The most drafting may gain here, from smaller batches (None: none measured).

        The advantage measured in the nearest smaller bucket, carried on along half its measured
        trend: where the next smaller measured bucket had a larger advantage, it shrinks by the
        square root of that factor per doubling of rows (the load test measures 1.8×, 1.6×, 1.3×,
        1.2×, 1.0×, 0.9× AR at 1–32 rows; half the slope, because each window's ratio scatters by
        ~10 % and a full extrapolation of two noisy ratios cut a real 1.2× gain at 8 rows)."""
        measured = [(b, a) for b in range(bucket - 1, -1, -1) if (a := self._advantage(b)) is not None]
        if not measured:
            return None
        (b1, a1), rest = measured[0], measured[1:]
        if rest and rest[0][1] > a1:
            b2, a2 = rest[0]
            return a1 * (a1 / a2) ** (0.5 * (bucket - b1) / (b1 - b2))
        return a1

    def _start_probe(self, k: int, bucket: int, now: float) -> None:
        self._probe_k, self._probe_bucket = k, bucket
        self._probe_until, self._probed = now + self.probe_window, True

    def predicted_seconds(self, rows: int, k: int) -> float:
        """``T(K, B)`` from the forward costs alone (module doc)."""
        return self.target_costs(rows * (k + 1)) + k * self.draft_costs(rows)

    def observe(self, proposed: int, accepted: int) -> None:
        """A verified cycle's outcome (acceptance)."""
        assert self.tracker is not None
        self.tracker.observe(proposed, accepted)

    def observe_cycle(self, k: int, seconds: float) -> None:
        """The wall time of a whole cycle run at draft length ``k`` with the current batch.

        Cycles that ended within ``settle_seconds`` of a change of K are not steady-state costs
        of either K (the draft model catches up on every token committed at K = 0, rows finish
        cycles begun at the old K): they are not recorded.
        """
        if self.clock() - self._changed_at < self.settle_seconds:
            return
        rows = max(1, self.rows())
        predicted = self._predicted.get((rows, k))
        if predicted is None:  # the forward costs move slowly: one prediction per decision
            predicted = self._predicted[rows, k] = self.predicted_seconds(rows, k)
        self.cycles.observe(rows_bucket(rows), k, seconds, predicted)
