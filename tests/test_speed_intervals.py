"""Speed ratios with 95 % intervals: the jackknife's coverage on simulated benches with a known
ratio, its invariants and edges, and the interval in rows, tables, JSON and reports."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relaxspec.engine import GenerationStats
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.intervals import speed_ratio, t_quantile
from relaxspec.eval.results import Cell, build_rows, markdown_table, print_table, write_outputs

TRUE_RATIO = 1.6


def simulated_bench(rng: np.random.Generator, prompts: int, seeds: int = 1):
    """Per (prompt, seed) timings of AR and a method ``TRUE_RATIO`` times faster in expectation.

    Prompts differ in length and difficulty (shared by both runners: what pairing cancels) and in
    how much the method gains on them (a draft agrees more on some prompts); every generation has
    its own timing noise and its own token count; seeds of a prompt share the prompt's length,
    difficulty and gain. Every factor is independent with mean 1, so the population ratio of
    throughputs is ``TRUE_RATIO`` exactly: ``E[sec_ar] / E[sec_x] = TRUE_RATIO`` at equal
    expected tokens.
    """

    def mean_one(sigma: float, size: int, repeat: int = 1) -> np.ndarray:
        return np.repeat(np.exp(rng.normal(-sigma * sigma / 2, sigma, size)), repeat)

    n = prompts * seeds
    length = np.repeat(rng.integers(20, 129, prompts), seeds).astype(float)
    difficulty, gain = mean_one(0.5, prompts, seeds), mean_one(0.4, prompts, seeds)
    tok_ar = length
    tok_x = length * rng.uniform(0.5, 1.5, n)
    sec_ar = tok_ar / 50 * difficulty * mean_one(0.3, n)
    sec_x = tok_x / (50 * TRUE_RATIO) * difficulty * gain * mean_one(0.3, n)
    labels = np.repeat(np.arange(prompts), seeds).tolist()
    return tok_x, sec_x, tok_ar, sec_ar, labels


def coverage(prompts: int, seeds: int, benches: int = 1000, seed: int = 0, clustered: bool = True) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(benches):
        tok_x, sec_x, tok_y, sec_y, labels = simulated_bench(rng, prompts, seeds)
        iv = speed_ratio(tok_x, sec_x, tok_y, sec_y, labels if clustered else None)
        hits += iv.low <= TRUE_RATIO <= iv.high
    return hits / benches


@pytest.mark.slow
def test_the_interval_covers_the_true_ratio_at_the_nominal_rate():
    """1000 simulated benches of 40 prompts: the 95 % interval holds the true ratio in 93–97 % of
    them; at 10 prompts with these strongly varying per-prompt gains it runs a little narrow."""
    assert 0.93 <= coverage(40, 1) <= 0.97
    assert 0.90 <= coverage(10, 1) <= 0.97


@pytest.mark.slow
def test_seeds_of_a_prompt_are_left_out_together():
    """Prompts × seeds share each prompt's length, difficulty and gain: leaving whole prompts out
    keeps the coverage; treating the 120 generations as independent overstates the evidence."""
    assert 0.93 <= coverage(40, 3) <= 0.97
    assert coverage(40, 3, clustered=False) < 0.90


def test_estimate_is_the_ratio_of_throughputs_not_a_mean_of_rates():
    iv = speed_ratio([10, 30], [0.1, 1.9], [10, 30], [1.0, 2.0])
    assert iv.estimate == pytest.approx((40 / 2.0) / (40 / 3.0))
    assert iv.n == 2 and iv.method == "jackknife (log ratio, t)" and iv.clusters is None
    pooled = speed_ratio([10, 30, 10], [0.1, 1.9, 1.0], [10, 30, 10], [1.0, 2.0, 2.0], ["a", "b", "a"])
    assert pooled.clusters == 2 and pooled.method.startswith("cluster jackknife")


def test_identical_per_prompt_ratios_give_a_point_interval():
    """Every prompt twice as fast: no prompt-to-prompt variation, nothing to be uncertain about."""
    iv = speed_ratio([10, 20, 30], [1, 2, 3], [10, 20, 30], [2, 4, 6])
    assert iv.low == pytest.approx(2.0) and iv.high == pytest.approx(2.0)


def test_edges_and_bad_input():
    assert speed_ratio([10], [1.0], [10], [2.0]) is None  # one prompt: no interval
    assert speed_ratio([10, 0], [1.0, 0.0], [10, 5], [2.0, 1.0]) is None  # leaving one out: no time
    for args, match in [
        (([1, 2], [1, 1], [1], [1]), "paired timings"),
        (([1, -2], [1, 1], [1, 1], [1, 1]), ">= 0"),
        (([0, 0], [1, 1], [1, 1], [1, 1]), "tokens and seconds on both sides"),
        (([], [], [], []), "empty"),
        (([1, float("nan")], [1, 1], [1, 1], [1, 1]), "NaN"),
    ]:
        with pytest.raises(RelaxSpecError, match=match):
            speed_ratio(*args)
    with pytest.raises(RelaxSpecError, match="confidence"):
        speed_ratio([1, 2], [1, 1], [1, 1], [1, 1], confidence=1.0)
    with pytest.raises(RelaxSpecError, match="degrees of freedom"):
        t_quantile(0.95, 0)


def test_t_quantile_matches_scipy():
    from scipy.stats import t

    for df in (1, 2, 3, 4, 7, 10, 29, 120, 300, 301, 5000):
        for confidence in (0.5, 0.9, 0.95, 0.99):
            expected = t.ppf(0.5 + confidence / 2, df)
            assert t_quantile(confidence, df) == pytest.approx(expected, rel=1e-6), (df, confidence)


timing = st.lists(
    st.tuples(st.integers(1, 200), st.floats(0.01, 10), st.integers(1, 200), st.floats(0.01, 10)),
    min_size=2,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(timing, st.floats(0.1, 10))
def test_invariants(units, scale):
    tx, sx, ty, sy = (np.array(v, dtype=float) for v in zip(*units, strict=True))
    iv = speed_ratio(tx, sx, ty, sy)
    assert 0 < iv.low <= iv.estimate <= iv.high
    swapped = speed_ratio(ty, sy, tx, sx)  # y over x: the reciprocal interval
    assert swapped.estimate == pytest.approx(1 / iv.estimate)
    assert swapped.low == pytest.approx(1 / iv.high) and swapped.high == pytest.approx(1 / iv.low)
    slower = speed_ratio(tx, sx * scale, ty, sy)  # every x generation `scale` times slower
    assert slower.low == pytest.approx(iv.low / scale) and slower.high == pytest.approx(iv.high / scale)


# --- rows, tables, JSON, reports ------------------------------------------------------------------

SAMPLING = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": 8}


def record(method: str, example: str, tokens: int, seconds: float, seed: int = 0) -> dict:
    stats = GenerationStats(new_tokens=tokens, verifier_calls=tokens, total_seconds=seconds)
    return {
        "type": "record",
        "cell": Cell(method, {}, "math", seed, SAMPLING).to_dict(),
        "example": example,
        "tokens": list(range(tokens)),
        "seconds": seconds,
        "stats": stats.to_dict(),
        "error": None,
    }


def bench_records() -> list[dict]:
    """ar and sd on four prompts × two seeds; sd about 2× faster, varying by prompt."""
    out = []
    for seed in (0, 1):
        for i, (tok, ratio) in enumerate([(10, 1.8), (20, 2.2), (30, 2.0), (16, 1.9)]):
            out.append(record("ar", f"p{i}", tok, tok / 10 * (1 + 0.1 * seed), seed))
            out.append(record("sd", f"p{i}", tok, tok / 10 / ratio * (1 + 0.1 * seed), seed))
    return out


def test_rows_carry_the_speed_interval_and_tables_show_it(tmp_path, capsys):
    records = bench_records()
    rows = {(r.method, r.seed): r for r in build_rows(records)}
    sd, ar = rows["sd", 0], rows["ar", 0]
    assert ar.speedup == 1.0 and ar.speedup_ci is None  # the baseline itself
    ci = sd.speedup_ci
    assert ci["n"] == 4 and ci["low"] < sd.speedup < ci["high"] and ci["method"].startswith("jackknife")
    assert ci["estimate"] == pytest.approx(sd.speedup)
    pooled = {r.method: r for r in build_rows(records, combine_seeds=True)}["sd"]
    assert pooled.speedup_ci["n"] == 8 and pooled.speedup_ci["clusters"] == 4
    text = f"{sd.speedup:.2f}× [{ci['low']:.2f}–{ci['high']:.2f}]"
    assert f"| {text} |" in markdown_table([ar, sd]) and "| 1.00× |" in markdown_table([ar, sd])
    print_table([ar, sd], title="t")
    assert text in capsys.readouterr().out
    write_outputs(tmp_path, [ar, sd], {"version": 1, "models": {}, "sessions": []})
    saved = {r["method"]: r for r in json.loads((tmp_path / "results.json").read_text())["rows"]}
    assert saved["sd"]["speedup_ci"]["low"] == pytest.approx(ci["low"]) and saved["ar"]["speedup_ci"] is None
    assert "speedup_ci.high" in (tmp_path / "results.csv").read_text().splitlines()[0]


def test_failed_prompts_leave_the_pairs_both_sides_have(tmp_path):
    records = bench_records()
    records.append({**record("sd", "p0", 0, 0.0), "error": "boom", "tokens": []})  # supersedes p0
    sd = next(r for r in build_rows(records) if r.method == "sd" and r.seed == 0)
    assert sd.prompts == 3 and sd.speedup_ci["n"] == 3


def grid_records() -> list[dict]:
    """ar, sd, nsd and HF assisted (k=4) on four prompts × two seeds, speeds varying by prompt."""
    out = []
    speeds = {"ar": 10.0, "sd": 18.0, "nsd": 25.0, "hf-assisted": 9.0}
    for seed in (0, 1):
        for i, tok in enumerate((10, 20, 30, 16)):
            for method, speed in speeds.items():
                r = record(method, f"p{i}", tok, tok / (speed * (1 + 0.15 * ((i + seed) % 3))), seed)
                r["cell"]["params"] = {} if method == "ar" else {"k": 4}
                out.append(r)
    return out


def test_reports_and_headlines_show_speed_intervals(tmp_path):
    from relaxspec.eval.report import hf_comparisons, render_report
    from relaxspec.eval.reproduce import nsd_frontier_headline, nsd_headline
    from relaxspec.eval.results import MANIFEST, RECORDS, cell_timings

    records = grid_records()
    out = tmp_path / "r"
    out.mkdir()
    (out / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / MANIFEST).write_text(json.dumps({"version": 1, "models": {}, "sessions": []}))
    rows = {r.method: r for r in build_rows(records, combine_seeds=True)}
    times = cell_timings(records, combine_seeds=True)
    ci = rows["nsd"].speedup_ci
    text = render_report([out], tmp_path / "report.md", html=False).read_text()
    assert f"| {rows['nsd'].speedup:.2f}× [{ci['low']:.2f}–{ci['high']:.2f}] |" in text
    (hf,) = [c for c in hf_comparisons(list(rows.values()), times) if "assisted" in c["comparison"]]
    assert hf["ratio"] == pytest.approx(rows["sd"].tokens_per_second / rows["hf-assisted"].tokens_per_second)
    assert hf["ratio_ci"]["low"] < hf["ratio"] < hf["ratio_ci"]["high"] and hf["ratio_ci"]["clusters"] == 4
    assert f"| {hf['ratio']:.2f}× [{hf['ratio_ci']['low']:.2f}–{hf['ratio_ci']['high']:.2f}] |" in text
    assert hf_comparisons(list(rows.values()))[0]["ratio_ci"] is None  # without timings: no interval
    over_sd = rows["nsd"].tokens_per_second / rows["sd"].tokens_per_second
    (line,) = nsd_headline(list(rows.values()), times)
    assert f"{rows['nsd'].speedup:.2f}× [" in line and f", {over_sd:.2f}× [" in line
    (frontier,) = nsd_frontier_headline(list(rows.values()), times)
    assert frontier.startswith(f"nsd k=4: {over_sd:.2f}× [")
