"""The report's plots (matplotlib, Agg): the speed–quality frontier per method family, quality
against verifier calls per token, τ per runner, per-position acceptance, the rejection
diagnostics by target rank, and one sweep plot per parameter a method was run at more than one
value."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from relaxspec.eval.rows import Row

FAMILY_STYLE = {  # colour, marker
    "autoregressive": ("black", "s"),
    "draft model": ("tab:blue", "o"),
    "block proposer": ("tab:green", "^"),
    "diffusion drafter": ("tab:purple", "D"),
    "hugging face": ("tab:orange", "x"),
    "unregistered": ("tab:red", "v"),
}


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


def _bar_panels(
    have: Sequence[tuple[str, dict[str, Any]]],
    panels: Sequence[tuple[str, str]],
    xlabel: str,
    tag: Callable[[str, dict[str, Any], str], str],
) -> Any:
    """Two panels of grouped bars: panel ``(key, name)`` draws each row's ``d[key]`` histogram
    (bin -> share) side by side, legend entry ``tag(label, d, key)``. Returns the figure."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(10, 3.8), sharey=True)
    width = 0.8 / len(have)
    for ax, (key, name) in zip(axes, panels, strict=True):
        for i, (label, d) in enumerate(have):
            bins = d.get(key) or {}
            if bins:
                xs = [j + (i - (len(have) - 1) / 2) * width for j in range(len(bins))]
                ax.bar(xs, list(bins.values()), width=width, label=tag(label, d, key))
                ax.set_xticks(range(len(bins)), list(bins))
        ax.set(xlabel=xlabel, title=name)
        ax.grid(alpha=0.3, axis="y")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    axes[0].set_ylabel("share")
    return fig


def _rejection_rows(rows: Sequence[Row], needs: str) -> list[tuple[str, dict[str, Any]]]:
    """(label, rejections summary) of the rows whose summary has a non-empty ``needs``."""
    return [(r.label, d) for r in rows if (d := (r.diagnostics or {}).get("rejections")) and d.get(needs)]


def plot_rejections(rows: Sequence[Row], path: Path, title: str) -> Path | None:
    """The papers' rejection diagnostics as bars: the target rank of the drafts exact SD rejects
    (left; rank 0 = its top token) and of the drafts a relaxed rule accepted beyond SD (right),
    each as a share of its row's count, with the share inside the target's nucleus in the legend
    (the row's own θ for ``nsd``, else 0.95; NSD paper: 52.6 % in the 0.95-nucleus). ``None`` when
    no row carries the diagnostics."""
    have = _rejection_rows(rows, "strict_rejected")
    if not have:
        return None

    def tag(label: str, d: dict[str, Any], key: str) -> str:
        share = d.get("rejected_in_nucleus")
        if key != "rejected_by_rank" or share is None:
            return label
        return f"{label} ({share:.0%} in its nucleus)"

    panels = [("rejected_by_rank", "SD-rejected drafts"), ("extra_by_rank", "accepted beyond SD")]
    fig = _bar_panels(have, panels, "target rank of the draft token", tag)
    fig.suptitle(f"rejection diagnostics · {title}", fontsize=9)
    return _save(fig, path)


def plot_entropy(rows: Sequence[Row], path: Path, title: str) -> Path | None:
    """The target's entropy per position, binned in nats (``eval/diagnostics.ENTROPY_EDGES``): at
    every position a row emitted a token at (left) and at the drafts exact SD rejected (right),
    each as a share of its row's count. Rejections piled in the high bins mean the drafts fail
    where the target hesitates — the regime a relaxed rule is for. ``None`` without the data."""
    have = _rejection_rows(rows, "entropy_emitted_by_bin")
    if not have:
        return None
    panels = [("entropy_emitted_by_bin", "each emitted position"), ("entropy_rejected_by_bin", "SD-rejected")]
    fig = _bar_panels(have, panels, "target entropy H(p), nats", lambda label, d, key: label)
    fig.suptitle(f"target entropy per position · {title}", fontsize=9)
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
