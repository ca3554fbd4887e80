"""``relaxspec tournament``: its analysis on hand-made records, and one tiny end-to-end run."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from relaxspec.errors import RelaxSpecError
from relaxspec.eval.records import ResultsStore
from relaxspec.eval.results import Cell
from relaxspec.eval.tournament import (
    TOP_P_AR,
    TournamentConfig,
    analyse,
    bench_config,
    pareto_set,
    row_name,
    run_tournament,
    speedup_interval,
    untruncated_ar_cells,
    verdict,
)


def test_speedup_is_a_ratio_of_totals_with_a_paired_interval():
    ar = {f"p{i}#0": (10, 1.0 + 0.1 * i) for i in range(20)}
    fast = {k: (t, s / 2) for k, (t, s) in ar.items()}  # twice as fast on every prompt
    iv = speedup_interval(fast, ar)
    assert iv["estimate"] == pytest.approx(2.0) and iv["low"] == pytest.approx(2.0) and iv["n"] == 20
    noisy = {k: (t, s * (0.4 if i % 2 else 0.6)) for i, (k, (t, s)) in enumerate(ar.items())}
    iv = speedup_interval(noisy, ar)
    assert iv["low"] < iv["estimate"] < iv["high"]
    assert speedup_interval({}, ar)["estimate"] is None


def row(name, method, speed, quality, vs_high=0.1):
    return {
        "name": name,
        "method": method,
        "speedup": {"estimate": speed, "low": speed, "high": speed},
        "quality": {"estimate": quality, "low": quality, "high": quality, "n": 10},
        "vs_ar": {"delta": quality - 0.8, "low": -0.3, "high": vs_high},
    }


def test_pareto_set_and_verdict():
    rows = [
        {**row("ar", "ar", 1.0, 0.8), "vs_ar": None},
        row("sd", "sd", 1.5, 0.8),
        row("fly entropy_threshold=0.5", "fly", 1.7, 0.8),
        row("fly entropy_threshold=0.1", "fly", 2.2, 0.5, vs_high=-0.05),  # measurable loss
        row("threshold single=0.6", "threshold", 1.6, 0.75),  # dominated by fly 0.5
    ]
    assert pareto_set(rows) == {"fly entropy_threshold=0.5", "fly entropy_threshold=0.1"}
    v = verdict(rows)
    assert v["best"] == "fly entropy_threshold=0.5"
    assert v["fails_at"] == {"fly": "fly entropy_threshold=0.1", "threshold": None}


def test_rows_are_named_by_their_swept_parameter():
    s = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": 8}
    assert row_name(Cell("ar", {}, "math", 0, s)) == "ar"
    assert row_name(Cell("ar", {}, "math", 0, {**s, "top_p": 0.95})) == TOP_P_AR
    assert (
        row_name(Cell("fly", {"k": 4, "entropy_threshold": 0.1}, "math", 0, s)) == "fly entropy_threshold=0.1"
    )


def test_analysis_of_records_pairs_with_ar_and_top_p_ar():
    s = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": 8}
    cells = [
        Cell("ar", {}, "d", 0, s),
        Cell("ar", {}, "d", 0, {**s, "top_p": 0.9}),
        Cell("threshold", {"k": 4, "single": 0.3, "acc": 1.0}, "d", 0, s),
    ]
    records = []
    for i in range(12):  # two seeds of each cell: their outcomes pool into one row
        for c, seconds, q in zip(cells, (1.0, 1.0, 0.5), (1.0, 1.0, float(i % 2)), strict=True):
            c = replace(c, seed=i % 2)
            records.append(
                {"type": "record", "cell": c.to_dict(), "example": f"e{i}", "tokens": [1] * 10,
                 "seconds": seconds, "quality": q, "error": None}
            )  # fmt: skip
    (group,) = analyse(records)
    rows = {r["name"]: r for r in group["rows"]}
    assert set(rows) == {"ar", TOP_P_AR, "threshold single=0.3"}
    assert rows["ar"]["quality"]["n"] == 12
    relaxed = rows["threshold single=0.3"]
    assert relaxed["speedup"]["estimate"] == pytest.approx(2.0)
    assert relaxed["vs_ar"]["delta"] == pytest.approx(-0.5) and relaxed["vs_top_p_ar"][
        "delta"
    ] == pytest.approx(-0.5)
    assert relaxed["vs_ar"]["high"] < 0 and group["verdict"]["fails_at"] == {
        "threshold": "threshold single=0.3"
    }
    assert group["verdict"]["baseline"] == TOP_P_AR  # sampling: judged against top-p AR


def test_verdict_judges_against_the_baseline_it_is_given():
    """When sampling, a rule as good as untruncated AR but below top-p AR has a measurable loss."""
    ok, loss = {"delta": 0.0, "low": -0.05, "high": 0.05}, {"delta": -0.2, "low": -0.3, "high": -0.1}
    row = {"name": "nsd theta=0.8", "method": "nsd", "speedup": {"estimate": 1.5},
           "quality": {"estimate": 0.5}, "vs_ar": ok, "vs_top_p_ar": loss}  # fmt: skip
    assert verdict([row])["best"] == "nsd theta=0.8"
    v = verdict([row], (TOP_P_AR, "vs_top_p_ar"))
    assert v["best"] is None and v["fails_at"] == {"nsd": "nsd theta=0.8"} and v["baseline"] == TOP_P_AR


def test_bad_input():
    with pytest.raises(RelaxSpecError, match="unknown rule"):
        bench_config(TournamentConfig(datasets=["math"], rules=["bogus"]), 0.0)
    with pytest.raises(RelaxSpecError, match="top-p"):
        run_tournament(TournamentConfig(datasets=["math"], top_p=0.0))


def test_tiny_tournament_end_to_end(model_dirs, tmp_path):
    target, draft = model_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "prompt": p, "answer": 3}) + "\n"
            for i, p in enumerate(["w1 w2", "w3"])
        )
    )
    out = tmp_path / "t"
    config = TournamentConfig(
        datasets=[str(prompts)],
        temperatures=[0.0, 1.0],
        rules=["threshold", "fly"],
        limit=2,
        k=2,
        max_new_tokens=4,
        models={"target": str(target), "draft": str(draft)},
        out=str(out),
        progress=False,
        command="relaxspec tournament ...",
    )
    doc = run_tournament(config)
    assert [g["temperature"] for g in doc["groups"]] == [0.0, 1.0]
    greedy, sampled = ({r["name"] for r in g["rows"]} for g in doc["groups"])
    rules = {
        "sd",
        "threshold single=0.3",
        "threshold single=0.6",
        "fly entropy_threshold=0.1",
        "fly entropy_threshold=0.5",
    }
    assert greedy == {"ar", *rules} and sampled == {"ar", TOP_P_AR, *rules}
    # sampling: every row but the untruncated reference samples at the tournament's top-p
    records = [r for r in ResultsStore(out / "T1").records if r.get("type") == "record"]
    by_row = {row_name(Cell.from_dict(r["cell"])): r["cell"]["sampling"]["top_p"] for r in records}
    assert by_row.pop("ar") == 1.0 and set(by_row.values()) == {config.top_p}
    for name in ("tournament.json", "tournament.md", "frontier.png"):
        assert (out / name).is_file()
    md = (out / "tournament.md").read_text()
    assert "Verdict" in md and "## In short" in md and "× exact SD" in md
    rows = {r["name"]: r for r in doc["groups"][0]["rows"]}
    assert rows["sd"]["tau"] >= 1.0 and rows["ar"]["tau"] is None
    assert rows["threshold single=0.3"]["vs_sd_speed"]["n"] == 2
    # sampling rows carry the law check of eval/calibration.py; greedy ones do not
    assert all("law" not in r for r in doc["groups"][0]["rows"])
    laws = {r["name"]: r["law"] for r in doc["groups"][1]["rows"]}
    assert set(laws) == {"ar", TOP_P_AR, *rules} and all(law["positions"] > 0 for law in laws.values())
    assert laws["sd"]["outside_support"] == 0 and "law check" in md and "top token" in md


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rules", "nsd,bogus"], "unknown rule(s) bogus"),
        (["--temperatures", "0,hot"], "--temperatures expects comma-separated numbers"),
        (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["--temperatures", "-1"], "temperature"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, message, monkeypatch, capsys, tmp_path):
    from relaxspec import cli

    monkeypatch.setattr("sys.argv", ["relaxspec", "tournament", *args, "--out", str(tmp_path / "t")])
    with pytest.raises(SystemExit) as done:
        cli.main()
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith("error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_grid_override_parses_and_validates():
    from relaxspec.eval.tournament import parse_grid

    assert parse_grid(["nsd.theta=0.8", "topk.accept_k=2,3"]) == {"nsd": [0.8], "topk": [2, 3]}
    config = TournamentConfig(datasets=["math"], rules=["nsd"], grid={"nsd": [0.8]})
    assert "nsd.theta=0.8" in bench_config(config, 0.0).sets
    for bad, message in [
        ("nsd.theta", "RULE.PARAM="),
        ("nsd=0.8", "RULE.PARAM="),
        ("bogus.x=1", "unknown rule"),
        ("nsd.k=2", "sweeps 'theta'"),
        ("nsd.theta=high", "not a number"),
    ]:
        with pytest.raises(RelaxSpecError, match=message):
            parse_grid([bad])
    with pytest.raises(RelaxSpecError, match="not in --rules"):
        bench_config(TournamentConfig(datasets=["math"], rules=["fly"], grid={"nsd": [0.8]}), 0.0)


def judged(speed_low, speed, delta_low, delta_high):
    from relaxspec.eval.tournament import judge

    r = {"vs_sd_speed": {"estimate": speed, "low": speed_low, "high": speed + 0.1},
         "vs_ar": {"delta": (delta_low + delta_high) / 2, "low": delta_low, "high": delta_high}}  # fmt: skip
    return judge(r, "vs_ar")


def test_judge_needs_speed_above_one_and_quality_within_the_margin():
    assert judged(1.10, 1.2, -0.02, 0.02) == "pays"
    assert judged(1.10, 1.2, -0.10, -0.01) == "costs quality"  # Δ interval entirely below 0
    assert judged(0.98, 1.02, -0.01, 0.01) == "no faster"  # speed interval reaches 1
    assert judged(1.10, 1.2, -0.08, 0.02) == "unsettled"  # a loss > 0.03 not ruled out
    assert judged(1.10, 1.2, -0.03, 0.0) == "pays"  # the margin's edge is inside


def test_summary_recommends_the_fastest_paying_rule_against_the_regime_baseline():
    from relaxspec.eval.tournament import summary, tau

    assert tau({"a#0": (9, 3), "b#0": (3, 3)}) == pytest.approx(2.0) and tau({}) is None

    def r(name, method, speed, d_low, d_high, key):
        return {"name": name, "method": method, "tau": 3.0,
                "vs_sd_speed": {"estimate": speed, "low": speed - 0.05, "high": speed + 0.05},
                key: {"delta": (d_low + d_high) / 2, "low": d_low, "high": d_high}}  # fmt: skip

    sampled = {
        "dataset": "tasks.jsonl",
        "temperature": 1.0,
        "rows": [
            {"name": "ar", "method": "ar"},
            {"name": TOP_P_AR, "method": "ar"},
            {"name": "sd", "method": "sd", "tau": 2.5},
            r("nsd theta=0.8", "nsd", 1.25, -0.02, 0.04, "vs_top_p_ar"),
            r("nsd theta=0.95", "nsd", 1.40, -0.20, -0.05, "vs_top_p_ar"),  # faster, but loses
        ],
    }
    lines = summary([sampled])
    assert "nsd theta=0.95" in lines[1] and "costs quality" in lines[1]
    assert "quality vs ar top-p" in lines[0] and "PAYS" in lines[0] and "τ 3.00 vs 2.50" in lines[0]
    advice = "use nsd theta=0.8 (1.25× exact SD, no measurable quality cost)"
    assert lines[-1].strip() == f"=> tasks.jsonl, T = 1: {advice}"
    greedy = {**sampled, "temperature": 0.0, "rows": [sampled["rows"][0], sampled["rows"][2],
              r("nsd theta=0.8", "nsd", 1.02, -0.01, 0.01, "vs_ar")]}  # fmt: skip
    assert "keep exact SD" in summary([greedy])[-1] and "no faster" in summary([greedy])[0]


def test_every_bundled_dataset_has_a_title():
    from relaxspec.eval.datasets import DATASETS, TITLES, title

    assert set(TITLES) == set(DATASETS)
    assert title("mathvar") == "held-out math word problems (mathvar)" and title("x.jsonl") == "x.jsonl"


def test_cells_differing_only_in_top_p_get_their_own_runner(monkeypatch):
    """Regression: runners were keyed by (method, params), so the tournament's top-p AR row ran
    the plain-AR runner (top-p never applied; identical text on every prompt)."""
    from relaxspec.eval import bench
    from relaxspec.eval.datasets import Example

    built = []

    def fake_runner(cell, models, collect, pool=None):
        built.append(cell.sampling["top_p"])
        return lambda ex, seed, max_new_tokens=None: {"text": str(cell.sampling["top_p"])}

    monkeypatch.setattr(bench, "make_runner", fake_runner)
    s = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": 8}
    top_p_ar = Cell("ar", {}, "d", 0, {**s, "top_p": 0.9})
    cells = [top_p_ar, *untruncated_ar_cells([top_p_ar])]
    config = bench.BenchConfig(methods=["ar"], datasets=["d"])
    runners, broken = bench.warm_up(cells, None, {"d": [Example("e", "w1")]}, config)
    assert not broken and sorted(built) == [0.9, 1.0]
    assert [runners[c.runner_key](None, 0)["text"] for c in cells] == ["0.9", "1.0"]


def test_law_text_words_the_calibration():
    from relaxspec.eval.tournament import _law_text

    law = {"argmax_excess": 0.0113, "z_argmax": 5.1, "p_argmax": 3e-7, "p_mass": 3e-6, "verdict": "departs"}
    assert _law_text(law) == "top token +1.13 pp (z +5.1, departs)"
    law.update(z_argmax=-2.7, p_argmax=0.007, p_mass=0.2, verdict="consistent", argmax_excess=-0.0061)
    assert _law_text(law) == "top token -0.61 pp (z -2.7, not decisive)"
    law.update(p_argmax=0.3)
    assert "within noise" in _law_text(law) and _law_text(None) == "–"
