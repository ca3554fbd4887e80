"""The policy (:class:`GoodputDraftLength`) and its knobs (:class:`DraftLengthSettings`).

What decides between AR and drafting is measured as evidence comes in: committed tokens per
row-second over whole decision windows (:class:`~relaxspec.engine.draft_length.windows.WindowRates`),
one cell for AR and one for drafting per batch-size bucket; the prediction of
:mod:`relaxspec.engine.draft_length` only picks *which* K drafts. How a choice holds, when the
policy probes the other side and how evidence is blended: :class:`GoodputDraftLength`. Measured
behaviour: docs/performance.md §6.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from relaxspec.core.acceptance import Greedy, Rule
from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.draft_length.costs import Costs, CycleCosts
from relaxspec.engine.draft_length.windows import WindowRates, _Window, rows_bucket
from relaxspec.errors import RelaxSpecError


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
    ``seconds(K)`` is the time of one cycle at draft length K (:mod:`relaxspec.engine.draft_length`)."""
    goodput = [expected_tokens(rates, k) / seconds(k) for k in range(k_max + 1)]
    return int(np.argmax(goodput)), goodput


@dataclass(frozen=True)
class DraftLengthSettings:
    """The policy's knobs (:class:`GoodputDraftLength`): how long a choice holds, when to probe,
    what evidence decides."""

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


class GoodputDraftLength:
    """Choose each cycle's draft length from the batch size and measured acceptance.

    ``target_costs`` / ``draft_costs`` price one forward (a :class:`StepCosts` or
    :class:`LiveStepCosts`). ``rows()`` returns how many rows share a step now (the batcher's
    active generations; 1 for a request decoded alone), ``load()`` how many requests the server
    holds (running, queued or being set up): a decision is for the larger of the two, so that the
    batch does not switch to drafting while rows leave and the next requests join (their prefills
    run one by one) — the window's tokens per row-second count the rows that run; ``paused()`` the
    seconds so far in which the rows did nothing that depends on K (prefills of joining rows, and
    no request running at all), which no window counts. The knobs are ``settings``
    (:class:`DraftLengthSettings`), or any of its fields passed by name. One instance is shared by
    the requests of one method, so acceptance is learned across them.

    Evidence. AR is measured first at each batch size; drafting's advantage over it is the
    windows' ratio blended with the predicted ratio by evidence (``prior_seconds`` for the
    prediction against the seconds of windows behind the measurement); drafting must beat AR by
    ``draft_margin`` and is credited with no more than smaller batches measured
    (:meth:`_smaller_batch_advantage`). Time the batch spent prefilling joining rows is left out of
    the windows: it is the same at every K.

    Holding and probing. One choice holds for every row for ``decision_seconds`` (or until the
    batch size changes bucket), so the rows of a lockstep batch draft alike. From K = 0, a batch
    size must hold for ``entry_seconds`` before it may start drafting (the switch costs a catch-up
    of the draft model on every row; dips of the batch size as rows leave in waves last less than
    that). A policy that stays on one side sees only that side's costs: after ``probe_interval``
    seconds at K = 0 it drafts anyway (its best K > 0) for a ``probe_window``, so that α and the
    cycle costs of K > 0 keep tracking the workload, and after as long drafting it runs AR steps
    for a window, so that the AR baseline does too (it is measured first, while a batch fills and
    every step also prefills joining rows, which makes AR look slower than it runs in steady
    state). A probe after which the choice stays on its side doubles the interval (up to
    ``max_probe_backoff`` times); a change of side resets it. While drafting's measured advantage
    is marginal (under ``marginal_advantage``), AR is probed every ``marginal_probe_interval``
    seconds instead, so that both sides carry comparable evidence. Probes are windows of time, not
    every n-th choice, so that all rows of a lockstep batch probe together: one drafting row would
    make the others' AR steps wait for it and make AR look as slow as speculation.
    """

    def __init__(
        self,
        target_costs: Costs,
        draft_costs: Costs,
        k_max: int,
        rows: Callable[[], int] = lambda: 1,
        load: Callable[[], int] = lambda: 0,
        *,
        paused: Callable[[], float] = lambda: 0.0,
        clock: Callable[[], float] = time.perf_counter,
        settings: DraftLengthSettings | None = None,
        **knobs: float,
    ) -> None:
        if k_max < 1:
            raise RelaxSpecError(f"adaptive draft length needs k_max >= 1, got {k_max}")
        self.target_costs, self.draft_costs, self.k_max = target_costs, draft_costs, k_max
        self.rows, self.load, self.paused, self.clock = rows, load, paused, clock
        self.settings = replace(settings or DraftLengthSettings(), **knobs)
        self.tracker = AcceptanceTracker(k_max)
        self.cycles = CycleCosts()
        self.windows = WindowRates()
        self._chosen: dict[int, int] = {}  # K -> cycles (see ``chosen``)
        self._choices: deque[int] = deque()  # choices not yet counted into _chosen
        self._drafting = False  # the side (AR or K > 0) of the decisions since _side_since
        self._side_since: float | None = None
        self._probe_until = float("-inf")
        self._probe_k = 0  # the draft length of the running probe
        self._probe_bucket = -1  # the batch-size bucket it was started in
        self._probe_backoff = 1.0
        self._probed = False  # a probe ran and no decision has followed it yet
        self._decision = 0
        self._decided_at = float("-inf")
        self._changed_at = float("-inf")
        self._decided_bucket = -1
        self._entry_until = float("-inf")  # end of the running hold at AR after a change of batch size
        self._window = _Window(start=float("inf"))
        self._predicted: dict[tuple[int, int], float] = {}  # (rows, K) -> seconds
        self._lock = threading.Lock()

    def choose(self, k_cap: int) -> int:
        """The draft length for the next cycle, at most ``min(k_cap, k_max)``."""
        cap = max(0, min(k_cap, self.k_max))
        if cap == 0:
            return 0
        rows = max(1, self.rows(), self.load())
        bucket = rows_bucket(rows)
        # Every row of a batch asks every cycle, right after the same step: the common case (the
        # decision holds) takes no lock, so 16-32 threads do not queue on one (each attribute read
        # is atomic; a decision made meanwhile applies from the row's next cycle).
        hold = self.settings.decision_seconds
        if bucket != self._decided_bucket or self.clock() - self._decided_at >= hold:
            with self._lock:
                now = self.clock()
                if bucket != self._decided_bucket or now - self._decided_at >= hold:
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
        if self._entry_hold(bucket, now):
            return
        advantage = self._smaller_batch_advantage(bucket)  # what smaller batches credit drafting with
        goodput = self._goodputs(rows, bucket, advantage)
        best_drafting = 1 + int(np.argmax(goodput[1:]))
        # drafting must clearly beat AR: measured windows scatter under request churn
        # (docs/performance.md §6), and a prediction is no better than its cost model
        k = best_drafting if goodput[best_drafting] >= (1 + self.settings.draft_margin) * goodput[0] else 0
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
            k = self._side_or_probe(k, best_drafting, advantage, bucket, now)
        self._commit(k, bucket, now)

    def _entry_hold(self, bucket: int, now: float) -> bool:
        """Whether AR holds for now after a change of batch size (then the decision is made).

        From AR, drafting starts with a catch-up: every row feeds the draft model all it committed
        at K = 0, and the first verifies pad the whole batch. Batch sizes that last a fraction of
        a second (rows leave in waves) paid that for nothing. So at AR a change of batch size
        holds AR for ``entry_seconds`` (further changes meanwhile do not restart it: a batch
        flipping between two sizes still decides), then the next choice decides.
        """
        if self._entry_until > float("-inf"):
            if now < self._entry_until:
                self._hold_ar(bucket, now, self._entry_until - now)
                return True
            self._entry_until = float("-inf")
        elif (
            self.settings.entry_seconds > 0
            and self._decision == 0
            and 0 <= self._decided_bucket != bucket
            and now >= self._probe_until
        ):
            self._entry_until = now + self.settings.entry_seconds
            self._hold_ar(bucket, now, self.settings.entry_seconds)
            return True
        return False

    def _side_or_probe(
        self, k: int, best_drafting: int, advantage: float | None, bucket: int, now: float
    ) -> int:
        """Outside a probe: keep the chosen side ``k``, or start a probe of the other side once
        this side has held for its wait (returns the K to run)."""
        drafting = k > 0
        if self._probed:  # the first decision after a probe: did it change the answer?
            self._probed, self._side_since = False, now
            backoff = 2 * self._probe_backoff if drafting == self._drafting else 1.0
            self._probe_backoff = min(backoff, self.settings.max_probe_backoff)
        if drafting and not self._drafting and not self._established(bucket, k):
            # drafting is predicted to pay but not measured here yet: try it for a probe
            # window, not a whole decision; its measured windows then decide
            self._start_probe(k, bucket, now)
        elif drafting != self._drafting or self._side_since is None:  # a new side: base interval
            self._drafting, self._side_since, self._probe_backoff = drafting, now, 1.0
        elif now - self._side_since >= self._probe_wait(bucket, drafting) and (
            # no probe to drafting where smaller batches credit it under the margin: the cap
            # in _goodputs makes it unable to change the choice, and it costs a catch-up
            drafting or advantage is None or advantage >= 1 + self.settings.draft_margin
        ):
            # try the other side for a window: at AR, α and the K > 0 costs stay measured;
            # while drafting, the AR baseline stays measured under today's load
            k = 0 if drafting else best_drafting
            self._start_probe(k, bucket, now)
        return k

    def _commit(self, k: int, bucket: int, now: float) -> None:
        """Make ``k`` the decision in ``bucket`` from ``now``, with a new window (after settling
        where K changed); a probe's decision holds only for the probe window."""
        s = self.settings
        held_from = now - s.decision_seconds + s.probe_window if now < self._probe_until else now
        if k != self._decision:
            self._changed_at = now
        start = now + s.settle_seconds if k != self._decision else now
        self._window = _Window(start=start, paused=self.paused())
        self._decision, self._decided_at, self._decided_bucket = k, held_from, bucket

    def _hold_ar(self, bucket: int, now: float, seconds: float) -> None:
        """Stay at K = 0 in ``bucket`` for ``seconds``; then the next choice decides."""
        self._window = _Window(start=now, paused=self.paused())
        self._decided_at, self._decided_bucket = now - self.settings.decision_seconds + seconds, bucket

    def _probe_wait(self, bucket: int, drafting: bool) -> float:
        """Seconds on one side before probing the other. While drafting with a measured advantage
        under ``marginal_advantage``, AR is probed every ``marginal_probe_interval`` seconds (no
        back-off): otherwise the AR cell keeps the few seconds measured while the batch filled
        and one probe, the drafting cell many times that, and a ±10 % window scatter decides."""
        measured = self._advantage(bucket) if drafting else None
        if measured is not None and measured < self.settings.marginal_advantage:
            return self.settings.marginal_probe_interval
        return self.settings.probe_interval * self._probe_backoff

    def _established(self, bucket: int, k: int) -> bool:
        """Whether ``k``'s side of ``bucket`` has ``min_evidence_seconds`` of windows behind it."""
        return self.windows.evidence(bucket, k) >= self.settings.min_evidence_seconds

    def _goodputs(self, rows: int, bucket: int, advantage: float | None) -> list[float]:
        """Tokens per row-second for K = 0 .. k_max in this bucket (class doc, "Evidence").

        The shape over K is predicted from acceptance and the cycle costs. AR's level is its
        windows' once established; drafting's advantage over AR blends the windows' ratio with the
        predicted one, by evidence. Then drafting is credited with at most ``advantage``, the
        advantage measured at smaller batch sizes (:meth:`_smaller_batch_advantage`; None: none).
        """
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
            prior = self.settings.prior_seconds
            ratio = (seconds * measured + prior * predicted) / (seconds + prior)
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
            if rows != w.rows or now - w.last >= self.settings.integrate_seconds:
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
        square root of that factor per doubling of rows. Speculation gains less the more rows
        share a step; half the slope because each window's ratio is noisy, and a full
        extrapolation of two noisy ratios cut a real gain (docs/performance.md §6, "The batch
        verifies whole again")."""
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
        self._probe_until, self._probed = now + self.settings.probe_window, True

    def predicted_seconds(self, rows: int, k: int) -> float:
        """``T(K, B)`` from the forward costs alone (:mod:`relaxspec.engine.draft_length`)."""
        return self.target_costs(rows * (k + 1)) + k * self.draft_costs(rows)

    def observe(self, proposed: int, accepted: int) -> None:
        """A verified cycle's outcome (acceptance)."""
        self.tracker.observe(proposed, accepted)

    def observe_cycle(self, k: int, seconds: float) -> None:
        """The wall time of a whole cycle run at draft length ``k`` with the current batch.

        Cycles that ended within ``settle_seconds`` of a change of K are not steady-state costs
        of either K (the draft model catches up on every token committed at K = 0, rows finish
        cycles begun at the old K): they are not recorded.
        """
        if self.clock() - self._changed_at < self.settings.settle_seconds:
            return
        rows = max(1, self.rows())
        predicted = self._predicted.get((rows, k))
        if predicted is None:  # the forward costs move slowly: one prediction per decision
            predicted = self._predicted[rows, k] = self.predicted_seconds(rows, k)
        self.cycles.observe(rows_bucket(rows), k, seconds, predicted)
