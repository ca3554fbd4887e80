"""Adaptive draft length (relaxspec.engine.draft_length): goodput arithmetic, the acceptance
tracker, the choice under load, and that adapting K never changes a lossless method's output."""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.draft_length import (
    AcceptanceTracker,
    GoodputDraftLength,
    LiveStepCosts,
    StepCosts,
    best_draft_length,
    expected_tokens,
    isotonic,
    measure_step_costs,
    rows_bucket,
)
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ModelSet, build_engine
from relaxspec.serve.pool import ServingPool

CPU = StepCosts((1, 8, 64, 512), (1.0, 1.2, 3.0, 24.0))  # overhead-bound small, compute-bound large
CHEAP_DRAFT = StepCosts((1, 64), (0.05, 0.3))
FLAT = StepCosts((1, 1024), (1.0, 1.0))  # a forward costs the same for any token count
LINEAR = StepCosts((1, 2), (1.0, 2.0))  # cost proportional to tokens (compute-bound)
FAST = StepCosts((1, 8, 64, 512), (0.01, 0.012, 0.03, 0.24))  # CPU's shape at realistic seconds
FAST_DRAFT = StepCosts((1, 64), (0.0005, 0.003))


def test_step_costs_interpolate_and_extrapolate():
    costs = StepCosts((1, 4, 8), (1.0, 2.0, 4.0))
    assert costs(1) == 1.0 and costs(2) == pytest.approx(4 / 3) and costs(8) == 4.0
    assert costs(12) == pytest.approx(6.0)  # the last slope, 0.5 per token
    for bad in [((1,), (1.0,)), ((2, 1), (1.0, 2.0)), ((1, 2), (1.0, 0.0)), ((1, 2), (1.0,))]:
        with pytest.raises(RelaxSpecError):
            StepCosts(*bad)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=8))
def test_expected_tokens_bounds(rates):
    k = len(rates)
    e = expected_tokens(rates, k)
    assert 1.0 <= e <= k + 1 + 1e-9
    assert expected_tokens(rates, 0) == 1.0
    assert all(expected_tokens(rates, i) <= expected_tokens(rates, i + 1) + 1e-12 for i in range(k))


def test_expected_tokens_closed_form():
    assert expected_tokens([1.0] * 4, 4) == 5.0
    assert expected_tokens([0.5] * 3, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_tracker_learns_conditional_rates():
    tracker = AcceptanceTracker(k_max=4, decay=1.0, prior_weight=1e-9)
    for _ in range(100):
        tracker.observe(4, 2)  # positions 1, 2 accepted, 3 rejected, 4 never reached
    rates = tracker.rates()
    assert rates[0] == pytest.approx(1.0) and rates[1] == pytest.approx(1.0)
    assert rates[2] == pytest.approx(0.0, abs=1e-6)
    assert rates[3] == pytest.approx(tracker.prior)  # no data: the prior
    tracker.observe(2, 2)  # a short draft fully accepted reaches positions 1, 2 only
    assert tracker.rates()[2] == pytest.approx(0.0, abs=1e-6)


def test_tracker_follows_a_changed_workload():
    tracker = AcceptanceTracker(k_max=1, decay=0.9)
    for _ in range(100):
        tracker.observe(1, 1)
    assert tracker.rates()[0] > 0.99
    for _ in range(60):
        tracker.observe(1, 0)
    assert tracker.rates()[0] < 0.01


def forward_seconds(rows: int, target: StepCosts, draft: StepCosts):
    return lambda k: target(rows * (k + 1)) + k * draft(rows)


def test_choice_speculates_when_verifying_is_cheap_and_not_when_compute_bound():
    high = [0.9] * 8
    assert best_draft_length(high, 8, forward_seconds(1, FLAT, StepCosts((1, 2), (0.01, 0.02))))[0] == 8
    # cost ∝ tokens and a free draft: E[tokens | K] / (K + 1) < 1 for any α < 1, so AR wins
    k, goodput = best_draft_length(high, 8, forward_seconds(1, LINEAR, StepCosts((1, 2), (1e-6, 2e-6))))
    assert k == 0 and goodput[0] == pytest.approx(1.0)
    # the same models: fixed overhead dominates for one row, compute dominates for 64 rows
    assert best_draft_length(high, 8, forward_seconds(1, CPU, CHEAP_DRAFT))[0] >= 4
    assert best_draft_length(high, 8, forward_seconds(64, CPU, CHEAP_DRAFT))[0] == 0


def cheap_draft_policy(**settings) -> GoodputDraftLength:
    """A policy over the CPU-shaped target costs and a cheap draft, measuring every cycle
    (``settle_seconds`` 0) unless ``settings`` say otherwise."""
    return GoodputDraftLength(CPU, CHEAP_DRAFT, **{"settle_seconds": 0.0, **settings})


def with_ar_baseline(policy: GoodputDraftLength, *rows: int) -> GoodputDraftLength:
    """Record AR cycles at their predicted cost for these batch sizes (a policy measures the AR
    baseline of a batch size before it compares drafting with it)."""
    for n in rows:
        seconds = policy.predicted_seconds(n, 0)
        policy.cycles.observe(rows_bucket(n), 0, seconds, seconds)
        # 1 token per cycle, a second of evidence
        policy.windows.add(rows_bucket(n), 0, tokens=1.0, row_seconds=seconds, seconds=1.0)
    return policy


def with_measured_sides(policy: GoodputDraftLength, advantage: dict[int, float]) -> GoodputDraftLength:
    """Full acceptance at K = 4, and for each batch size an AR baseline plus 20 s of drafting
    windows at ``advantage[rows]`` × AR's goodput."""
    for _ in range(20):
        policy.observe(4, 4)
    with_ar_baseline(policy, *advantage)
    for rows, ratio in advantage.items():
        ar = policy.windows.goodput(rows_bucket(rows), 0)
        policy.windows.add(rows_bucket(rows), 3, tokens=ratio * ar * 20, row_seconds=20.0, seconds=20.0)
    return policy


def run_cycles(
    policy: GoodputDraftLength,
    now: dict[str, float],
    cycles: int,
    seconds: Callable[[int], float],
    accepted: Callable[[int], int] = lambda k: k,
    rows: int = 1,
) -> list[int]:
    """Drive the policy as a batch of ``rows`` rows in lockstep would: each cycle chooses K, takes
    ``seconds(K)`` on the clock, accepts ``accepted(K)`` drafts and commits that + 1 tokens per
    row. Returns the K of each cycle."""
    picks = []
    for _ in range(cycles):
        k = policy.choose(8)
        picks.append(k)
        now["t"] += seconds(k)
        for _ in range(rows):
            if k:
                policy.observe(k, accepted(k))
            policy.observe_cycle(k, seconds(k))
            policy.observe_tokens((accepted(k) if k else 0) + 1)
    return picks


def test_first_choice_at_a_new_batch_size_measures_ar():
    now = {"t": 0.0}
    policy = GoodputDraftLength(
        FAST, FAST_DRAFT, k_max=8, decision_seconds=0.5, settle_seconds=0.0, clock=lambda: now["t"]
    )
    picks = run_cycles(policy, now, 200, seconds=lambda k: policy.predicted_seconds(1, k))
    assert picks[0] == 0 and picks[-1] > 0  # the AR window first; then drafting, which pays here
    assert policy.windows.goodput(0, 0) == pytest.approx(100.0)  # 1 token per 0.01 s cycle


def test_policy_uses_rows_and_probes_in_windows_while_at_ar():
    rows, now = {"n": 1}, {"t": 0.0}
    policy = GoodputDraftLength(
        CPU, CHEAP_DRAFT, k_max=8, rows=lambda: rows["n"], probe_interval=5.0, probe_window=0.5,
        decision_seconds=0.25, clock=lambda: now["t"],
    )  # fmt: skip
    with_ar_baseline(policy, 1, 64)
    for _ in range(20):
        policy.observe(8, 8)
    assert policy.choose(8) >= 4
    assert policy.choose(2) <= 2 and policy.choose(0) == 0
    rows["n"] = 64
    picks = []
    for _ in range(24):  # one choice every 0.25 s
        picks.append(policy.choose(8))
        now["t"] += 0.25
    # AR from t = 0; at t = 5 a probe window of 0.5 s: every row drafts (two choices here)
    assert picks[:20] == [0] * 20 and picks[20] > 0 and picks[21] > 0 and picks[22:] == [0, 0]
    assert sum(policy.chosen.values()) == 26


@given(st.lists(st.floats(0, 100), min_size=1, max_size=12))
def test_isotonic_is_monotone_and_keeps_the_mean(values):
    fitted = isotonic(values)
    assert len(fitted) == len(values)
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(fitted))
    assert sum(fitted) == pytest.approx(sum(values), rel=1e-9, abs=1e-9)
    if values == sorted(values):
        assert fitted == pytest.approx(values)


def test_live_costs_follow_observed_forwards():
    live = LiveStepCosts(StepCosts((1, 8, 64), (1.0, 2.0, 8.0)))
    assert live(8) == 2.0  # no observation yet: the calibration
    for _ in range(50):
        live.observe(8, 4.0)  # the server is twice as slow as calibrated at 8 tokens
    assert live(8) == pytest.approx(4.0, rel=1e-3)
    assert live(64) == pytest.approx(16.0, rel=0.05)  # unobserved points follow the global ratio
    live.observe(0, 1.0)
    live.observe(4, float("nan"))  # ignored
    assert live.observed == 50


def test_measured_cycles_override_the_forward_prediction():
    rows = {"n": 1}
    policy = cheap_draft_policy(
        k_max=4, rows=lambda: rows["n"], probe_interval=1e9, probe_window=0.0, decision_seconds=0.0
    )
    with_ar_baseline(policy, 1)
    for _ in range(20):
        policy.observe(4, 4)
    assert policy.choose(4) == 4  # forwards alone: speculation pays (tried in a probe)
    # but whole cycles with drafts measure 10x their forwards (per-row work, waits): AR wins
    for k in range(1, 5):
        for _ in range(30):
            policy.observe_cycle(k, 10 * policy.predicted_seconds(1, k))
    for _ in range(30):
        policy.observe_cycle(0, policy.predicted_seconds(1, 0))
    assert policy.choose(4) == 0
    # another batch size: unmeasured cells add K + 1 rounds of that bucket's per-round overhead,
    # else of the global one; drafting cells are scaled by how far measured drafting cycles
    # exceeded that estimate (here they ran 10x their forwards)
    rows["n"] = 6
    costs = policy.cycles
    correction = costs.drafting_correction
    assert 1.5 < correction <= costs.max_correction
    assert costs.estimate(3, 2, 1.0) == pytest.approx((1.0 + 3 * costs.global_overhead) * correction)
    costs.observe(3, 0, 2.0, 1.0)  # an AR cycle 1 s over its forward: 1 s per round
    assert costs.estimate(3, 0, 1.0) == pytest.approx(2.0)
    assert costs.estimate(3, 1, 1.0) == pytest.approx((1.0 + 2 * 1.0) * correction)
    assert costs.estimate(3, 4, 3.0) == pytest.approx((3.0 + 5 * 1.0) * correction)
    assert rows_bucket(1) == 0 and rows_bucket(2) == 1 and rows_bucket(4) == 2 and rows_bucket(5) == 3


def test_measured_costs_are_positive_and_monotone(target):
    costs = measure_step_costs(target.model, token_counts=(1, 4, 16), context=8, rounds=1)
    assert costs.tokens == (1, 4, 16)
    assert all(b >= a > 0 for a, b in zip(costs.seconds, costs.seconds[1:], strict=False))


@pytest.mark.parametrize("rows", [1, 64])
def test_adaptive_greedy_sd_is_token_identical_to_ar(target, draft, rows):
    ticks = iter(range(10**6))  # a clock that advances one second per choice
    policy = GoodputDraftLength(
        CPU, CHEAP_DRAFT, k_max=6, rows=lambda: rows, probe_interval=3, clock=lambda: float(next(ticks))
    )
    sd = build_engine("sd", target, draft, k=6)
    sd.draft_length = policy
    ar = build_engine("ar", target)
    params = SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True)
    for prompt in ["w1 w2", "w3", "w5 w5 w6"]:
        result = sd.generate(prompt, params)
        assert result.tokens == ar.generate(prompt, params).tokens
    assert 0 in policy.chosen  # the AR baseline first, then what the measured cycles say
    assert any(k > 0 for k in policy.chosen)


def test_pool_shares_one_policy_per_method_and_reports_choices(target, draft):
    models = ModelSet(target=target, draft=draft)
    pool = ServingPool(models, "sd", {"k": 4}, adaptive_k=True, batching=True)
    fixed = ServingPool(models, "sd", {"k": 4}, adaptive_k=False, batching=True)
    params = SamplingParams(temperature=0.0, max_new_tokens=20, ignore_eos=True)
    outputs: dict[int, list[int]] = {}

    def run(i: int) -> None:
        outputs[i] = pool.submit(f"w{i} w1", params).tokens

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [outputs[i] for i in range(4)] == [fixed.submit(f"w{i} w1", params).tokens for i in range(4)]
    assert pool._load() == 0  # every request counted in flight while it was set up or ran, and out after
    seen = []
    pool.submit("w1", params, on_chunk=lambda text, ids: seen.append(pool._load()))
    assert seen and set(seen) == {1}
    stats = pool.draft_length_stats()
    assert list(stats) == ["sd T=0.0"] and sum(stats["sd T=0.0"].values()) > 0
    assert fixed.draft_length_stats() == {}
    ar_pool = ServingPool(ModelSet(target=target), "ar", adaptive_k=True)
    ar_pool.submit("w1", params)
    assert ar_pool.draft_length_stats() == {}  # no draft model: nothing to adapt


def test_tracker_rejects_bad_settings():
    for kwargs in [{"k_max": 0}, {"k_max": 2, "decay": 0.0}, {"k_max": 2, "prior": 1.5}]:
        with pytest.raises(RelaxSpecError):
            AcceptanceTracker(**kwargs)
    with pytest.raises(RelaxSpecError):
        GoodputDraftLength(FLAT, FLAT, k_max=0)
    assert math.isfinite(expected_tokens([], 0))


def test_one_decision_holds_for_every_row_until_it_expires_or_the_batch_changes():
    rows, now = {"n": 1}, {"t": 0.0}
    policy = cheap_draft_policy(
        k_max=8, rows=lambda: rows["n"], decision_seconds=0.25, probe_window=0.25, clock=lambda: now["t"]
    )
    with_ar_baseline(policy, 1, 2)
    for _ in range(20):
        policy.observe(8, 8)
    first = policy.choose(8)
    assert first >= 4
    for _ in range(50):  # the measured costs now say AR, but the decision holds for 0.25 s
        for k in range(9):
            policy.observe_cycle(k, 100.0 if k else policy.predicted_seconds(1, 0))
    assert policy.choose(8) == first
    now["t"] = 0.3
    assert policy.choose(8) == 0
    policy.cycles.cells = {key: v for key, v in policy.cycles.cells.items() if key[1] == 0}
    rows["n"] = 2  # another batch-size bucket: from AR, it decides once it has held a while
    assert policy.choose(8) == 0
    now["t"] += policy.settings.entry_seconds
    assert policy.choose(8) > 0


def test_a_short_dip_of_the_batch_size_does_not_start_drafting():
    """32 clients with equal-length requests: rows leave in waves and the batch dips to ~16 rows
    for ~0.1 s before the next requests join. Drafting pays at 16 rows and not at 32, but a dip
    that short must not switch the batch to drafting (each switch from AR costs a catch-up of the
    draft model on every row and verifies that pad the batch: load test 0.89x AR at 32 clients,
    1.01x with K forced to 0). A batch that stays at 16 rows drafts after ``entry_seconds``."""
    rows, now = {"n": 32}, {"t": 0.0}
    policy = cheap_draft_policy(
        k_max=4, rows=lambda: rows["n"], decision_seconds=2.0, probe_interval=1e9, clock=lambda: now["t"]
    )
    with_measured_sides(policy, {16: 1.5, 32: 0.7})
    picks = []
    for step in range(390):  # 19.5 s of 0.05 s steps: a 0.1 s dip to 16 rows every 2 s
        rows["n"] = 16 if step % 40 in (38, 39) else 32
        picks.append(policy.choose(4))
        now["t"] += 0.05
    assert picks == [0] * 390
    rows["n"] = 16  # the batch stays at 16 rows
    stay = []
    for _ in range(20):
        stay.append(policy.choose(4))
        now["t"] += 0.05
    held = round(policy.settings.entry_seconds / 0.05)
    assert stay[:held] == [0] * held and all(k > 0 for k in stay[held + 1 :])


def test_per_round_overhead_measured_at_ar_keeps_a_batch_at_ar():
    """A batched AR cycle that costs 3x its forward (lockstep overhead) prices every round a
    drafting cycle would add: after the AR baseline the policy stays at AR, though the forwards
    alone favour speculation at this acceptance (α₁ ≈ 0.6); with little overhead it drafts."""

    def policy_after_ar_cycles(ar_factor: float) -> GoodputDraftLength:
        policy = GoodputDraftLength(
            CPU,
            CHEAP_DRAFT,
            k_max=4,
            rows=lambda: 8,
            probe_interval=1e9,
            decision_seconds=0.0,
            settle_seconds=0.0,
        )
        for i in range(40):
            policy.observe(1, 1 if i % 5 < 3 else 0)
        seconds = ar_factor * policy.predicted_seconds(8, 0)
        for _ in range(5):
            policy.observe_cycle(0, seconds)
        policy.windows.add(rows_bucket(8), 0, tokens=8.0, row_seconds=8 * seconds, seconds=1.0)
        return policy

    heavy = policy_after_ar_cycles(3.0)
    rates = heavy.tracker.rates()
    assert 0.5 < rates[0] < 0.7
    forwards_only = [expected_tokens(rates, k) / heavy.predicted_seconds(8, k) for k in range(5)]
    assert max(range(5), key=forwards_only.__getitem__) > 0
    assert heavy.cycles.overhead(rows_bucket(8)) == pytest.approx(2 * heavy.predicted_seconds(8, 0))
    assert heavy.choose(4) == 0
    assert policy_after_ar_cycles(1.05).choose(4) > 0


def test_probes_that_confirm_ar_back_off_and_a_probe_that_pays_resets_them():
    now = {"t": 0.0}
    policy = GoodputDraftLength(
        FAST, FAST_DRAFT, k_max=4, rows=lambda: 8, probe_interval=5.0, probe_window=0.5,
        decision_seconds=0.25, clock=lambda: now["t"], max_probe_backoff=4.0, settle_seconds=0.0,
    )  # fmt: skip
    for _ in range(20):
        policy.observe(4, 0)  # drafts are never accepted: AR is right

    def probe_starts(seconds: float, accepted: Callable[[int], int]) -> tuple[list[float], list[int]]:
        picks, times = [], []
        while now["t"] < seconds:
            times.append(now["t"])
            picks += run_cycles(policy, now, 1, lambda k: policy.predicted_seconds(8, k), accepted, rows=8)
        starts = [times[i] for i in range(1, len(picks)) if picks[i] > 0 and picks[i - 1] == 0]
        return starts, picks

    starts, _ = probe_starts(80.0, lambda k: 0)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # waits of 5, 10, then 20 s (capped at 4x), each after the previous probe's 0.5 s window
    assert starts[0] == pytest.approx(5.0, abs=0.1)
    assert gaps == pytest.approx([10.5, 20.5, 20.5, 20.5], abs=0.25)  # to the next 0.25 s decision
    # acceptance comes back (every draft accepted, cycles cost the same): drafting pays again;
    # while drafting, AR probe windows keep the AR baseline measured, first after 5 s, then
    # backing off
    for _ in range(60):
        policy.observe(4, 4)
    times, picks = [], []
    while now["t"] < 120.0:
        times.append(now["t"])
        picks += run_cycles(policy, now, 1, lambda k: policy.predicted_seconds(8, k), lambda k: k, rows=8)
    first = next(i for i, k in enumerate(picks) if k > 0)
    ar_probes = [times[i] for i in range(first + 1, len(picks)) if picks[i] == 0 and picks[i - 1] > 0]
    assert picks[-1] > 0 and len(ar_probes) >= 2
    assert ar_probes[1] - ar_probes[0] == pytest.approx(10.5, abs=0.25)


def test_cycles_right_after_a_change_of_k_are_not_measured():
    now = {"t": 0.0}
    policy = GoodputDraftLength(
        CPU, CHEAP_DRAFT, k_max=4, rows=lambda: 1, decision_seconds=0.0, probe_window=0.5,
        clock=lambda: now["t"],
    )  # fmt: skip
    assert policy.choose(4) == 0  # the AR baseline first
    policy.observe_cycle(0, 1.0)  # no change yet: measured
    policy.observe_tokens(1)
    now["t"] = 1.0
    assert policy.cycles.measured(0, 0)
    for _ in range(20):
        policy.observe(4, 4)
    k = policy.choose(4)  # closes the AR window: 1 token in 1 row-second
    assert k > 0 and policy.windows.goodput(0, 0) == pytest.approx(1.0)
    policy.observe_cycle(k, 5.0)  # within settle_seconds of the change: the draft's catch-up
    policy.observe_tokens(k + 1)
    assert not policy.cycles.measured(0, k)
    now["t"] += policy.settings.settle_seconds + 0.01
    policy.observe_cycle(k, 1.5)
    policy.observe_tokens(k + 1)
    assert policy.cycles.measured(0, k)
    now["t"] += 0.5
    policy.choose(4)  # the window's tokens: only those committed after the settling time
    assert policy.windows.goodput(0, k) == pytest.approx((k + 1) / 0.5, rel=0.05)


def test_an_unmeasured_drafting_cell_is_tried_for_a_probe_window_only():
    """Where the forwards predict that drafting pays but no drafting cycle of this batch size was
    measured, the policy drafts for one probe window; measured as a loss, it goes back to AR."""
    now = {"t": 0.0}
    policy = GoodputDraftLength(
        CPU, CHEAP_DRAFT, k_max=4, rows=lambda: 1, probe_interval=1e9, probe_window=0.5,
        decision_seconds=2.0, clock=lambda: now["t"], settle_seconds=0.0,
    )  # fmt: skip
    with_ar_baseline(policy, 1)
    for _ in range(20):
        policy.observe(4, 4)
    picks = []
    for _ in range(12):  # a choice every 0.1 s; drafting cycles cost 10x their forwards
        k = policy.choose(4)
        picks.append(k)
        policy.observe_cycle(k, policy.predicted_seconds(1, k) * (10.0 if k else 1.0))
        now["t"] += 0.1
    assert picks[0] > 0 and picks[:5] == [picks[0]] * 5  # the probe window: 0.5 s
    assert picks[5:] == [0] * 7  # measured: AR, held (no probe for 1e9 s)


def test_drafting_that_lost_at_a_smaller_batch_is_not_tried_at_a_larger_one():
    def policy_with_two_rows_measured(drafting_goodput: float) -> tuple[GoodputDraftLength, dict]:
        rows = {"n": 2}
        policy = GoodputDraftLength(
            CPU, CHEAP_DRAFT, k_max=4, rows=lambda: rows["n"], probe_interval=1e9, probe_window=0.0,
            decision_seconds=0.0, settle_seconds=0.0,
        )  # fmt: skip
        for _ in range(20):
            policy.observe(4, 4)
        with_ar_baseline(policy, 2, 8)
        ar = policy.windows.goodput(rows_bucket(2), 0)
        for k in range(1, 5):  # drafting at two rows measured at this ratio to AR, decisively
            policy.windows.add(rows_bucket(2), k, tokens=drafting_goodput * ar, row_seconds=1.0, seconds=5.0)
        return policy, rows

    lost, rows = policy_with_two_rows_measured(0.8)
    assert lost.choose(4) == 0
    rows["n"] = 8
    assert lost.choose(4) == 0  # eight rows: not tried, though the forwards predict a gain
    bucket = rows_bucket(8)
    _, predicted = best_draft_length(
        lost.tracker.rates(), 4, lambda k: lost.cycles.estimate(bucket, k, lost.predicted_seconds(8, k))
    )
    assert predicted[2] > predicted[0]
    # credited with at most two rows' measured advantage
    goodput = lost._goodputs(8, bucket, lost._smaller_batch_advantage(bucket))
    assert max(goodput[1:]) <= 0.8 * goodput[0] + 1e-9
    won, rows = policy_with_two_rows_measured(1.3)
    assert won.choose(4) > 0
    rows["n"] = 8
    assert won.choose(4) > 0  # where drafting won at two rows, eight rows try it


@pytest.mark.parametrize("ratio,drafts", [(1.02, False), (1.2, True)])
def test_a_measured_drafting_cell_must_beat_ar_by_the_margin(ratio, drafts):
    """Measured windows scatter by ~10 % under request churn: a drafting cell measured within
    ``draft_margin`` of AR's goodput does not displace AR, one clearly above it does."""
    policy = GoodputDraftLength(
        CPU, CHEAP_DRAFT, k_max=4, rows=lambda: 2, probe_interval=1e9, probe_window=0.0,
        decision_seconds=0.0, settle_seconds=0.0, draft_margin=0.05,
    )  # fmt: skip
    with_ar_baseline(policy, 2, 8)
    ar = policy.windows.goodput(rows_bucket(2), 0)
    for k in range(1, 5):  # 20 s of windows: the measurement outweighs the prediction
        policy.windows.add(rows_bucket(2), k, tokens=ratio * ar, row_seconds=1.0, seconds=5.0)
    assert (policy.choose(4) > 0) == drafts


def test_drafting_is_credited_with_at_most_a_smaller_batchs_advantage():
    """Drafting measured 1.1x AR at two rows and, in a noisy window, 1.3x at eight: at eight rows
    it is credited with 1.1x and still drafts (above the 5 % margin); measured 1.02x at two rows,
    the 1.3x window at eight does not make it draft."""

    def policy_for(small_ratio: float) -> GoodputDraftLength:
        rows = {"n": 2}
        policy = GoodputDraftLength(
            CPU, CHEAP_DRAFT, k_max=4, rows=lambda: rows["n"], probe_interval=1e9, probe_window=0.0,
            decision_seconds=0.0, settle_seconds=0.0,
        )  # fmt: skip
        for n, ratio in ((2, small_ratio), (8, 1.3)):
            with_ar_baseline(policy, n, 8)
            ar = policy.windows.goodput(rows_bucket(n), 0)
            for k in range(1, 5):
                policy.windows.add(rows_bucket(n), k, tokens=ratio * ar, row_seconds=1.0, seconds=1.0)
        rows["n"] = 8
        return policy

    assert policy_for(1.1).choose(4) > 0
    assert policy_for(1.02).choose(4) == 0
    policy = policy_for(1.02)
    goodput = policy._goodputs(8, rows_bucket(8), policy._smaller_batch_advantage(rows_bucket(8)))
    assert max(goodput[1:]) == pytest.approx(1.02 * goodput[0])


def test_the_advantage_carried_to_larger_batches_follows_its_measured_trend():
    """Drafting measured 1.3x AR at two rows and 1.1x at eight: at 32 rows (two doublings past
    eight, as many as from two to eight) it is credited with 1.1 * (1.1 / 1.3) ** 0.5 = 1.01x
    (half the measured slope), under the 5 % margin, so a 1.2x window there does not make it
    draft; with one bucket measured below, its value holds."""
    rows = {"n": 2}
    policy = GoodputDraftLength(
        CPU, CHEAP_DRAFT, k_max=4, rows=lambda: rows["n"], probe_interval=1e9, probe_window=0.0,
        decision_seconds=0.0, settle_seconds=0.0, entry_seconds=0.0,
    )  # fmt: skip
    for n, ratio in ((2, 1.3), (8, 1.1), (32, 1.2)):
        with_ar_baseline(policy, n, 8)
        ar = policy.windows.goodput(rows_bucket(n), 0)
        for k in range(1, 5):
            policy.windows.add(rows_bucket(n), k, tokens=ratio * ar, row_seconds=1.0, seconds=1.0)
    assert policy._smaller_batch_advantage(rows_bucket(32)) == pytest.approx(1.1 * (1.1 / 1.3) ** 0.5)
    rows["n"] = 32
    assert policy.choose(4) == 0
    rows["n"] = 8
    assert policy.choose(4) > 0
    assert policy._smaller_batch_advantage(rows_bucket(8)) == pytest.approx(1.3)  # one bucket measured below


def test_no_probe_where_smaller_batches_credit_drafting_below_the_margin():
    """At AR in a batch size where the smaller ones' measured advantage carries under the margin,
    a probe could not change the choice: the policy does not probe; where it carries above, it does."""

    def probes(small_ratio: float) -> bool:
        rows, now = {"n": 2}, {"t": 0.0}
        policy = GoodputDraftLength(
            CPU, CHEAP_DRAFT, k_max=4, rows=lambda: rows["n"], probe_interval=1.0, probe_window=0.5,
            decision_seconds=0.25, settle_seconds=0.0, clock=lambda: now["t"],
        )  # fmt: skip
        with_ar_baseline(policy, 2, 8)
        ar = policy.windows.goodput(rows_bucket(2), 0)
        for k in range(1, 5):
            policy.windows.add(rows_bucket(2), k, tokens=small_ratio * ar, row_seconds=1.0, seconds=1.0)
        rows["n"] = 8
        with_ar_baseline(policy, 8, 8)
        picks = []
        for _ in range(40):  # 10 s of choices every 0.25 s
            picks.append(policy.choose(4))
            now["t"] += 0.25
        return any(picks)

    assert not probes(1.02)
    assert probes(1.3)


def test_a_short_drafting_window_does_not_outweigh_the_prediction():
    """One short window that measured drafting at 1.5x AR (the kind of outlier one K's cell gave
    under churn) is weighed against the prediction by the seconds behind it: with the forwards
    predicting a loss the policy stays at AR; with most of a second of windows at that ratio
    behind the drafting side, it drafts."""
    policy = GoodputDraftLength(
        CPU, CHEAP_DRAFT, k_max=4, rows=lambda: 64, probe_interval=1e9, decision_seconds=0.0,
        settle_seconds=0.0, prior_seconds=0.5,
    )  # fmt: skip
    for _ in range(20):
        policy.observe(4, 2)
    with_ar_baseline(policy, 64)
    bucket = rows_bucket(64)
    goodput = policy._goodputs(64, bucket, policy._smaller_batch_advantage(bucket))
    assert max(goodput[1:]) < 0.95 * goodput[0]  # predicted: drafting loses at 64 rows
    ar = policy.windows.goodput(bucket, 0)
    policy.windows.add(bucket, 6, tokens=1.5 * ar * 64 * 0.1, row_seconds=64 * 0.1, seconds=0.1)
    assert policy.choose(4) == 0
    for k in (1, 2, 3):  # the drafting side pools its windows, whatever K they ran
        policy.windows.add(bucket, k, tokens=1.5 * ar * 64 * 0.3, row_seconds=64 * 0.3, seconds=0.3)
    assert policy.windows.goodput(bucket, 1) == pytest.approx(1.5 * ar)
    assert policy.choose(4) > 0


def test_prefill_pauses_are_not_counted_in_windows():
    """The batch's prefills of joining rows cost the same at every K: a window's row-seconds
    leave them out, so an AR window measured while a batch fills reads its steady-state goodput."""
    now, paused = {"t": 0.0}, {"s": 0.0}
    policy = GoodputDraftLength(
        CPU, CHEAP_DRAFT, k_max=4, rows=lambda: 4, decision_seconds=1.0, settle_seconds=0.0,
        clock=lambda: now["t"], paused=lambda: paused["s"],
    )  # fmt: skip
    assert policy.choose(4) == 0
    for _ in range(10):  # 0.1 s per step, of which 0.04 s is a joining row's prefill
        now["t"] += 0.1
        paused["s"] += 0.04
        for _ in range(4):
            policy.observe_tokens(1)
    now["t"] += 0.01
    policy.choose(4)  # closes the window: 40 tokens over 4 rows x (10 x 0.06 + 0.01) s
    assert policy.windows.goodput(rows_bucket(4), 0) == pytest.approx(40 / (4 * 0.61))
    assert policy.windows.evidence(rows_bucket(4), 0) == pytest.approx(0.61)


def test_window_row_seconds_follow_the_batch_size_with_throttled_integration():
    """Every row reports every cycle; the window integrates rows over time at most every
    ``integrate_seconds`` unless the batch changed size (each change closes the interval at the
    size that held through it), so 2 rows for 1 s then 4 rows for 1 s is 6 row-seconds."""
    now, rows = {"t": 0.0}, {"n": 2}
    policy = cheap_draft_policy(
        k_max=4, rows=lambda: rows["n"], decision_seconds=10.0, clock=lambda: now["t"]
    )
    policy.choose(4)
    calls = {"n": 0}
    policy.paused = lambda: calls.__setitem__("n", calls["n"] + 1) or 0.0
    for step in range(200):  # 10 ms cycles
        now["t"] = (step + 1) * 0.01
        rows["n"] = 2 if now["t"] <= 1.0 + 1e-9 else 4
        for _ in range(rows["n"]):
            policy.observe_tokens(1)
    w = policy._window
    assert w.row_seconds == pytest.approx(6.0, abs=0.2) and w.tokens == 600
    assert calls["n"] < 60  # not one pool-lock read per row and cycle (600 reports)


def test_choices_are_counted_from_many_threads():
    """``choose`` takes no lock while the decision holds; every choice is still counted."""
    policy = cheap_draft_policy(k_max=4, rows=lambda: 16, decision_seconds=60.0)
    policy.choose(4)

    def ask() -> None:
        for _ in range(2000):
            policy.choose(4)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(policy.chosen.values()) == 1 + 8 * 2000


def test_an_idle_pool_counts_as_paused(target, draft):
    """Between two loads (a minute between load-test levels) the policy's open window must not
    read as a minute without tokens: it then judged drafting by ~0 tokens per row-second and
    stopped drafting for good. The pool reports idle time as paused time, which windows leave
    out; while a request decodes (after its prefill), nothing is paused."""
    now = {"t": 100.0}  # an injected clock: the pool's idle time is read from it

    def tick(text: str, ids: list[int]) -> None:  # each chunk takes 0.5 s of the clock
        now["t"] += 0.5
        during.append(pool.paused_seconds())

    pool = ServingPool(
        ModelSet(target=target, draft=draft), "sd", {"k": 4}, adaptive_k=True, batching=True,
        clock=lambda: now["t"],
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_new_tokens=30, ignore_eos=True)
    before = pool.paused_seconds()
    now["t"] += 0.2
    assert pool.paused_seconds() - before == pytest.approx(0.2, abs=1e-9)
    during: list[float] = []
    pool.submit("w1 w2", params, on_chunk=tick)
    assert len(during) > 2 and during[-1] - during[0] < 1e-9 and pool.batcher.prefill_seconds > 0
    after = pool.paused_seconds()
    now["t"] += 0.1
    assert pool.paused_seconds() - after == pytest.approx(0.1, abs=1e-9)


def test_rows_coming_and_going_do_not_trap_the_policy_in_probes():
    """Two clients: the batch flips between 1 and 2 rows every few steps (a request ends, the
    next joins), i.e. between two buckets. A probe used to be cut short at each change of bucket
    and restarted by the next decision (the side's wait had long passed), so the policy ran AR
    steps for good although drafting was measured at ~1.9x AR (load test: tau 1.32 at two clients).
    A probe now holds for its window across neighbouring buckets; between probes the policy drafts."""
    now, rows = {"t": 0.0}, {"n": 2}
    policy = cheap_draft_policy(
        k_max=8, rows=lambda: rows["n"], decision_seconds=1.0, probe_window=1.0, probe_interval=10.0,
        clock=lambda: now["t"],
    )  # fmt: skip
    picks = []
    for step in range(900):  # 90 s of 0.1 s steps
        rows["n"] = 2 if (step // 3) % 2 == 0 else 1
        k = policy.choose(8)
        picks.append(k)
        now["t"] += 0.1
        for _ in range(rows["n"]):
            if k:
                policy.observe(k, k)
            policy.observe_tokens(15 if k else 8)  # 150 vs 80 tokens per row-second
    late = picks[100:]
    ar_share = sum(k == 0 for k in late) / len(late)
    assert ar_share < 0.2, ar_share


@pytest.mark.parametrize("ratio,probes", [(1.08, True), (1.5, False)])
def test_a_marginal_drafting_advantage_keeps_ar_measured(ratio, probes):
    """Drafting measured only a little above AR (under ``marginal_advantage``): AR is probed every
    ``marginal_probe_interval`` seconds, so that its cell is not left with the seconds measured
    while the batch filled; a clear advantage keeps the long interval."""
    now = {"t": 0.0}
    policy = GoodputDraftLength(
        CPU, CHEAP_DRAFT, k_max=4, rows=lambda: 2, probe_interval=100.0, probe_window=0.5,
        decision_seconds=0.25, settle_seconds=0.0, marginal_probe_interval=3.0, clock=lambda: now["t"],
    )  # fmt: skip
    for _ in range(20):
        policy.observe(4, 4)
    with_ar_baseline(policy, 2)
    ar = policy.windows.goodput(rows_bucket(2), 0)
    policy.windows.add(rows_bucket(2), 2, tokens=ratio * ar * 20, row_seconds=20.0, seconds=20.0)
    picks = []
    for _ in range(40):  # 10 s of choices every 0.25 s
        picks.append(policy.choose(4))
        now["t"] += 0.25
    assert picks[0] > 0
    assert (0 in picks) == probes
    if probes:
        starts = [i for i in range(1, 40) if picks[i] == 0 and picks[i - 1] > 0]
        assert len(starts) >= 2 and all(b - a <= 16 for a, b in itertools.pairwise(starts))


def test_decisions_follow_the_load_while_a_wave_of_requests_joins():
    """32 clients: between waves of requests the batch runs with ~8-12 rows for ~0.3 s while the
    next requests are set up and prefilled one by one. The server still holds ~32 requests: the
    decision is for 32 rows (AR here), not for the transient batch size (drafting there)."""
    rows, load, now = {"n": 32}, {"n": 32}, {"t": 0.0}
    policy = cheap_draft_policy(
        k_max=4, rows=lambda: rows["n"], load=lambda: load["n"], decision_seconds=2.0, probe_interval=1e9,
        entry_seconds=0.0, clock=lambda: now["t"],
    )  # fmt: skip
    with_measured_sides(policy, {8: 1.5, 32: 0.7})
    picks = []
    for step in range(200):  # a wave every 2 s: 0.3 s at 8 rows while 32 requests are in flight
        rows["n"] = 8 if step % 40 < 6 else 32
        picks.append(policy.choose(4))
        now["t"] += 0.05
    assert picks == [0] * 200
    rows["n"] = load["n"] = 8  # the server holds 8 requests: 8 rows decide
    assert policy.choose(4) > 0
