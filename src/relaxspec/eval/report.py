"""``relaxspec report``: Markdown (and HTML) with matplotlib plots from benchmark results.

Everything is recomputed from the results directories' records (:func:`relaxspec.eval.bench.build_rows`),
so a report always agrees with the records it was made from. Per dataset and temperature:

- a table with the seeds pooled (throughput = total tokens / total seconds over all seeds; the
  per-seed speedups' range next to it);
- ours vs Hugging Face: our ``ar`` against ``generate()``, our ``sd`` against assisted generation
  with the same draft length (the project's goal: ours ≥ 1.5× HF assisted generation);
- plots: the speed–quality frontier per method family, quality against verifier calls per token
  (the VS frontier; NSD §4.4's calls per token), τ per runner, per-position acceptance, and a
  sweep plot for every parameter a method was run at more than one value (θ, K, k_min, …);
- the diagnostics collected with ``bench --diagnostics`` (NSD rejected-token analysis, gate AUCs,
  ProVe prefixes, and any registered by other methods) as tables.
"""

from __future__ import annotations

import html as html_lib
import math
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from relaxspec import atomic
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.results import (
    ALL_SEEDS,
    COLUMNS,
    QUALITY_NOTE,
    Row,
    Timings,
    build_rows,
    cell_timings,
    dataset_name,
    format_speedup,
    load_manifest,
    load_records,
    markdown_table,
    speed_between,
)

FAMILY_STYLE = {  # colour, marker
    "autoregressive": ("black", "s"),
    "draft model": ("tab:blue", "o"),
    "block proposer": ("tab:green", "^"),
    "diffusion drafter": ("tab:purple", "D"),
    "hugging face": ("tab:orange", "x"),
    "unregistered": ("tab:red", "v"),
}
HF_GOAL = 1.5  # ours >= 1.5x HF assisted generation (issue 6)


# ---------------------------------------------------------------------------------------------
# Loading and grouping


def load_results(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(records, manifest) of one results directory; clear errors for missing or corrupt files."""
    p = Path(path)
    if not p.is_dir():
        raise RelaxSpecError(f"results directory not found: {p}")
    return load_records(p), load_manifest(p)


def groups(rows: Sequence[Row]) -> dict[tuple[str, float, int, float, int], list[Row]]:
    """Rows by (dataset, temperature, top_k, top_p, max_new_tokens): one table/plot set each."""
    out: dict[tuple[str, float, int, float, int], list[Row]] = {}
    for r in rows:
        out.setdefault((r.dataset, r.temperature, r.top_k, r.top_p, r.max_new_tokens), []).append(r)
    return out


def sort_rows(rows: Sequence[Row]) -> list[Row]:
    """ar first, then our methods by family and name, peers last; parameters in order."""
    fam = list(FAMILY_STYLE)
    return sorted(
        rows,
        key=lambda r: (
            r.method != "ar",
            r.peer,
            fam.index(r.family) if r.family in fam else len(fam),
            r.method,
            sorted((k, str(v)) for k, v in r.params.items()),
        ),
    )


def speedup_ranges(per_seed: Sequence[Row]) -> dict[str, tuple[float, float]]:
    """Min and max of the per-seed speedups of each pooled row (keyed by the pooled row's key)."""
    out: dict[str, list[float]] = {}
    for r in per_seed:
        if r.speedup is not None:
            out.setdefault(_pooled_key(r), []).append(r.speedup)
    return {k: (min(v), max(v)) for k, v in out.items()}


def _pooled_key(r: Row) -> str:
    import json

    method, params, dataset, sampling, _seed = json.loads(r.key)
    return json.dumps([method, params, dataset, sampling, ALL_SEEDS], sort_keys=True)


# ---------------------------------------------------------------------------------------------
# Ours vs Hugging Face


def hf_comparisons(rows: Sequence[Row], times: dict[str, Timings] | None = None) -> list[dict[str, Any]]:
    """Our ``ar`` vs ``hf-generate`` and our ``sd`` vs ``hf-assisted`` at the same k (pooled rows);
    with the rows' ``times`` (:func:`cell_timings`) each ratio gets its 95 % interval."""
    ok = [r for r in rows if r.prompts]
    out = [
        _comparison("our ar vs HF generate()", ar, hf, None, times)
        for ar in ok
        if ar.method == "ar"
        for hf in ok
        if hf.method == "hf-generate"
    ]
    for sd in sorted((r for r in ok if r.method == "sd"), key=lambda r: r.params["k"]):
        for hf in ok:
            if hf.method == "hf-assisted" and hf.params.get("k") == sd.params["k"]:
                name = f"our {sd.label} vs HF assisted ({hf.label})"
                out.append(_comparison(name, sd, hf, HF_GOAL, times))
    return list({c["comparison"]: c for c in out}.values())  # one line per pair


def _comparison(
    name: str, ours: Row, theirs: Row, goal: float | None, times: dict[str, Timings] | None
) -> dict[str, Any]:
    ratio, ci = speed_between(ours, theirs, times)
    return {
        "comparison": name,
        "ours": ours.tokens_per_second,
        "theirs": theirs.tokens_per_second,
        "ratio": ratio,
        "ratio_ci": ci,
        "goal": goal,
        "met": None if goal is None or ratio is None else ratio >= goal,
    }


def hf_table(comparisons: Sequence[dict[str, Any]]) -> str:
    lines = ["| comparison | ours tok/s | HF tok/s | ours / HF | goal |", "|---|---:|---:|---:|---|"]
    for c in comparisons:
        goal = "-" if c["goal"] is None else f"≥ {c['goal']:.1f}x: {'met' if c['met'] else 'not met'}"
        ratio = format_speedup(c["ratio"], c.get("ratio_ci"))
        lines.append(f"| {c['comparison']} | {c['ours']:.1f} | {c['theirs']:.1f} | {ratio} | {goal} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib, Agg)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, tight: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


Axis = tuple[Callable[[Row], float | None], str, Callable[[Row], dict[str, Any] | None]]


def _quality_axis(rows: Sequence[Row]) -> Axis | None:
    """(value, name, 95 % interval) of task quality where the dataset has a metric, else of
    agreement with greedy AR, else None."""
    metric = next((r.quality_metric for r in rows if r.quality is not None), None)
    if metric is not None:
        return (lambda r: r.quality), metric, (lambda r: r.quality_ci)
    if any(r.ar_identical is not None for r in rows):
        return (
            (lambda r: r.ar_identical),
            "share of prompts identical to greedy AR",
            (lambda r: r.ar_identical_ci),
        )
    return None


MARKERS = "os^Dv<>pPX*h"


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (higher is better), by x."""
    keep = [
        i
        for i, (x, y) in enumerate(points)
        if not any(x2 >= x and y2 >= y and (x2, y2) != (x, y) for x2, y2 in points)
    ]
    return sorted(keep, key=lambda i: points[i])


def _scatter_by_family(
    ax,
    rows: Sequence[Row],
    x: Callable[[Row], float | None],
    y: Callable[[Row], float | None],
    ci: Callable[[Row], dict[str, Any] | None] | None = None,
    xci: Callable[[Row], dict[str, Any] | None] | None = None,
) -> None:
    """Colour by family, marker by method; each family's Pareto frontier drawn and labelled;
    ``ci`` draws each point's 95 % interval as a vertical bar, ``xci`` as a horizontal one."""
    pts = [(r, x(r), y(r)) for r in rows if x(r) is not None and y(r) is not None]
    methods = list(dict.fromkeys(r.method for r, _, _ in pts))
    for method in methods:
        mine = [(r, xv, yv) for r, xv, yv in pts if r.method == method]
        color = FAMILY_STYLE.get(mine[0][0].family, ("tab:red", "v"))[0]
        marker = MARKERS[methods.index(method) % len(MARKERS)]
        for interval, vertical in ((ci, True), (xci, False)):
            bars = [(xv, yv, interval(r)) for r, xv, yv in mine if interval is not None and interval(r)]
            if not bars:
                continue
            value = [b[1] if vertical else b[0] for b in bars]
            err = [
                [max(0.0, v - b[2]["low"]) for v, b in zip(value, bars, strict=True)],
                [max(0.0, b[2]["high"] - v) for v, b in zip(value, bars, strict=True)],
            ]
            ax.errorbar(
                [b[0] for b in bars],
                [b[1] for b in bars],
                **({"yerr": err} if vertical else {"xerr": err}),
                fmt="none",
                ecolor=color,
                elinewidth=0.8,
                alpha=0.4,
            )
        ax.scatter(
            [p[1] for p in mine],
            [p[2] for p in mine],
            c=color,
            marker=marker,
            s=36,
            alpha=0.8,
            label=f"{method} ({mine[0][0].family})",
        )
    for fam in dict.fromkeys(r.family for r, _, _ in pts):
        mine = [(r, xv, yv) for r, xv, yv in pts if r.family == fam]
        front = pareto([(xv, yv) for _, xv, yv in mine])
        color = FAMILY_STYLE.get(fam, ("tab:red", "v"))[0]
        if len(front) > 1:
            ax.plot([mine[i][1] for i in front], [mine[i][2] for i in front], color=color, lw=0.8, alpha=0.6)
        for i in front:
            ax.annotate(mine[i][0].label, mine[i][1:], fontsize=6, xytext=(3, 3), textcoords="offset points")
    if pts:
        ax.legend(fontsize=6, loc="best")


def plot_frontier(rows: Sequence[Row], path: Path, title: str) -> Path | None:
    """Speed–quality frontier: speedup vs quality, one colour per method family."""
    axis = _quality_axis(rows)
    if axis is None or not any(r.speedup for r in rows):
        return None
    y, name, ci = axis
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    _scatter_by_family(ax, rows, lambda r: r.speedup, y, ci, lambda r: r.speedup_ci)
    ax.axvline(1.0, color="black", lw=0.5, ls=":")
    ax.set(
        xlabel="speedup vs our AR (same run; bars: 95 % interval)",
        ylabel=f"{name} (bars: 95 % interval)",
        title=f"speed–quality · {title}",
    )
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_calls(rows: Sequence[Row], path: Path, title: str) -> Path | None:
    """Quality vs verifier calls per output token (VS frontier; NSD §4.4)."""
    axis = _quality_axis(rows)
    pts = [r for r in rows if r.verifier_calls_per_token is not None and r.method != "ar"]
    if axis is None or not pts:
        return None
    y, name, ci = axis
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    _scatter_by_family(ax, pts, lambda r: r.verifier_calls_per_token, y, ci)
    ax.set(
        xlabel="verifier calls per output token",
        ylabel=f"{name} (bars: 95 % interval)",
        title=f"quality vs verifier calls · {title}",
    )
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_tau(rows: Sequence[Row], path: Path, title: str) -> Path | None:
    """τ (tokens per verifier call) and speedup per runner, side by side."""
    pts = [r for r in rows if r.tau is not None and r.method != "ar" and r.prompts]
    if not pts:
        return None
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 0.9 + 0.28 * len(pts)), sharey=True)
    labels = [r.label for r in pts]
    colors = [FAMILY_STYLE.get(r.family, ("tab:red", ""))[0] for r in pts]
    a1.barh(labels, [r.tau for r in pts], color=colors)
    a1.set(xlabel="τ (tokens per verifier call)")
    a2.barh(labels, [r.speedup or 0 for r in pts], color=colors)
    a2.axvline(1.0, color="black", lw=0.5, ls=":")
    a2.set(xlabel="speedup vs AR")
    a1.invert_yaxis()
    a1.tick_params(axis="y", labelsize=7)
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def plot_acceptance(rows: Sequence[Row], path: Path, title: str) -> Path | None:
    """Per-position acceptance curves (share of verified drafts accepted at position i)."""
    pts = [r for r in rows if r.position_acceptance]
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for r in pts:
        xs = range(1, len(r.position_acceptance) + 1)
        ax.plot(xs, r.position_acceptance, marker=".", lw=1, label=r.label)
    ax.set(
        xlabel="draft position",
        ylabel="acceptance",
        ylim=(0, 1.02),
        title=f"per-position acceptance · {title}",
    )
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    return _save(fig, path)


def sweeps(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """Parameter -> rows of the methods run at ≥ 2 values of it (θ, k, k_min, …), for one plot each."""
    out: dict[str, list[Row]] = {}
    for method in dict.fromkeys(r.method for r in rows):
        mine = [r for r in rows if r.method == method and r.prompts]
        for name in sorted({k for r in mine for k in r.params}):
            if len({str(r.params.get(name)) for r in mine}) > 1:
                out.setdefault(name, []).extend(r for r in mine if name in r.params)
    return out


def plot_sweep(rows: Sequence[Row], param: str, path: Path, title: str) -> Path:
    """Speedup, τ and quality against one parameter; one line per method and setting of the others."""
    plt = _plt()
    axis = _quality_axis(rows)
    panels: list[tuple[str, Callable[[Row], float | None]]] = [
        ("speedup vs AR", lambda r: r.speedup),
        ("τ", lambda r: r.tau),
    ]
    if axis is not None:
        panels.append((axis[1], axis[0]))  # the table next to the plot gives the intervals
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    values = sorted({r.params[param] for r in rows}, key=_sort_key)
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    lines: dict[str, list[Row]] = {}
    for r in rows:
        rest = " ".join([r.method, *(f"{k}={v}" for k, v in sorted(r.params.items()) if k != param)])
        lines.setdefault(rest, []).append(r)
    for ax, (name, fn) in zip(axes, panels, strict=True):
        for rest, rs in lines.items():
            rs = sorted(rs, key=lambda r: _sort_key(r.params[param]))
            xs = [r.params[param] if numeric else values.index(r.params[param]) for r in rs]
            ys = [fn(r) for r in rs]
            if all(v is None for v in ys):
                continue
            style = "--" if rs[0].peer else "-"
            ax.plot(xs, [math.nan if v is None else v for v in ys], style, marker="o", label=rest)
        if not numeric:
            ax.set_xticks(range(len(values)), [str(v) for v in values])
        ax.set(xlabel=param, ylabel=name)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=min(4, max(1, len(labels))))
    fig.suptitle(f"{param} sweep · {title}", fontsize=9)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * math.ceil(len(labels) / 4), 1, 1))
    return _save(fig, path, tight=False)


def _sort_key(v: Any) -> tuple[int, Any]:
    return (0, v) if isinstance(v, int | float) else (1, str(v))


# ---------------------------------------------------------------------------------------------
# Diagnostics tables


DIAGNOSTIC_COLUMNS: dict[str, list[tuple[str, str, str]]] = {  # name -> (header, key, format)
    "rejections": [
        ("strict-rejected", "strict_rejected", "{}"),
        ("in nucleus", "rejected_in_nucleus", "{:.1%}"),
        ("in top-10", "rejected_in_top10", "{:.1%}"),
        ("extra accepted", "extra_accepted", "{}"),
        ("extra in core", "extra_in_nucleus_core", "{:.1%}"),
        ("extra in top-5", "extra_in_top5", "{:.1%}"),
        ("H(q) extra", "extra_entropy_draft", "{:.3f}"),
        ("H(p) extra", "extra_entropy_target", "{:.3f}"),
        ("H(p) > H(q)", "extra_target_entropy_higher", "{:.1%}"),
    ],
    "gate_auc": [
        ("positions", "positions", "{}"),
        ("match rate", "match_rate", "{:.3f}"),
        ("AUC confidence", "auc_confidence", "{:.3f}"),
        ("AUC verifier", "auc_verifier", "{:.3f}"),
        ("AUC product", "auc_product", "{:.3f}"),
    ],
    "vs_permutation": [
        ("blocks", "blocks", "{}"),
        ("feasible prefix", "feasible_mean", "{:.2f}"),
        ("after permutation", "permuted_feasible_mean", "{:.2f}"),
        ("feasible (non-zero)", "feasible_mean_nonzero", "{:.2f}"),
        ("after permutation (non-zero)", "permuted_feasible_mean_nonzero", "{:.2f}"),
    ],
    "prove": [
        ("proposals", "proposals", "{}"),
        ("mean AR prefix", "mean_ar_prefix", "{:.2f}"),
        ("non-matching rate", "non_matching_rate", "{:.2%}"),
        ("AUC confidence", "auc_confidence", "{:.3f}"),
        ("AUC verifier", "auc_verifier", "{:.3f}"),
        ("AUC product", "auc_product", "{:.3f}"),
    ],
}
DIAGNOSTIC_TITLES = {
    "rejections": "NSD rejected-token analysis (NSD §1, §4.4): tokens the strict rule rejects, and the "
    "extra tokens a relaxed rule accepted",
    "gate_auc": "Gate AUCs (ProVe Fig. 4; VS App. A.2): telling drafts that match the verifier's argmax "
    "from those that do not",
    "vs_permutation": "VS permutation diagnostic (VS §5): feasible prefix length of raw confidence "
    "(τ = 0.9) before and after breaking cross-position dependence",
    "prove": "ProVe diagnostics (ProVe §3.1, §4.1): AR-matching prefix of block proposals, "
    "non-matching-token rate, gate AUCs vs the proposer's greedy AR",
}


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def break_even(rows: Sequence[Row]) -> str:
    """K* (VS §4, H2) of every strict diffusion-drafter row: the shortest skip that pays off.

    From the row's measured draft time per round, verifier time per call and tokens per strict
    round (the verifier's prefill of skipped tokens, ``c_p``, is taken as 0: not measured here).
    """
    from relaxspec.engine.survival import break_even_skip_length

    strict = [
        r
        for r in rows
        if r.family == "diffusion drafter" and not r.skipped_tokens and r.rounds and r.verify_ms_per_call
    ]
    if not strict:
        return ""
    lines = ["| runner | draft ms/round | verify ms/call | tokens/round | K* |", "|---|---:|---:|---:|---:|"]
    for r in strict:
        per_round = r.new_tokens / r.rounds
        k_star = break_even_skip_length(r.draft_ms_per_round or 0.0, r.verify_ms_per_call, per_round)
        lines.append(
            f"| {r.label} | {r.draft_ms_per_round:.2f} | {r.verify_ms_per_call:.2f} | {per_round:.2f} | "
            f"{k_star:.2f} |"
        )
    return (
        "**Break-even skip length K\\* (VS §4)**: a skip must commit more than K\\* tokens to beat a "
        "strict round.\n\n" + "\n".join(lines) + "\n"
    )


def diagnostics_tables(rows: Sequence[Row]) -> str:
    """One Markdown table per diagnostic present in ``rows``."""
    names = list(dict.fromkeys(n for r in rows for n in r.diagnostics))
    parts = []
    for name in names:
        have = [r for r in rows if name in r.diagnostics and not _empty(r.diagnostics[name])]
        if not have:
            continue
        cols = DIAGNOSTIC_COLUMNS.get(name) or [
            (k, k, "{:.4g}")
            for k in dict.fromkeys(k for r in have for k, v in r.diagnostics[name].items() if _scalar(v))
        ]
        lines = [
            "| runner | " + " | ".join(h for h, _, _ in cols) + " |",
            "|---|" + "---:|" * len(cols),
        ]
        for r in have:
            d = r.diagnostics[name]
            if "error" in d:
                lines.append(f"| {r.label} | error: {d['error']} |" + " |" * (len(cols) - 1))
                continue
            lines.append(f"| {r.label} | " + " | ".join(_cell(d.get(k), f) for _, k, f in cols) + " |")
        parts.append(f"**{DIAGNOSTIC_TITLES.get(name, name)}**\n\n" + "\n".join(lines) + "\n")
        ranks = [(r.label, r.diagnostics[name].get("extra_by_rank")) for r in have if name == "rejections"]
        ranks = [(lab, d) for lab, d in ranks if d]
        if ranks:
            bins = list(ranks[0][1])
            parts.append(
                "Extra acceptances by target rank:\n\n"
                + "| runner | "
                + " | ".join(bins)
                + " |\n|---|"
                + "---:|" * len(bins)
                + "\n"
                + "\n".join(
                    f"| {lab} | " + " | ".join(_cell(d.get(b), "{:.0%}") for b in bins) + " |"
                    for lab, d in ranks
                )
                + "\n"
            )
    return "\n".join(parts)


def _empty(summary: dict[str, Any]) -> bool:
    """Nothing was counted (e.g. the rejection analysis of a method that verifies nothing)."""
    counts = [
        v for k, v in summary.items() if k in ("strict_rejected", "extra_accepted", "positions", "blocks")
    ]
    return bool(counts) and not any(counts)


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, int | float | str)


# ---------------------------------------------------------------------------------------------
# The report


REPORT_COLUMNS = [c for c in COLUMNS if c[0] not in ("data",)]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def _group_slug(key: tuple[str, float, int, float, int]) -> str:
    dataset, t, top_k, top_p, max_new = key
    extra = (f"-topk{top_k}" if top_k else "") + (f"-topp{top_p:g}" if top_p < 1 else "")
    return _slug(f"{dataset_name(dataset)}-t{t:g}{extra}-n{max_new}")


def _group_title(key: tuple[str, float, int, float, int]) -> str:
    dataset, t, top_k, top_p, max_new = key
    extra = (f", top-k {top_k}" if top_k else "") + (f", top-p {top_p}" if top_p < 1 else "")
    return f"{dataset_name(dataset)}, temperature {t:g}{extra}, max {max_new} new tokens"


def section(
    rows: Sequence[Row],
    per_seed: Sequence[Row],
    plots: Path,
    rel: Path,
    prefix: str,
    times: dict[str, Timings] | None = None,
) -> str:
    """Markdown for all groups of one results directory; plots are written under ``plots``;
    ``times`` (the pooled rows' :func:`cell_timings`) give the ratios to HF their intervals."""
    ranges = speedup_ranges(per_seed)
    parts = []
    for key, group in groups(rows).items():
        group = sort_rows(group)
        title = _group_title(key)
        slug = f"{prefix}-{_group_slug(key)}"
        cols = [*REPORT_COLUMNS]
        if any(len(r.seeds) > 1 for r in group):
            cols.insert(
                [c[0] for c in cols].index("speedup") + 1,
                ("speedup range (seeds)", lambda r: _range(ranges.get(r.key))),
            )
        if any(r.skipped_tokens for r in group):
            cols += [
                ("strict agreement", lambda r: _cell(r.strict_agreement, "{:.3f}")),
                ("full-prefix acc.", lambda r: _cell(r.full_prefix_acceptance, "{:.3f}")),
            ]
        parts.append(f"### {title}\n\n" + markdown_table(group, cols))
        if any(r.quality_ci or r.ar_identical_ci for r in group):
            parts.append(f"{QUALITY_NOTE}\n")
        comparisons = hf_comparisons(group, times)
        if comparisons:
            parts.append(
                "**Ours vs Hugging Face** (same models, prompts and run)\n\n" + hf_table(comparisons)
            )
        images = [
            plot_frontier(group, plots / f"{slug}-frontier.png", title),
            plot_calls(group, plots / f"{slug}-calls.png", title),
            plot_tau(group, plots / f"{slug}-tau.png", title),
            plot_acceptance(group, plots / f"{slug}-acceptance.png", title),
        ]
        for param, rs in sweeps(group).items():
            images.append(plot_sweep(rs, param, plots / f"{slug}-sweep-{_slug(param)}.png", title))
        parts.extend(f"![{p.stem}]({(rel / p.name).as_posix()})\n" for p in images if p is not None)
        for extra in (diagnostics_tables(group), break_even(group)):
            if extra:
                parts.append(extra)
        errors = [r for r in group if r.error]
        if errors:
            parts.append(
                "Failed cells:\n\n"
                + "\n".join(f"- {r.label} ({r.errors} failed prompts): `{r.error}`" for r in errors)
                + "\n"
            )
    return "\n".join(parts)


def _range(r: tuple[float, float] | None) -> str:
    return "-" if r is None else f"{r[0]:.2f}–{r[1]:.2f}x"


def provenance(manifest: dict[str, Any]) -> str:
    """The bench command lines, environment and models of a results directory."""
    lines = []
    for s in manifest.get("sessions", []):
        lines.append(f"- `{s.get('command', '')}`")
    env = manifest["sessions"][-1]["environment"] if manifest.get("sessions") else {}
    text = "Produced by:\n\n" + "\n".join(lines) + "\n" if lines else ""
    if env:
        text += "\nEnvironment: " + ", ".join(f"{k} {v}" for k, v in env.items()) + "\n"
    models = manifest.get("models", {})
    if models:
        text += (
            "\nModels: "
            + ", ".join(f"{role} `{m['path']}` ({m['fingerprint']})" for role, m in models.items())
            + "\n"
        )
    return text


def render_report(
    results: Sequence[str | Path],
    out: str | Path,
    title: str = "relaxspec benchmark report",
    html: bool = True,
    intro: str = "",
    names: Sequence[str] | None = None,
    command: str | None = None,
) -> Path:
    """Write ``out`` (Markdown) with plots in ``<out stem>-plots/`` and, if ``html``, ``out`` as .html.

    ``names`` titles each results directory's section (default: the directory name); ``intro``
    is Markdown placed after the title; ``command`` is the command line recorded in the report.
    """
    if not results:
        raise RelaxSpecError("no results directories given")
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RelaxSpecError(f"cannot write the report to {out}: {err.strerror or err}") from None
    plots = out.parent / f"{out.stem}-plots"
    command = command or shlex.join(["relaxspec", *sys.argv[1:]])
    parts = [f"# {title}\n", f"Generated by `{command}`.\n"]
    if intro:
        parts.append(intro)
    names = list(names or [Path(r).name for r in results])
    for name, path in zip(names, results, strict=True):
        records, manifest = load_results(path)
        if not records:
            parts.append(f"## {name}\n\nNo records in `{path}` yet.\n")
            continue
        per_seed = build_rows(records)
        pooled = build_rows(records, combine_seeds=True)
        parts.append(f"## {name}\n\n" + provenance(manifest))
        times = cell_timings(records, combine_seeds=True)
        parts.append(section(pooled, per_seed, plots, Path(plots.name), _slug(name.split(":")[0]), times))
    text = "\n".join(parts)
    atomic.write_text(out, text)
    if html:
        atomic.write_text(out.with_suffix(".html"), to_html(text, title))
    return out


def to_html(markdown: str, title: str) -> str:
    """A standalone HTML page of the Markdown report (tables and images kept)."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown)
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;font-size:12px;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child{text-align:left}"
        "img{max-width:100%}code{font-size:12px}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html_lib.escape(title)}</title>"
        f"<style>{style}</style></head><body>{body}</body></html>\n"
    )
