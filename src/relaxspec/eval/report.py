"""``relaxspec report``: Markdown (and HTML) with matplotlib plots from benchmark results.

Everything is recomputed from the results directories' records
(:func:`relaxspec.eval.rows.build_rows`), so a report always agrees with the records it was made
from. Per dataset and temperature:

- a table with the seeds pooled (throughput = total tokens / total seconds over all seeds; the
  per-seed speedups' range next to it);
- ours vs Hugging Face: our ``ar`` against ``generate()``, our ``sd`` against assisted generation
  with the same draft length, against the project's goal (:data:`HF_GOAL`);
- plots: the speed–quality frontier per method family, quality against verifier calls per token
  (the VS frontier; NSD §4.4's calls per token), τ per runner, per-position acceptance, and a
  sweep plot for every parameter a method was run at more than one value (θ, K, k_min, …);
- the diagnostics collected with ``bench --diagnostics`` (NSD rejected-token analysis, gate AUCs,
  ProVe prefixes, and any registered by other methods) as tables.
"""

from __future__ import annotations

import html as html_lib
import json
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relaxspec import atomic
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.plots import (
    FAMILY_STYLE,
    plot_acceptance,
    plot_calls,
    plot_entropy,
    plot_frontier,
    plot_rejections,
    plot_sweep,
    plot_tau,
    sweeps,
)
from relaxspec.eval.records import load_manifest, load_records
from relaxspec.eval.rows import ALL_SEEDS, Row, Timings, build_rows, cell_timings, speed_between
from relaxspec.eval.tables import (
    COLUMNS,
    QUALITY_NOTE,
    _cell,
    break_even,
    dataset_name,
    diagnostics_tables,
    hf_table,
    markdown_table,
)

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
            plot_rejections(group, plots / f"{slug}-rejections.png", title),
            plot_entropy(group, plots / f"{slug}-entropy.png", title),
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
