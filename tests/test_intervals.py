"""Confidence intervals and paired comparisons: coverage on simulated data, exact McNemar against
scipy and textbook values, invariants (hypothesis), bad input, and their use in benchmark rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relaxspec.errors import RelaxSpecError
from relaxspec.eval.intervals import (
    Interval,
    bootstrap_mean,
    format_interval,
    format_p,
    format_paired,
    mcnemar_exact,
    mean_interval,
    pair_by_key,
    paired_comparison,
    wilson,
    wilson_clustered,
)
from relaxspec.eval.results import COLUMNS, Cell, build_rows, markdown_table

# --- Wilson ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,p", [(20, 0.5), (20, 0.8), (50, 0.2), (100, 0.5), (200, 0.3), (500, 0.1)])
def test_wilson_coverage_on_simulated_draws(n, p):
    rng = np.random.default_rng(1000 * n + int(100 * p))
    ks = rng.binomial(n, p, size=2000)
    table = [wilson(k, n) for k in range(n + 1)]
    covered = np.mean([table[k].low <= p <= table[k].high for k in ks])
    assert 0.93 <= covered <= 0.975, covered


def test_wilson_exact_coverage_over_a_grid():
    """Exact coverage sum_k Bin(k; n, p)·[p in CI(k)]: close to 95 % on average, never far below."""
    covs = []
    for n in (20, 30, 50, 100, 200):
        table = [wilson(k, n) for k in range(n + 1)]
        for p in np.linspace(0.1, 0.9, 17):
            covs.append(
                sum(
                    math.comb(n, k) * p**k * (1 - p) ** (n - k)
                    for k in range(n + 1)
                    if table[k].low <= p <= table[k].high
                )
            )
    assert 0.94 <= np.mean(covs) <= 0.96 and min(covs) >= 0.92


def test_wilson_textbook_values_and_edges():
    iv = wilson(16, 20)  # Brown, Cai & DasGupta style check: 0.800 (0.584, 0.919)
    assert (iv.estimate, round(iv.low, 3), round(iv.high, 3), iv.n) == (0.8, 0.584, 0.919, 20)
    all_ok = wilson(20, 20)
    assert all_ok.high == 1.0 and 0.83 < all_ok.low < 0.84  # not degenerate at k = n
    none = wilson(0, 20)
    assert none.low == 0.0 and 0.16 < none.high < 0.17
    one = wilson(1, 1)
    assert one.estimate == 1.0 and one.high == 1.0 and 0.2 < one.low < 0.21
    assert wilson(0, 1).high == pytest.approx(1 - one.low)
    assert wilson(50, 100, confidence=0.99).high > wilson(50, 100).high  # wider at higher confidence


@pytest.mark.parametrize(
    "k,n,match",
    [(0, 0, "n >= 1"), (3, 2, r"k must be in \[0"), (-1, 5, r"k must be in \[0"), (1.5, 3, "integer"),
     (True, 3, "integer"), (1, "3", "integer")],
)  # fmt: skip
def test_wilson_bad_input(k, n, match):
    with pytest.raises(RelaxSpecError, match=match):
        wilson(k, n)


@given(st.integers(1, 100_000), st.data())
def test_wilson_invariants(n, data):
    k = data.draw(st.integers(0, n))
    iv = wilson(k, n)
    assert 0.0 <= iv.low <= iv.estimate <= iv.high <= 1.0
    mirror = wilson(n - k, n)
    assert iv.low == pytest.approx(1 - mirror.high, abs=1e-12)


# --- bootstrap ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_bootstrap_coverage_on_a_known_mean():
    rng = np.random.default_rng(7)
    hits = [
        _covers(bootstrap_mean(rng.normal(3.0, 2.0, size=40), resamples=1000, seed=i), 3.0)
        for i in range(400)
    ]
    assert 0.90 <= np.mean(hits) <= 0.985, np.mean(hits)


def _covers(iv: Interval, truth: float) -> bool:
    return iv.low <= truth <= iv.high


@pytest.mark.slow
def test_clustered_interval_covers_where_treating_seeds_as_independent_does_not():
    """Greedy decoding repeats a prompt's outcome under every seed: the clustered interval keeps
    its coverage, the naive one (n counted as prompts × seeds) does not."""
    rng = np.random.default_rng(11)
    prompts, seeds, p = 30, 4, 0.6
    clustered, boot, naive = [], [], []
    for i in range(300):
        per_prompt = rng.binomial(1, p, size=prompts).astype(float)
        values = np.repeat(per_prompt, seeds)
        labels = np.repeat(np.arange(prompts), seeds).tolist()
        clustered.append(_covers(mean_interval(values, labels), p))  # Wilson at effective n
        boot.append(_covers(bootstrap_mean(values, labels, resamples=500, seed=i), p))
        naive.append(_covers(bootstrap_mean(values, resamples=500, seed=i), p))
    assert 0.92 <= np.mean(clustered) <= 0.99
    assert 0.88 <= np.mean(boot) <= 0.99
    assert np.mean(naive) < 0.85


@pytest.mark.slow
def test_clustered_wilson_coverage_with_correlated_seeds():
    """Prompt difficulty ~ Beta(2, 2) (mean 0.5), 4 seeds per prompt drawn at that difficulty:
    outcomes within a prompt are correlated (ICC 0.2) but not identical."""
    rng = np.random.default_rng(13)
    prompts, seeds = 40, 4
    labels = np.repeat(np.arange(prompts), seeds).tolist()
    hits, widths, naive = [], [], []
    for _ in range(1000):
        difficulty = rng.beta(2, 2, size=prompts)
        values = rng.binomial(1, np.repeat(difficulty, seeds)).astype(float)
        iv = wilson_clustered(values, labels)
        hits.append(_covers(iv, 0.5))
        widths.append(iv.high - iv.low)
        naive.append(_covers(wilson(int(values.sum()), values.size), 0.5))
    assert 0.93 <= np.mean(hits) <= 0.975, np.mean(hits)
    assert np.mean(naive) < np.mean(hits)  # n = 160 counted as independent under-covers


def test_clustered_wilson_edges():
    same = wilson_clustered([0.0] * 12, [i % 4 for i in range(12)])  # nothing solved: n_eff = 4 prompts
    assert (same.low, same.high, same.n, same.clusters, same.n_effective) == (
        0.0,
        wilson(0, 4).high,
        12,
        4,
        4.0,
    )
    distinct = wilson_clustered([1, 0, 1], ["a", "b", "c"])  # no cluster holds two: plain Wilson
    assert distinct == wilson(2, 3)
    with pytest.raises(RelaxSpecError, match="0/1 outcomes"):
        wilson_clustered([0.5, 1.0], ["a", "a"])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=1, max_size=40))
def test_clustered_wilson_invariants(data):
    values = [float(v) for v, _ in data]
    labels = [c for _, c in data]
    iv = wilson_clustered(values, labels)
    assert 0.0 <= iv.low <= iv.estimate <= iv.high <= 1.0
    if iv.n_effective is not None:
        assert iv.clusters <= iv.n_effective <= iv.n


def test_bootstrap_is_reproducible_and_degenerate_cases():
    x = [0.1, 0.5, 0.2, 0.9, 0.4, 0.7]
    assert bootstrap_mean(x) == bootstrap_mean(x)  # fixed-seed generator
    iv = bootstrap_mean([2.5])
    assert (iv.estimate, iv.low, iv.high, iv.n) == (2.5, 2.5, 2.5, 1)
    same = bootstrap_mean([3.0] * 10)
    assert same.low == same.high == 3.0
    c = bootstrap_mean([1, 2, 3, 4], clusters=["a", "a", "b", "b"])
    assert c.method == "cluster bootstrap" and c.clusters == 2 and c.n == 4
    assert bootstrap_mean([1, 2, 3], clusters=["a", "b", "c"]).method == "bootstrap"  # all distinct
    assert mean_interval([1, 0, 1]).method == "wilson"
    assert mean_interval([0.5, 1.0]).method == "bootstrap"
    assert mean_interval([1, 0, 1, 1], ["a", "a", "b", "b"]).method == "wilson (effective n, clustered)"
    assert mean_interval([0.5, 1, 1, 1], ["a", "a", "b", "b"]).method == "cluster bootstrap"
    assert mean_interval([0, 1, 1], proportion=False).method == "bootstrap"  # e.g. a token count
    with pytest.raises(RelaxSpecError, match="0/1 outcomes"):
        mean_interval([0.5, 1.0], proportion=True)


@pytest.mark.parametrize(
    "values,kwargs,match",
    [
        ([], {}, "empty"),
        ([1.0, float("nan")], {}, "NaN or infinite"),
        ([1.0, float("inf")], {}, "NaN or infinite"),
        (["a"], {}, "numbers"),
        ([[1.0, 2.0]], {}, "flat"),
        ([1.0, 2.0], {"clusters": ["a"]}, "1 cluster labels for 2"),
        ([1.0], {"confidence": 1.0}, "confidence"),
        ([1.0], {"resamples": 10}, "resamples"),
    ],
)
def test_bootstrap_bad_input(values, kwargs, match):
    with pytest.raises(RelaxSpecError, match=match):
        bootstrap_mean(values, **kwargs)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=40))
def test_bootstrap_invariants(values):
    iv = bootstrap_mean(values, resamples=200)
    assert iv.low <= iv.estimate <= iv.high
    assert min(values) - 1e-6 <= iv.low and iv.high <= max(values) + 1e-6


@settings(max_examples=50, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=60))
def test_binary_intervals_stay_in_unit_range(outcomes):
    iv = mean_interval([float(o) for o in outcomes])
    assert 0.0 <= iv.low <= iv.estimate <= iv.high <= 1.0 and iv.n == len(outcomes)


# --- McNemar and paired comparisons -----------------------------------------------------------


def test_mcnemar_textbook_values():
    # McNemar table a=59, b=6, c=16, d=80 (Wikipedia "McNemar's test"): exact binomial p = 0.052
    assert mcnemar_exact(6, 16) == pytest.approx(0.0525, abs=1e-4)
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)  # 2 · 0.5^5
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(7, 7) == 1.0
    assert mcnemar_exact(1, 0) == 1.0
    assert mcnemar_exact(0, 1000) < 1e-300 or mcnemar_exact(0, 1000) == 0.0


def test_mcnemar_matches_scipy_binomtest_on_random_tables():
    from scipy.stats import binomtest

    rng = np.random.default_rng(3)
    for _ in range(300):
        b, c = (int(v) for v in rng.integers(0, 80, size=2))
        if b + c == 0:
            continue
        assert mcnemar_exact(b, c) == pytest.approx(binomtest(b, b + c, 0.5).pvalue, rel=1e-9, abs=1e-15)


@given(st.integers(0, 300), st.integers(0, 300))
def test_mcnemar_invariants(b, c):
    p = mcnemar_exact(b, c)
    assert 0.0 <= p <= 1.0 and p == mcnemar_exact(c, b)


@pytest.mark.parametrize("b,c", [(-1, 2), (1.0, 2), (True, 0), (None, 1)])
def test_mcnemar_bad_input(b, c):
    with pytest.raises(RelaxSpecError, match="non-negative integer"):
        mcnemar_exact(b, c)


def test_paired_comparison_counts_and_delta():
    x = [1, 1, 0, 1, 0, 1, 1, 0]
    y = [1, 0, 0, 0, 0, 1, 1, 1]
    p = paired_comparison(x, y)
    assert p.delta == pytest.approx((5 - 4) / 8) and p.n_pairs == 8
    assert (p.b, p.c) == (2, 1) and p.p_value == pytest.approx(mcnemar_exact(2, 1))
    assert p.low <= p.delta <= p.high
    same = paired_comparison(x, x)
    assert (same.delta, same.low, same.high, same.b, same.c, same.p_value) == (0, 0, 0, 0, 0, 1.0)
    scores = paired_comparison([0.5, 0.7, 0.9], [0.4, 0.7, 0.6])  # non-binary: no McNemar
    assert scores.p_value is None and scores.b is None and scores.delta == pytest.approx(0.4 / 3)
    with pytest.raises(RelaxSpecError, match="needs pairs: 2 values vs 3"):
        paired_comparison([1, 0], [1, 0, 1])
    with pytest.raises(RelaxSpecError, match="empty"):
        paired_comparison([], [])
    with pytest.raises(RelaxSpecError, match="NaN"):
        paired_comparison([1.0, math.nan], [1.0, 0.0])


def test_pair_by_key_keeps_only_common_keys():
    keys, x, y = pair_by_key({"a": 1.0, "b": 0.0, "c": 1.0}, {"c": 0.0, "a": 1.0, "d": 1.0})
    assert keys == ["a", "c"] and x == [1.0, 1.0] and y == [1.0, 0.0]


@pytest.mark.slow
def test_paired_interval_contains_the_true_delta_at_the_nominal_rate():
    """Joint law of (x, y): P(1,1)=.5, P(1,0)=.15, P(0,1)=.05, P(0,0)=.3 → true Δ = 0.10."""
    rng = np.random.default_rng(5)
    cells = np.array([[1, 1], [1, 0], [0, 1], [0, 0]])
    hits, rejected = [], []
    for i in range(400):
        draw = cells[rng.choice(4, size=200, p=[0.5, 0.15, 0.05, 0.3])]
        p = paired_comparison(draw[:, 0], draw[:, 1], resamples=1000, seed=i)
        hits.append(p.low <= 0.10 <= p.high)
        rejected.append(p.p_value < 0.05)
    assert 0.92 <= np.mean(hits) <= 0.98, np.mean(hits)
    assert np.mean(rejected) > 0.8  # Δ = 0.10 on 200 pairs is usually detected


@pytest.mark.slow
def test_mcnemar_holds_its_level_under_the_null():
    rng = np.random.default_rng(9)
    cells = np.array([[1, 1], [1, 0], [0, 1], [0, 0]])
    ps = []
    for _ in range(1000):
        draw = cells[rng.choice(4, size=100, p=[0.5, 0.1, 0.1, 0.3])]
        b = int(np.sum((draw[:, 0] == 1) & (draw[:, 1] == 0)))
        c = int(np.sum((draw[:, 0] == 0) & (draw[:, 1] == 1)))
        ps.append(mcnemar_exact(b, c))
    assert np.mean(np.array(ps) < 0.05) <= 0.06  # exact test: conservative


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=50))
def test_paired_invariants(pairs):
    x = [float(a) for a, _ in pairs]
    y = [float(b) for _, b in pairs]
    p = paired_comparison(x, y, resamples=200)
    assert -1.0 <= p.low <= p.delta <= p.high <= 1.0
    assert p.b + p.c <= p.n_pairs == len(pairs) and 0.0 <= p.p_value <= 1.0
    assert p.delta == pytest.approx((p.b - p.c) / p.n_pairs)


def test_formatting():
    assert format_interval(wilson(16, 20)) == "0.80 [0.58–0.92]"
    assert format_interval(None) == "-"
    assert format_paired(paired_comparison([1, 1, 0, 1], [1, 0, 0, 1])).startswith("+0.25 [")
    assert "p=" not in format_paired(paired_comparison([0.5, 0.2], [0.1, 0.2]))
    assert (format_p(0.5), format_p(0.0042), format_p(1e-5)) == ("0.50", "0.004", "<0.001")


# --- benchmark rows ------------------------------------------------------------------------------

SAMPLING = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": 8}


def rec(method: str, example: str, quality: float | None, seed: int = 0, tokens=(1, 2, 3), **params):
    return {
        "type": "record",
        "cell": Cell(method, params, "math", seed, SAMPLING).to_dict(),
        "example": example,
        "tokens": list(tokens),
        "seconds": 0.1,
        "stats": None,
        "metric": "exact_match",
        "quality": quality,
        "error": None,
    }


def test_rows_carry_intervals_and_exact_pairs_with_ar():
    ar = [1, 1, 1, 0, 1, 1, 0, 1, 1, 1]
    nsd = [1, 0, 1, 0, 1, 0, 0, 1, 1, 1]  # loses 2 prompts, wins none
    records = [rec("ar", f"e{i}", q) for i, q in enumerate(ar)]
    records += [rec("nsd", f"e{i}", q, tokens=(1, 2, 9), k=4) for i, q in enumerate(nsd)]
    records.append(rec("nsd", "e10", 1.0, k=4))  # no ar result for e10: not paired
    rows = {r.method: r for r in build_rows(records)}
    a, n = rows["ar"], rows["nsd"]
    assert a.quality_ci["n"] == 10 and a.quality_ci["method"] == "wilson"
    assert (a.quality_ci["low"], a.quality_ci["high"]) == pytest.approx(
        (wilson(8, 10).low, wilson(8, 10).high)
    )
    assert n.quality_ci["n"] == 11
    assert a.paired is None  # the baseline itself
    q = n.paired["quality"]
    assert n.paired["baseline"] == "ar" and n.paired["n_pairs"] == 10 and q["n_pairs"] == 10
    assert (q["b"], q["c"]) == (0, 2) and q["delta"] == pytest.approx(-0.2)
    assert q["p_value"] == pytest.approx(0.5)
    assert a.ar_identical_ci["estimate"] == 1.0 and n.ar_identical_ci["estimate"] == 0.0
    assert n.ar_prefix_ci["estimate"] == pytest.approx(2.0)
    assert a.ar_prefix_ci["method"] == "bootstrap"  # a count of tokens, never a Wilson proportion
    assert n.paired["ar_identical"]["delta"] == pytest.approx(-1.0)
    text = markdown_table([a, n])
    assert "0.80 [0.49–0.94] exact_match n=10" in text
    assert "-0.20 [" in text and "p=0.50 n=10 |" in text  # 10 pairs of the row's 11


def test_pooled_seeds_pair_by_prompt_and_seed_and_cluster_by_prompt():
    records = []
    for seed in (0, 1):
        records += [rec("ar", f"e{i}", float(i % 2), seed=seed) for i in range(6)]
        records += [rec("nsd", f"e{i}", float(i % 3 == 0), seed=seed, k=4) for i in range(6)]
    records.pop()  # nsd, seed 1, e5 missing
    pooled = {r.method: r for r in build_rows(records, combine_seeds=True)}
    ci = pooled["ar"].quality_ci
    assert ci["method"] == "wilson (effective n, clustered)" and ci["n"] == 12 and ci["clusters"] == 6
    assert 6 <= ci["n_effective"] <= 12
    p = pooled["nsd"].paired["quality"]
    assert p["n_pairs"] == 11 and p["clusters"] == 6 and "cluster" in p["method"]
    per_seed = build_rows(records)
    assert {(r.method, r.seed): r.paired and r.paired["n_pairs"] for r in per_seed} == {
        ("ar", 0): None,
        ("ar", 1): None,
        ("nsd", 0): 6,
        ("nsd", 1): 5,
    }


def test_without_ar_rows_pair_with_sd_of_the_same_k_else_with_nothing():
    records = [rec("sd", f"e{i}", 1.0, k=k) for i in range(3) for k in (4, 8)]
    records += [rec("nsd", f"e{i}", 0.0, k=8, theta=0.9) for i in range(3)]
    rows = {r.label: r for r in build_rows(records)}
    assert rows["nsd k=8 theta=0.9"].paired["baseline"] == "sd k=8"
    assert rows["sd k=4"].paired is None and rows["sd k=8"].paired is None  # baselines themselves
    delta = dict(COLUMNS)["Δ quality (paired)"](rows["nsd k=8 theta=0.9"])
    assert delta == "-1.00 [-1.00, -1.00] p=0.25 vs sd k=8"  # same n as the row: not repeated
    only = build_rows([rec("nsd", "e0", 1.0, k=4)])
    assert only[0].paired is None and only[0].quality_ci["n"] == 1


def test_rows_without_scores_show_dashes():
    records = [rec("ar", "e0", None), {**rec("nsd", "e0", None, k=4), "error": "boom"}]
    rows = {r.method: r for r in build_rows(records)}
    assert rows["ar"].quality_ci is None and rows["nsd"].paired is None
    cols = dict(COLUMNS)
    assert cols["quality"](rows["ar"]) == "-" and cols["Δ quality (paired)"](rows["nsd"]) == "-"


def test_ar_prefix_is_a_count_even_when_every_prefix_is_0_or_1():
    records = [rec("ar", f"e{i}", 1.0) for i in range(4)]
    records += [rec("nsd", f"e{i}", 1.0, tokens=(1, 9, 9) if i % 2 else (9, 9, 9), k=4) for i in range(4)]
    nsd = next(r for r in build_rows(records) if r.method == "nsd")
    assert nsd.ar_prefix == 0.5 and nsd.ar_prefix_ci["method"] == "bootstrap"
    assert nsd.ar_identical_ci["method"] == "wilson" and nsd.ar_identical_ci["estimate"] == 0.0
