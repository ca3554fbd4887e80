"""Confidence intervals and paired comparisons for quality figures (one implementation).

Every quality and speed figure the benchmark, the report and ``relaxspec eval`` print goes
through here (each function's docstring gives its formula and reference):

- :func:`wilson` / :func:`wilson_clustered` — Wilson score interval for a proportion (exact-match,
  pass@1), the latter at Kish's effective sample size for outcomes clustered by prompt;
- :func:`bootstrap_mean` — percentile bootstrap for a mean, optionally resampling whole clusters;
- :func:`mcnemar_exact` and :func:`paired_comparison` — two methods on the same prompts (× seeds):
  paired bootstrap of the difference, exact McNemar p-value for binary outcomes;
- :func:`speed_ratio` — throughput ratio of two runners with a delete-a-group jackknife on the log.

Bootstrap draws come from a seeded numpy ``Generator`` (the jackknife draws nothing), so every
figure is reproducible from the records; bad inputs raise :class:`~relaxspec.errors.RelaxSpecError`.
How the intervals behave: docs/results.md ("How the speed intervals behave").
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from relaxspec.errors import RelaxSpecError

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided interval; ``n`` observations (``clusters`` independent
    units when observations were grouped, else ``n``); ``method`` names how it was computed."""

    estimate: float
    low: float
    high: float
    n: int
    method: str
    confidence: float = CONFIDENCE
    clusters: int | None = None
    n_effective: float | None = None  # wilson_clustered: the effective sample size used

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Paired:
    """``x`` vs ``y`` on the same units: ``delta`` = mean(x) − mean(y) with its interval over
    ``n_pairs`` pairs; for binary outcomes ``b`` = pairs where only x succeeds, ``c`` = only y, and
    ``p_value`` the exact McNemar two-sided p-value (None for non-binary outcomes)."""

    delta: float
    low: float
    high: float
    n_pairs: int
    b: int | None
    c: int | None
    p_value: float | None
    method: str
    confidence: float = CONFIDENCE
    clusters: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Validation


def _check_confidence(confidence: float) -> None:
    if not (isinstance(confidence, int | float) and 0 < confidence < 1):
        raise RelaxSpecError(f"confidence must be in (0, 1), got {confidence!r}")


def _values(values: Sequence[float] | np.ndarray, name: str = "values") -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise RelaxSpecError(f"{name} must be numbers") from None
    if arr.ndim != 1:
        raise RelaxSpecError(f"{name} must be a flat sequence of numbers")
    if arr.size == 0:
        raise RelaxSpecError(f"{name} is empty: an interval needs at least one observation")
    if not np.all(np.isfinite(arr)):
        raise RelaxSpecError(f"{name} contains NaN or infinite values")
    return arr


def _cluster_index(clusters: Sequence[Hashable] | None, n: int) -> np.ndarray | None:
    """Integer cluster ids (0..m-1) or None when every observation is its own cluster."""
    if clusters is None:
        return None
    if len(clusters) != n:
        raise RelaxSpecError(f"{len(clusters)} cluster labels for {n} observations")
    ids: dict[Hashable, int] = {}
    index = np.array([ids.setdefault(c, len(ids)) for c in clusters], dtype=np.int64)
    return None if len(ids) == n else index


def is_binary(values: Sequence[float] | np.ndarray) -> bool:
    """Every value is 0 or 1 (a success/failure outcome)."""
    arr = np.asarray(values, dtype=float)
    return bool(np.all((arr == 0) | (arr == 1)))


# ---------------------------------------------------------------------------------------------
# One sample


def wilson(k: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Wilson score interval for ``k`` successes in ``n`` trials (Wilson, 1927).

    With ``z`` the normal quantile, ``p = k/n``: centre ``(p + z²/2n) / (1 + z²/n)``, half-width
    ``z/(1 + z²/n) · sqrt(p(1−p)/n + z²/4n²)``. Unlike the Wald interval it stays inside [0, 1], is
    not degenerate at ``k = 0`` or ``k = n``, and keeps close to nominal coverage at small ``n``
    (Brown, Cai & DasGupta, 2001).
    """
    _check_confidence(confidence)
    for name, v in (("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise RelaxSpecError(f"{name} must be an integer, got {v!r}")
    if n < 1:
        raise RelaxSpecError(f"a proportion needs n >= 1 trials, got n={n}")
    if not 0 <= k <= n:
        raise RelaxSpecError(f"successes k must be in [0, n={n}], got k={k}")
    low, high = _wilson_bounds(k / n, n, confidence)
    return Interval(k / n, low, high, int(n), "wilson", confidence)


def _wilson_bounds(p: float, n: float, confidence: float) -> tuple[float, float]:
    """Wilson score bounds for an observed proportion ``p`` out of ``n`` (``n`` may be fractional:
    an effective sample size); always inside [0, 1] and around ``p``."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n))
    low = 0.0 if p <= 0 else max(0.0, min(p, centre - half))
    high = 1.0 if p >= 1 else min(1.0, max(p, centre + half))
    return low, high


def wilson_clustered(
    values: Sequence[float] | np.ndarray, clusters: Sequence[Hashable], confidence: float = CONFIDENCE
) -> Interval:
    """Wilson interval for 0/1 outcomes grouped in clusters (e.g. all seeds of one prompt).

    Outcomes of one cluster are correlated (greedy decoding repeats a prompt's outcome under every
    seed), so counting them as independent overstates the evidence. The effective sample size
    ``n_eff = p(1−p) / v`` (Kish's design effect, 1965), with ``v`` the cluster-robust
    (linearisation) variance of the ratio mean ``p = Σ s_i / Σ c_i`` over ``m`` clusters,
    ``v = m/(m−1) · Σ (s_i − p c_i)² / N²``, replaces ``n`` in the Wilson formula (Korn &
    Graubard, 1998, do the same for Clopper–Pearson). ``n_eff`` is kept within [m, N]: at worst one
    observation per cluster, at best all N; where ``p`` is 0 or 1 the correlation cannot be
    estimated and ``n_eff = m`` (the conservative end).
    """
    _check_confidence(confidence)
    x = _values(values)
    if not is_binary(x):
        raise RelaxSpecError("wilson_clustered needs 0/1 outcomes")
    index = _cluster_index(clusters, x.size)
    n = int(x.size)
    if index is None:
        return wilson(int(x.sum()), n, confidence)
    m = int(index.max()) + 1
    sums = np.bincount(index, weights=x, minlength=m)
    counts = np.bincount(index, minlength=m).astype(float)
    p = float(x.mean())
    if 0 < p < 1:
        v = m / (m - 1) * float(np.sum((sums - p * counts) ** 2)) / n**2 if m > 1 else 0.0
        n_eff = p * (1 - p) / v if v > 0 else float(n)
    else:
        n_eff = float(m)
    n_eff = min(max(n_eff, float(m)), float(n))
    low, high = _wilson_bounds(p, n_eff, confidence)
    return Interval(p, low, high, n, "wilson (effective n, clustered)", confidence, m, n_eff)


def _percentile(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1 - confidence) / 2
    low, high = np.quantile(draws, [alpha, 1 - alpha])
    return float(low), float(high)


def _bootstrap_means(
    x: np.ndarray, index: np.ndarray | None, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Means of ``resamples`` bootstrap samples of ``x`` (whole clusters when ``index`` is given)."""
    if index is None:
        draws = rng.integers(0, x.size, size=(resamples, x.size))
        return x[draws].mean(axis=1)
    m = int(index.max()) + 1
    sums = np.bincount(index, weights=x, minlength=m)
    counts = np.bincount(index, minlength=m).astype(float)
    draws = rng.integers(0, m, size=(resamples, m))
    return sums[draws].sum(axis=1) / counts[draws].sum(axis=1)


def _check_resamples(resamples: int) -> None:
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise RelaxSpecError(f"resamples must be an integer >= 100, got {resamples!r}")


def bootstrap_mean(
    values: Sequence[float] | np.ndarray,
    clusters: Sequence[Hashable] | None = None,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Interval:
    """Percentile bootstrap interval for the mean of ``values`` (Efron & Tibshirani, 1993, ch. 13).

    ``clusters`` (one label per value, e.g. the prompt of each prompt × seed outcome) resamples
    whole clusters instead of single values (cluster bootstrap, Davison & Hinkley, 1997, §3.8), so
    correlated outcomes of one prompt do not pass for independent evidence. Draws come from
    ``numpy.random.default_rng(seed)``: the same data give the same interval. The interval is
    widened, if need be, to contain the estimate. With one value (or one cluster) it is that
    value: the bootstrap cannot say more; small samples of a proportion are better served by
    :func:`wilson`.
    """
    _check_confidence(confidence)
    _check_resamples(resamples)
    x = _values(values)
    index = _cluster_index(clusters, x.size)
    estimate = float(x.mean())
    means = _bootstrap_means(x, index, resamples, np.random.default_rng(seed))
    low, high = _percentile(means, confidence)
    m = x.size if index is None else int(index.max()) + 1
    return Interval(
        estimate,
        min(low, estimate),
        max(high, estimate),
        int(x.size),
        "bootstrap" if index is None else "cluster bootstrap",
        confidence,
        None if index is None else m,
    )


def mean_interval(
    values: Sequence[float] | np.ndarray,
    clusters: Sequence[Hashable] | None = None,
    confidence: float = CONFIDENCE,
    proportion: bool | None = None,
) -> Interval:
    """The interval the tables show for a mean: for 0/1 outcomes :func:`wilson`, or
    :func:`wilson_clustered` where a cluster holds several outcomes; :func:`bootstrap_mean` (by
    cluster where a cluster holds several outcomes) for other values. ``proportion`` says whether
    the values are success/failure outcomes (None: whether they are all 0 or 1); a count that
    happens to be 0 or 1 everywhere (``proportion=False``) is still bootstrapped."""
    x = _values(values)
    if proportion is None:
        proportion = is_binary(x)
    elif proportion and not is_binary(x):
        raise RelaxSpecError("a proportion needs 0/1 outcomes")
    if proportion:
        if _cluster_index(clusters, x.size) is None:
            return wilson(int(x.sum()), int(x.size), confidence)
        return wilson_clustered(x, clusters or [], confidence)
    return bootstrap_mean(x, clusters, confidence)


# ---------------------------------------------------------------------------------------------
# Two methods on the same prompts


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant pair counts (McNemar, 1947).

    Under the null (both methods equally good) each of the ``b + c`` discordant pairs falls either
    way with probability 1/2, so ``min(b, c) ~ Binomial(b + c, 1/2)``; the p-value is
    ``min(1, 2 · P(X ≤ min(b, c)))`` — for a symmetric binomial the same as the point-probability
    two-sided binomial test (``scipy.stats.binomtest(b, b + c, 0.5)``). Exact integer arithmetic;
    ``b = c = 0`` gives 1.
    """
    for name, v in (("b", b), ("c", c)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
            raise RelaxSpecError(f"discordant count {name} must be a non-negative integer, got {v!r}")
    n, k = int(b) + int(c), min(int(b), int(c))
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2**n)


def pair_by_key(
    x: Mapping[Hashable, float], y: Mapping[Hashable, float]
) -> tuple[list[Hashable], list[float], list[float]]:
    """(keys, x values, y values) on the keys both hold, in ``x``'s order (pairing is exact: a
    result missing on either side drops that key only)."""
    keys = [k for k in x if k in y]
    return keys, [x[k] for k in keys], [y[k] for k in keys]


def paired_comparison(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    clusters: Sequence[Hashable] | None = None,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Paired:
    """``x`` vs ``y`` measured on the same units (``x[i]`` and ``y[i]`` on prompt × seed ``i``).

    ``delta`` = mean(x) − mean(y); its interval is the paired percentile bootstrap: resample
    pairs (or whole ``clusters`` of pairs, e.g. all seeds of a prompt) and take the mean of the
    differences ``x[i] − y[i]`` (Efron & Tibshirani, 1993, ch. 13). Pairing removes the
    between-prompt variance both methods share, so it is tighter than comparing two separate
    intervals. For 0/1 outcomes also the discordant counts ``b`` (x right, y wrong), ``c`` (x
    wrong, y right) and the exact McNemar p-value (:func:`mcnemar_exact`); McNemar treats pairs as
    independent, so with several seeds per prompt read it with the clustered interval.
    """
    a, b_ = _values(x, "x"), _values(y, "y")
    if a.size != b_.size:
        raise RelaxSpecError(f"paired comparison needs pairs: {a.size} values vs {b_.size}")
    iv = bootstrap_mean(a - b_, clusters, confidence, resamples, seed)
    b = c = p = None
    if is_binary(a) and is_binary(b_):
        b = int(np.sum((a == 1) & (b_ == 0)))
        c = int(np.sum((a == 0) & (b_ == 1)))
        p = mcnemar_exact(b, c)
    return Paired(
        delta=iv.estimate,
        low=iv.low,
        high=iv.high,
        n_pairs=iv.n,
        b=b,
        c=c,
        p_value=p,
        method="paired " + iv.method + (" + exact McNemar" if p is not None else ""),
        confidence=confidence,
        clusters=iv.clusters,
    )


# ---------------------------------------------------------------------------------------------
# Speed of two runners on the same prompts


def t_quantile(confidence: float, df: int) -> float:
    """Two-sided Student-t quantile: the ``t`` with ``P(|T_df| <= t) = confidence``.

    Bisection on the exact closed form of ``A(t|df) = P(|T| <= t)`` for integer ``df``
    (Abramowitz & Stegun 26.7.3–4, in ``θ = atan(t / sqrt(df))``); beyond 300 degrees of freedom
    the normal quantile with the first Cornish–Fisher terms (A&S 26.7.5), good to 1e-6 there.
    """
    _check_confidence(confidence)
    if isinstance(df, bool) or not isinstance(df, int | np.integer) or df < 1:
        raise RelaxSpecError(f"degrees of freedom must be an integer >= 1, got {df!r}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    if df > 300:
        return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
    lo, hi = 0.0, math.pi / 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_two_sided(mid, int(df)) < confidence else (lo, mid)
    return math.sqrt(df) * math.tan((lo + hi) / 2)


def _t_two_sided(theta: float, df: int) -> float:
    """``A(t|df)`` at ``θ = atan(t / sqrt(df))`` (A&S 26.7.3 for odd, 26.7.4 for even ``df``)."""
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for j in range(2, df - 1, 2):  # (1·3···(j−1)) / (2·4···j) cos^j θ
            term *= c2 * (j - 1) / j
            total += term
        return s * total
    if df == 1:
        return 2 * theta / math.pi
    term = total = math.cos(theta)
    for j in range(3, df - 1, 2):  # (2·4···(j−1)) / (1·3···j) cos^j θ
        term *= c2 * (j - 1) / j
        total += term
    return 2 / math.pi * (theta + s * total)


def _group_sums(values: np.ndarray, index: np.ndarray | None) -> np.ndarray:
    return values if index is None else np.bincount(index, weights=values, minlength=int(index.max()) + 1)


def speed_ratio(
    tokens_x: Sequence[float] | np.ndarray,
    seconds_x: Sequence[float] | np.ndarray,
    tokens_y: Sequence[float] | np.ndarray,
    seconds_y: Sequence[float] | np.ndarray,
    clusters: Sequence[Hashable] | None = None,
    confidence: float = CONFIDENCE,
) -> Interval | None:
    """Speed of ``x`` over ``y``, both timed on the same units (prompt × seed ``i``), with its interval.

    The estimate is the ratio of throughputs, ``R = (Σ tok_x / Σ sec_x) / (Σ tok_y / Σ sec_y)``
    (total tokens over total seconds, never a mean of per-prompt rates). Its interval is the
    delete-a-group jackknife of ``log R`` (Quenouille, 1956; Tukey, 1958; Efron & Tibshirani,
    1993, ch. 11): with ``m`` groups (units, or whole ``clusters`` such as all seeds of a prompt)
    and ``L_j`` the log ratio without group ``j``, ``se² = (m−1)/m · Σ (L_j − mean L)²`` and
    ``R · exp(± t_{m−1} · se)``. Leaving a whole prompt out keeps it paired — its timings under
    both runners go together — so what the prompts share (length, difficulty, machine drift
    between interleaved cells) cancels. The interval covers the prompt-to-prompt variation of
    the ratio, at close to nominal coverage down to a handful of prompts (where a percentile
    bootstrap of the same ratio runs narrow), not drift between separate runs. None with fewer
    than two groups, or where leaving one out leaves no tokens or no time.
    """
    _check_confidence(confidence)
    timings = (tokens_x, seconds_x, tokens_y, seconds_y)
    arrays = [_values(v, name) for v, name in zip(timings, _SPEED_NAMES, strict=True)]
    if len({a.size for a in arrays}) != 1:
        raise RelaxSpecError(f"speed ratio needs paired timings: {[a.size for a in arrays]} values")
    if any(np.any(a < 0) for a in arrays):
        raise RelaxSpecError("tokens and seconds must be >= 0")
    index = _cluster_index(clusters, arrays[0].size)
    tx, sx, ty, sy = (_group_sums(a, index) for a in arrays)
    totals = [float(a.sum()) for a in (tx, sx, ty, sy)]
    if min(totals) <= 0:
        raise RelaxSpecError("a speed ratio needs tokens and seconds on both sides")
    estimate = (totals[0] / totals[1]) / (totals[2] / totals[3])
    m = tx.size
    rest = [total - a for total, a in zip(totals, (tx, sx, ty, sy), strict=True)]
    if m < 2 or min(float(r.min()) for r in rest) <= 0:
        return None
    loo = np.log(rest[0] / rest[1]) - np.log(rest[2] / rest[3])
    se = math.sqrt((m - 1) / m * float(np.sum((loo - loo.mean()) ** 2)))
    half = t_quantile(confidence, m - 1) * se
    return Interval(
        estimate,
        estimate * math.exp(-half),
        estimate * math.exp(half),
        int(arrays[0].size),
        "jackknife (log ratio, t)" if index is None else "cluster jackknife (log ratio, t)",
        confidence,
        None if index is None else m,
    )


_SPEED_NAMES = ("tokens_x", "seconds_x", "tokens_y", "seconds_y")


# ---------------------------------------------------------------------------------------------
# Text


def format_interval(iv: Mapping[str, Any] | Interval | None, digits: int = 2) -> str:
    """``0.80 [0.62–0.91]`` (``-`` for None)."""
    if iv is None:
        return "-"
    d = iv.to_dict() if isinstance(iv, Interval) else iv
    f = f"{{:.{digits}f}}"
    return f"{f.format(d['estimate'])} [{f.format(d['low'])}–{f.format(d['high'])}]"


def format_paired(p: Mapping[str, Any] | Paired | None, digits: int = 2, show_n: bool = True) -> str:
    """``+0.05 [-0.10, +0.20] p=0.62 n=20`` (``-`` for None; no p for non-binary outcomes)."""
    if p is None:
        return "-"
    d = p.to_dict() if isinstance(p, Paired) else p
    f = f"{{:+.{digits}f}}"
    text = f"{f.format(d['delta'])} [{f.format(d['low'])}, {f.format(d['high'])}]"
    if d.get("p_value") is not None:
        text += f" p={format_p(d['p_value'])}"
    return f"{text} n={d['n_pairs']}" if show_n else text


def format_p(p: float) -> str:
    """``0.62``, ``0.003``, ``<0.001``."""
    if p < 0.001:
        return "<0.001"
    return f"{p:.3f}" if p < 0.01 else f"{p:.2f}"
