"""``relaxspec tournament``: every relaxed rule beside the baselines on the same models (issue 31).

One :func:`relaxspec.eval.bench.run_bench` grid per temperature — prompts outer, cells inner and
rotated, as the bench measures — holding greedy / plain AR (``ar``), plain top-p AR sampling
(``ar top-p``, temperature > 0 only: at T = 0 it is greedy AR), exact SD (``sd``) and each
relaxed rule over a grid of its parameter. When sampling, every row but ``ar`` samples at the
tournament's top-p, so exact SD is lossless against top-p AR (its baseline) and each relaxed rule
relaxes the distribution a user would sample anyway; ``ar`` (untruncated) is the reference that
shows what top-p itself buys. From the records it derives, per (dataset,
temperature), each row's speed-up over AR with a paired bootstrap interval (prompts resampled;
total tokens over total seconds in each resample), its quality with the bench's interval, its
paired Δ quality against AR and against top-p AR, the Pareto set on (speed-up, quality), and a
verdict: the fastest rule with no measurable quality loss (the paired Δ interval vs AR reaches 0)
and, per rule, the first grid point where the loss becomes measurable. When sampling, each row's
law check (:mod:`relaxspec.eval.calibration`): how much more often than the target's law it emits
the target's top token. Written to ``<out>/tournament.{json,md}`` and ``<out>/frontier.png``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from relaxspec.errors import RelaxSpecError
from relaxspec.eval import intervals
from relaxspec.eval.bench import BenchConfig, plan, run_bench
from relaxspec.eval.calibration import calibrate
from relaxspec.eval.datasets import title
from relaxspec.eval.records import ResultsStore
from relaxspec.eval.rows import Cell, latest_records

# The swept parameter of each rule and its grid (the presets' other parameters stay at default).
RULE_GRID: dict[str, tuple[str, list[Any]]] = {
    "nsd": ("theta", [0.8, 0.95]),
    "topk": ("accept_k", [2, 4]),
    "typical": ("epsilon", [0.09, 0.3]),
    "lenience": ("ell", [0.5, 0.8]),
    "topk-delta": ("delta", [0.05, 0.2, 0.5]),
    "threshold": ("single", [0.3, 0.6]),
    "fly": ("entropy_threshold", [0.1, 0.5]),
}
TOP_P_AR = "ar top-p"  # the label of the plain top-p AR row


@dataclass
class TournamentConfig:
    datasets: list[str]
    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    rules: list[str] = field(default_factory=lambda: list(RULE_GRID))
    limit: int = 20
    seeds: list[int] = field(default_factory=lambda: [0])
    k: int = 4
    top_p: float = 0.95
    max_new_tokens: int = 128
    models: dict[str, str | None] = field(default_factory=dict)
    out: str = "results/tournament"
    progress: bool = True
    command: str = ""
    # Replaces a rule's grid of its swept parameter, e.g. {"nsd": [0.8]} (``--grid nsd.theta=0.8``).
    grid: dict[str, list[Any]] = field(default_factory=dict)


def parse_grid(specs: Sequence[str]) -> dict[str, list[Any]]:
    """``["nsd.theta=0.8,0.9"]`` → ``{"nsd": [0.8, 0.9]}``; only a rule's swept parameter may be set."""
    grid: dict[str, list[Any]] = {}
    for spec in specs:
        head, sep, values = spec.partition("=")
        rule, dot, name = head.strip().partition(".")
        if not (sep and dot and values.strip()):
            raise RelaxSpecError(f"--grid expects RULE.PARAM=V1,V2,..., got {spec!r}")
        if rule not in RULE_GRID:
            raise RelaxSpecError(f"--grid: unknown rule {rule!r}; tournament rules: {', '.join(RULE_GRID)}")
        swept = RULE_GRID[rule][0]
        if name != swept:
            raise RelaxSpecError(f"--grid: {rule} sweeps {swept!r}, not {name!r}")
        try:
            grid[rule] = [json.loads(v) for v in values.split(",")]
        except json.JSONDecodeError:
            raise RelaxSpecError(f"--grid: {spec!r} holds a value that is not a number") from None
    return grid


def rule_grid(config: TournamentConfig, rule: str) -> tuple[str, list[Any]]:
    name, values = RULE_GRID[rule]
    return name, config.grid.get(rule, values)


def bench_config(config: TournamentConfig, temperature: float) -> BenchConfig:
    """The bench grid of one temperature: sd and every rule over its grid, all at draft length k."""
    unknown = [r for r in config.rules if r not in RULE_GRID]
    if unknown:
        raise RelaxSpecError(
            f"unknown rule(s) {', '.join(unknown)}; tournament rules: {', '.join(RULE_GRID)}"
        )
    stray = [r for r in config.grid if r not in config.rules]
    if stray:
        raise RelaxSpecError(f"--grid names rule(s) not in --rules: {', '.join(stray)}")
    sets = []
    for rule in config.rules:
        name, values = rule_grid(config, rule)
        sets.append(f"{rule}.{name}={','.join(map(str, values))}")
    return BenchConfig(
        methods=["sd", *config.rules],
        datasets=config.datasets,
        limit=config.limit,
        temperature=temperature,
        top_p=config.top_p if temperature > 0 else 1.0,
        seeds=config.seeds,
        max_new_tokens=config.max_new_tokens,
        sets=[*sets, f"k={config.k}"],
        peers=[],
        models=config.models,
        out=str(Path(config.out) / f"T{temperature:g}"),
        progress=config.progress,
        command=config.command,
    )


def untruncated_ar_cells(cells: Sequence[Cell]) -> list[Cell]:
    """Plain AR without top-p beside every sampling top-p ``ar`` cell (same dataset and seed)."""
    return [
        Cell("ar", {}, c.dataset, c.seed, {**c.sampling, "top_p": 1.0})
        for c in cells
        if c.method == "ar" and c.sampling["temperature"] > 0 and c.sampling["top_p"] < 1.0
    ]


def run_tournament(config: TournamentConfig) -> dict[str, Any]:
    """Run (or resume) every temperature's grid, then write the analysis (module docstring)."""
    if not 0.0 < config.top_p <= 1.0:
        raise RelaxSpecError(f"--top-p must be in (0, 1], got {config.top_p!r}")
    benches = [bench_config(config, t) for t in config.temperatures]
    for bench in benches:
        plan(bench)  # every grid validated before the first model loads
    results = []
    for bench in benches:
        run_bench(bench, extra_cells=untruncated_ar_cells(plan(bench)))
        groups = analyse(ResultsStore(bench.out).records)
        if bench.temperature > 0:  # does each row sample the target's law? (eval/calibration.py)
            attach_law(groups, calibrate(bench.out, progress=config.progress))
        results += groups
    return write_tournament(Path(config.out), results, config)


LAW_FIELDS = (
    "positions", "argmax_excess", "z_argmax", "p_argmax", "mass_excess", "z_mass", "p_mass",
    "outside_support", "verdict",
)  # fmt: skip


def attach_law(groups: Sequence[dict[str, Any]], laws: Sequence[dict[str, Any]]) -> None:
    """Give each sampling row of ``groups`` its calibration figures (``row["law"]``) from the rows
    :func:`relaxspec.eval.calibration.calibrate` returned for the same bench run."""
    by_name = {
        (
            law["dataset"],
            float(law["sampling"]["temperature"]),
            row_name(Cell.from_dict({**law, "seed": 0})),
        ): law
        for law in laws
    }
    for group in groups:
        for row in group["rows"]:
            law = by_name.get((group["dataset"], float(group["temperature"]), row["name"]))
            row["law"] = {k: law[k] for k in LAW_FIELDS} if law else None


# ---------------------------------------------------------------------------------------------
# Analysis (pure: records in, figures out)


def row_name(cell: Cell) -> str:
    """``ar``, ``ar top-p``, ``sd``, or ``rule name=value`` for the swept parameter."""
    if cell.method == "ar":
        return TOP_P_AR if cell.sampling["top_p"] < 1.0 else "ar"
    if cell.method in RULE_GRID:
        name = RULE_GRID[cell.method][0]
        return f"{cell.method} {name}={cell.params.get(name)}"
    return cell.method


def speedup_interval(row: dict[str, tuple[int, float]], base: dict[str, tuple[int, float]]) -> dict[str, Any]:
    """Speed-up ``(Σtok/Σsec) / (Σtok_AR/Σsec_AR)`` on the prompts both ran, with a 95 % percentile
    bootstrap interval over prompts (paired: a resample takes a prompt's row and AR timings together).

    row, base: ``{outcome key: (new tokens, seconds)}``.
    """
    keys = sorted(set(row) & set(base))
    if not keys:
        return {"estimate": None, "low": None, "high": None, "n": 0}
    a = np.array([row[k] for k in keys], dtype=float)
    b = np.array([base[k] for k in keys], dtype=float)

    def ratio(idx: np.ndarray) -> np.ndarray:
        sums_a, sums_b = a[idx].sum(-2), b[idx].sum(-2)  # [..., 2]: tokens, seconds
        return (sums_a[..., 0] / sums_a[..., 1]) / (sums_b[..., 0] / sums_b[..., 1])

    rng = np.random.default_rng(intervals.SEED)
    draws = ratio(rng.integers(0, len(keys), size=(intervals.RESAMPLES, len(keys))))
    low, high = np.percentile(draws, [2.5, 97.5])
    return {
        "estimate": float(ratio(np.arange(len(keys)))),
        "low": float(low),
        "high": float(high),
        "n": len(keys),
    }


def paired_quality(row: dict[str, float], base: dict[str, float]) -> dict[str, Any] | None:
    """Paired Δ quality (row − base) on their common outcomes (:func:`intervals.paired_comparison`)."""
    keys, x, y = intervals.pair_by_key(row, base)
    return intervals.paired_comparison(x, y, _prompts(keys)).to_dict() if keys else None


def _prompts(keys: Sequence[str]) -> list[str]:
    """The prompt of each ``example#seed`` outcome: the seeds of one prompt are one cluster."""
    return [k.rsplit("#", 1)[0] for k in keys]


def _outcomes(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per cell key: its cell, timings and quality per (example, seed) outcome."""
    out: dict[str, dict[str, Any]] = {}
    for r in latest_records(records).values():
        if r.get("error"):
            continue
        cell = Cell.from_dict(r["cell"])
        entry = out.setdefault(cell.key, {"cell": cell, "timing": {}, "quality": {}, "calls": {}})
        key = f"{r['example']}#{cell.seed}"
        entry["timing"][key] = (len(r["tokens"]), float(r["seconds"]))
        stats = r.get("stats") or {}
        if stats.get("verifier_calls"):
            entry["calls"][key] = (int(stats["new_tokens"]), int(stats["verifier_calls"]))
        if r.get("quality") is not None:
            entry["quality"][key] = float(r["quality"])
    return out


def analyse(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per (dataset, temperature) group of the records: rows, Pareto set and verdict."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for entry in _outcomes(records).values():
        c = entry["cell"]
        groups.setdefault((c.dataset, c.sampling["temperature"]), []).append(entry)
    return [_group(dataset, t, entries) for (dataset, t), entries in sorted(groups.items())]


def _group(dataset: str, temperature: float, entries: list[dict[str, Any]]) -> dict[str, Any]:
    named: dict[str, dict[str, Any]] = {}
    for e in entries:  # the seeds of one row pool (outcome keys are example#seed)
        empty: dict[str, Any] = {"cell": e["cell"], "timing": {}, "quality": {}, "calls": {}}
        row = named.setdefault(row_name(e["cell"]), empty)
        for part in ("timing", "quality", "calls"):
            row[part].update(e[part])
    ar, top_p_ar, sd = named.get("ar"), named.get(TOP_P_AR), named.get("sd")
    rows = []
    for name, e in named.items():
        q = e["quality"]
        rows.append(
            {
                "name": name,
                "method": e["cell"].method,
                "params": e["cell"].params,
                "speedup": speedup_interval(e["timing"], ar["timing"]) if ar else None,
                "vs_sd_speed": speedup_interval(e["timing"], sd["timing"]) if sd and e is not sd else None,
                "tau": tau(e["calls"]) if e["cell"].method != "ar" else None,
                "quality": intervals.mean_interval(list(q.values()), _prompts(list(q))).to_dict()
                if q
                else None,
                "vs_ar": paired_quality(e["quality"], ar["quality"]) if ar and e is not ar else None,
                "vs_top_p_ar": paired_quality(e["quality"], top_p_ar["quality"])
                if top_p_ar and e is not top_p_ar
                else None,
            }
        )
    pareto = pareto_set(rows)
    for row in rows:
        row["pareto"] = row["name"] in pareto
    group = {"dataset": dataset, "temperature": temperature, "rows": rows}
    return {**group, "verdict": verdict(rows, baseline_of(group))}


def tau(calls: dict[str, tuple[int, int]]) -> float | None:
    """Pooled τ: new tokens per target (verifier) forward, Σ tokens / Σ calls over the outcomes."""
    calls_total = sum(c for _, c in calls.values())
    return sum(t for t, _ in calls.values()) / calls_total if calls_total else None


def _point(row: dict[str, Any]) -> tuple[float, float] | None:
    s, q = row["speedup"], row["quality"]
    if not s or s["estimate"] is None or not q:
        return None
    return s["estimate"], q["estimate"]


def pareto_set(rows: Sequence[dict[str, Any]]) -> set[str]:
    """Rows no other row beats on both speed-up and quality (point estimates; ≥ on both, > on one)."""
    points = {r["name"]: p for r in rows if (p := _point(r)) is not None}

    def dominated(p: tuple[float, float]) -> bool:
        return any(o[0] >= p[0] and o[1] >= p[1] and o != p for o in points.values())

    return {name for name, p in points.items() if not dominated(p)}


def measurable_loss(row: dict[str, Any], delta_key: str = "vs_ar") -> bool:
    """The paired Δ quality against the baseline (``delta_key``) lies entirely below 0."""
    vs = row.get(delta_key)
    return bool(vs) and vs["high"] < 0


def verdict(rows: Sequence[dict[str, Any]], baseline: tuple[str, str] = ("ar", "vs_ar")) -> dict[str, Any]:
    """The fastest relaxed rule with no measurable loss against the baseline (its row name and Δ
    key, :func:`baseline_of`: AR greedy, top-p AR when sampling), and where each rule's loss shows."""
    name, delta_key = baseline
    relaxed = [r for r in rows if r["method"] in RULE_GRID and _point(r) is not None]
    safe = [r for r in relaxed if r[delta_key] is not None and not measurable_loss(r, delta_key)]
    best = max(safe, key=lambda r: r["speedup"]["estimate"], default=None)
    fails = {}
    for method in dict.fromkeys(r["method"] for r in relaxed):
        losing = [r["name"] for r in relaxed if r["method"] == method and measurable_loss(r, delta_key)]
        fails[method] = losing[0] if losing else None
    return {"best": best["name"] if best else None, "fails_at": fails, "baseline": name}


# The quality a relaxed rule may cost against its lossless baseline and still "pay" (issue 29).
QUALITY_MARGIN = 0.03


def baseline_of(group: dict[str, Any]) -> tuple[str, str]:
    """The row a relaxed rule must match: greedy AR at T = 0, plain top-p AR when sampling."""
    names = {r["name"] for r in group["rows"]}
    if group["temperature"] > 0 and TOP_P_AR in names:
        return TOP_P_AR, "vs_top_p_ar"
    return "ar", "vs_ar"


def judge(row: dict[str, Any], delta_key: str) -> str:
    """One relaxed row against exact SD (speed) and the baseline (paired Δ quality):
    ``pays`` (faster than SD, interval above 1, and Δ's lower bound ≥ −QUALITY_MARGIN),
    ``costs quality`` (Δ's interval below 0), ``no faster`` (speed interval reaches 1), or
    ``unsettled`` (faster, but the Δ interval reaches below −QUALITY_MARGIN: more prompts)."""
    speed, delta = row.get("vs_sd_speed"), row.get(delta_key)
    if not speed or speed.get("estimate") is None or not delta:
        return "unmeasured"
    if delta["high"] < 0:
        return "costs quality"
    if speed["low"] <= 1.0:
        return "no faster"
    return "pays" if delta["low"] >= -QUALITY_MARGIN else "unsettled"


VERDICT_WORDS = {
    "pays": "PAYS",
    "costs quality": "costs quality",
    "no faster": "no faster than exact SD",
    "unsettled": "faster, quality not settled (run more prompts)",
    "unmeasured": "not measured",
}


def _speed_text(sp: dict[str, Any] | None) -> str:
    if not sp or sp.get("estimate") is None:
        return "–"
    return f"{sp['estimate']:.2f}× exact SD [{sp['low']:.2f}–{sp['high']:.2f}]"


def _delta_text(d: dict[str, Any] | None) -> str:
    return f"{d['delta']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]" if d else "–"


def _law_text(law: dict[str, Any] | None) -> str:
    """The calibration of a sampling row: how much more often than the target's law it emits the
    target's top token (percentage points per token), its z and verdict."""
    if not law or law.get("z_argmax") is None:
        return "–"
    smallest = min(p for p in (law["p_argmax"], law["p_mass"]) if p is not None)
    word = "departs" if law["verdict"] == "departs" else "not decisive" if smallest < 0.05 else "within noise"
    return f"top token {100 * law['argmax_excess']:+.2f} pp (z {law['z_argmax']:+.1f}, {word})"


def summary(results: Sequence[dict[str, Any]]) -> list[str]:
    """Plain lines, one per relaxed row and a recommendation per (dataset, temperature)."""
    lines = []
    for g in results:
        base_name, delta_key = baseline_of(g)
        t = g["temperature"]
        where = f"{title(g['dataset'])}, " + ("greedy" if t == 0 else f"T = {t:g}")
        sd = next((r for r in g["rows"] if r["name"] == "sd"), None)
        sd_tau = f"{sd['tau']:.2f}" if sd and sd.get("tau") else "–"
        paying = []
        for r in (r for r in g["rows"] if r["method"] in RULE_GRID):
            word = judge(r, delta_key)
            paying += [r] if word == "pays" else []
            tau_text = f"τ {r['tau']:.2f} vs {sd_tau}" if r.get("tau") else "τ –"
            law = f"; vs the target's law: {_law_text(r['law'])}" if r.get("law") else ""
            lines.append(
                f"{where}: {r['name']} runs {_speed_text(r.get('vs_sd_speed'))} ({tau_text}); "
                f"quality vs {base_name} {_delta_text(r.get(delta_key))}{law} -> {VERDICT_WORDS[word]}"
            )
        best = max(paying, key=lambda r: r["vs_sd_speed"]["estimate"], default=None)
        if best:
            speed = best["vs_sd_speed"]["estimate"]
            advice = f"use {best['name']} ({speed:.2f}× exact SD, no measurable quality cost)"
        else:
            advice = "keep exact SD (lossless): no relaxed rule here is both faster and as good"
        lines.append(f"  => {where}: {advice}")
    return lines


# ---------------------------------------------------------------------------------------------
# Outputs


def _iv(x: dict[str, Any] | None, key: str = "estimate", digits: int = 2) -> str:
    if not x or x.get(key) is None:
        return "–"
    return f"{x[key]:.{digits}f} [{x['low']:.{digits}f}–{x['high']:.{digits}f}]"


def _delta(x: dict[str, Any] | None) -> str:
    return "–" if not x else f"{x['delta']:+.2f} [{x['low']:+.2f}, {x['high']:+.2f}]"


def markdown(results: Sequence[dict[str, Any]], command: str) -> str:
    lines = ["# Tournament: every relaxed rule beside AR, top-p AR and exact SD", "", f"`{command}`", ""]
    for g in results:
        lines += [
            f"## {g['dataset']}, T = {g['temperature']:g}",
            "",
            "| row | speed-up vs AR | × exact SD | τ | quality | Δ vs AR | Δ vs top-p AR | Pareto "
            "| law check |",
            "|---|---:|---:|---:|---:|---:|---:|:-:|---|",
        ]
        for r in g["rows"]:
            q = r["quality"]
            lines.append(
                f"| {r['name']} | {_iv(r['speedup'])} | {_iv(r.get('vs_sd_speed'))} | "
                f"{'–' if r.get('tau') is None else format(r['tau'], '.2f')} | "
                f"{_iv(q)} (n={q['n'] if q else 0}) | "
                f"{_delta(r['vs_ar'])} | {_delta(r['vs_top_p_ar'])} | {'✓' if r['pareto'] else ''} | "
                f"{_law_text(r.get('law'))} |"
            )
        v = g["verdict"]
        fails = "; ".join(f"{m}: {'measurable loss at ' + n if n else 'no measurable loss on the grid'}"
                          for m, n in v["fails_at"].items())  # fmt: skip
        lines += [
            "",
            f"Verdict: fastest rule with no measurable loss vs {v['baseline']}: **{v['best'] or 'none'}**."
            + (f" {fails}." if fails else ""),
            "",
        ]
    lines += ["## In short", "", *(f"- {x.strip().removeprefix('=> ')}" for x in summary(results)), ""]
    return "\n".join(lines)


def plot(results: Sequence[dict[str, Any]], path: Path) -> None:
    """Speed-up over AR (x) against quality (y), both with 95 % intervals; Pareto set in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(len(results), 1), figsize=(6 * max(len(results), 1), 5), squeeze=False)
    for ax, g in zip(axes[0], results, strict=False):
        for i, r in enumerate(g["rows"]):
            if _point(r) is None:
                continue
            s, q = r["speedup"], r["quality"]
            color = "tab:red" if r["pareto"] else ("black" if r["method"] in ("ar", "sd") else "tab:blue")
            ax.errorbar(
                s["estimate"],
                q["estimate"],
                xerr=[[s["estimate"] - s["low"]], [s["high"] - s["estimate"]]],
                yerr=[[q["estimate"] - q["low"]], [q["high"] - q["estimate"]]],
                fmt="o",
                color=color,
                capsize=2,
                ms=4,
            )
            ax.annotate(
                r["name"],
                (s["estimate"], q["estimate"]),
                fontsize=6,
                xytext=(3, 3 + 9 * (i % 6)),  # staggered: rows often tie on quality
                textcoords="offset points",
            )
        ax.set_title(f"{g['dataset']}, T = {g['temperature']:g}")
        ax.set_xlabel("speed-up over AR (95 % interval)")
        ax.set_ylabel("quality (95 % interval); red: Pareto set")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_tournament(out: Path, results: list[dict[str, Any]], config: TournamentConfig) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"command": config.command, "top_p": config.top_p, "groups": results}
    for name, text in (
        ("tournament.json", json.dumps(doc, indent=1)),
        ("tournament.md", markdown(results, config.command)),
    ):
        tmp = out / (name + ".tmp")
        tmp.write_text(text)
        tmp.replace(out / name)
    plot(results, out / "frontier.png")
    print(markdown(results, config.command).split("## In short")[0].rstrip())
    print(f"\nwrote {out}/tournament.md, tournament.json, frontier.png\n\nIn short:")
    print("\n".join(summary(results)))
    return doc
