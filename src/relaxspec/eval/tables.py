"""Rows as tables: the columns, ``results.json`` / ``.csv`` / ``.md``, the terminal table, the
ours-vs-Hugging-Face table and the diagnostics tables of a report."""

from __future__ import annotations

import csv
import io
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from relaxspec import atomic
from relaxspec.eval import intervals
from relaxspec.eval.rows import ALL_SEEDS, Row


def _quality(r: Row) -> str:
    if r.quality is None:
        return "-"
    if r.quality_ci is not None:
        text = f"{intervals.format_interval(r.quality_ci)} {r.quality_metric or ''} n={r.quality_ci['n']}"
        text = text.replace("  ", " ")
    else:
        text = f"{r.quality:.3f} {r.quality_metric or ''}".strip()
    if r.sandbox == "namespaces":
        return f"{text} (isolated)"
    if r.sandbox is not None:
        return f"{text} (UNTRUSTED: {r.sandbox} sandbox)"
    return text


# ---------------------------------------------------------------------------------------------
# Output: JSON, CSV, Markdown, terminal table


def _fmt(x: float | None, f: str = "{:.2f}") -> str:
    return "-" if x is None else f.format(x)


def _split(r: Row) -> str:
    if r.time_split is None:
        return "-"
    return "/".join(f"{100 * r.time_split[k]:.0f}" for k in ("draft", "verify", "other"))


COLUMNS = [
    ("runner", lambda r: r.label),
    ("data", lambda r: dataset_name(r.dataset)),
    ("seed", lambda r: ",".join(map(str, r.seeds)) if r.seed == ALL_SEEDS else str(r.seed)),
    ("prompts", lambda r: f"{r.prompts}" + (f" ({r.errors} failed)" if r.errors else "")),
    ("new tok", lambda r: str(r.new_tokens)),
    ("sec", lambda r: _fmt(r.seconds)),
    ("tok/s", lambda r: _fmt(r.tokens_per_second, "{:.1f}")),
    ("speedup", lambda r: format_speedup(r.speedup, r.speedup_ci)),
    ("τ", lambda r: _fmt(r.tau)),
    ("verif/tok", lambda r: _fmt(r.verifier_calls_per_token, "{:.3f}")),
    ("draft/tok", lambda r: _fmt(r.draft_calls_per_token)),
    ("verify ms/tok", lambda r: _fmt(r.verify_ms_per_token)),
    ("draft/verify/other %", _split),
    ("quality", _quality),
    ("Δ quality (paired)", lambda r: _paired(r, "quality")),
    ("= AR", lambda r: _interval(r.ar_identical, r.ar_identical_ci)),
    ("AR prefix", lambda r: _interval(r.ar_prefix, r.ar_prefix_ci, 1)),
]

QUALITY_NOTE = (
    "speedup: tok/s over the ar row's [95 % interval: jackknife over prompts of the paired log "
    "ratio, t quantile]. quality and = AR: mean [95 % interval] (Wilson for a proportion; with "
    "seeds pooled, at the effective n of prompts × seeds clustered by prompt). Δ quality: paired "
    "difference from the ar row (else sd, named) on the same prompts and seeds, with its "
    "paired-bootstrap 95 % interval and the exact McNemar p for 0/1 scores; n: pairs, where "
    "fewer than the row's n."
)


def format_speedup(value: float | None, ci: dict[str, Any] | None) -> str:
    """``1.66× [1.55–1.78]`` (no interval where none was measured; ``-`` without a speedup)."""
    if value is None:
        return "-"
    return f"{value:.2f}×" + ("" if ci is None else f" [{ci['low']:.2f}–{ci['high']:.2f}]")


def _interval(value: float | None, ci: dict[str, Any] | None, digits: int = 2) -> str:
    if ci is None:
        return _fmt(value, f"{{:.{digits}f}}")
    return intervals.format_interval(ci, digits)


def _paired(r: Row, name: str) -> str:
    """Δ [interval] p; the number of pairs where it differs from the row's own n (results missing
    on either side), the baseline where it is not ``ar``."""
    p = (r.paired or {}).get(name)
    if p is None:
        return "-"
    own = getattr(r, f"{name}_ci") or {}
    text = intervals.format_paired(p, show_n=p["n_pairs"] != own.get("n"))
    return text if r.paired["baseline"] == "ar" else f"{text} vs {r.paired['baseline']}"


TERMINAL_COLUMNS = [
    c
    for c in COLUMNS
    if c[0] in ("runner", "data", "seed", "prompts", "tok/s", "speedup", "τ", "verif/tok")
    or c[0] in ("draft/verify/other %", "quality", "Δ quality (paired)", "= AR")
]


def dataset_name(dataset: str) -> str:
    """Short display name: ``math``, ``humaneval``, … or a prompt file's stem."""
    return Path(dataset).stem if dataset.endswith(".jsonl") else dataset


def with_temperature(rows: Sequence[Row], columns: Sequence[tuple[str, Callable[[Row], str]]]) -> list:
    """``columns`` with a ``T`` column after ``data`` where ``rows`` hold several temperatures (a
    grid run at several, ``--temperature 1,0.9``), else unchanged."""
    cols = list(columns)
    if len({r.temperature for r in rows}) > 1:
        at = next((i + 1 for i, (name, _) in enumerate(cols) if name == "data"), 1)
        cols.insert(at, ("T", lambda r: f"{r.temperature:g}"))
    return cols


def markdown_table(rows: Sequence[Row], columns: Sequence[tuple[str, Callable[[Row], str]]] = ()) -> str:
    cols = with_temperature(rows, list(columns) or COLUMNS)
    lines = [
        "| " + " | ".join(name for name, _ in cols) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(cols))) + "|",
    ]
    for r in rows:
        lines.append("| " + " | ".join(fn(r).replace("|", "\\|") for _, fn in cols) + " |")
    return "\n".join(lines) + "\n"


def print_table(rows: Sequence[Row], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    shows_intervals = any(r.quality_ci or r.ar_identical_ci or r.speedup_ci for r in rows)
    table = Table(title=title, caption=QUALITY_NOTE if shows_intervals else None)
    columns = with_temperature(rows, TERMINAL_COLUMNS)
    for name, _ in columns:
        table.add_column(name, justify="left" if name == "runner" else "right")
    for r in rows:
        table.add_row(*(fn(r) for _, fn in columns))
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    for line in plain_summary(rows):
        print(line)
    for r in rows:
        if r.error:
            print(f"error in {r.label} ({r.dataset}, seed {r.seed}): {r.error}", file=sys.stderr)
    untrusted = sorted({r.sandbox for r in rows if r.sandbox not in (None, "namespaces")})
    if untrusted:
        print(
            f"warning: pass@1 here ran in a {'/'.join(untrusted)} sandbox, not isolated by namespaces: "
            "a completion could have escaped it or forged its score (relaxspec.eval.sandbox)",
            file=sys.stderr,
        )


def plain_summary(rows: Sequence[Row]) -> list[str]:
    """A few sentences a newcomer can read under the table: per dataset and sampling regime, the
    fastest row with its speed interval and its quality beside AR's (the table's formatters)."""
    lines = []
    groups: dict[tuple[str, float], list[Row]] = {}
    for r in rows:
        if not r.error and r.speedup is not None:
            groups.setdefault((r.dataset, r.temperature), []).append(r)
    for (dataset, temperature), group in groups.items():
        ar = next((r for r in group if r.method == "ar" and not r.peer), None)
        others = [r for r in group if r is not ar]
        if ar is None or not others:
            continue
        regime = "greedy" if temperature == 0 else f"sampling at T = {temperature:g}"
        best = max(others, key=lambda r: r.speedup or 0.0)
        speed = format_speedup(best.speedup, best.speedup_ci).replace("×", "× AR's speed", 1)
        lines.append(
            f"{dataset}, {regime}, {ar.prompts} prompts: fastest is {best.label} at {speed}, "
            f"quality {_quality(best)} (AR: {_quality(ar)})."
        )
    if lines:
        lines.append(
            "A speed-up whose interval contains 1.00× is not distinguishable from AR on these prompts; "
            "overlapping quality intervals mean no measured quality difference."
        )
    return lines


def flat_row(r: Row) -> dict[str, Any]:
    """A CSV row: scalars as they are, lists ``;``-joined, dicts flattened with dotted names."""
    out: dict[str, Any] = {}

    def put(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                put(f"{prefix}.{k}", v)
        elif isinstance(value, list):
            out[prefix] = ";".join(
                "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v) for v in value
            )
        else:
            out[prefix] = value

    for k, v in asdict(r).items():
        if k == "key":
            continue
        put(k, v)
    return out


def write_outputs(out: Path, rows: Sequence[Row], manifest: dict[str, Any]) -> None:
    """``results.json`` (manifest + rows), ``results.csv`` and ``results.md``, each written whole."""
    atomic.write_json(out / "results.json", {"manifest": manifest, "rows": [asdict(r) for r in rows]})
    flat = [flat_row(r) for r in rows]
    names = list(dict.fromkeys(k for f in flat for k in f))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=names)
    writer.writeheader()
    writer.writerows(flat)
    atomic.write_text(out / "results.csv", buf.getvalue())
    atomic.write_text(out / "results.md", markdown_table(rows))


def hf_table(comparisons: Sequence[dict[str, Any]]) -> str:
    lines = ["| comparison | ours tok/s | HF tok/s | ours / HF | goal |", "|---|---:|---:|---:|---|"]
    for c in comparisons:
        goal = "-" if c["goal"] is None else f"≥ {c['goal']:.1f}x: {'met' if c['met'] else 'not met'}"
        ratio = format_speedup(c["ratio"], c.get("ratio_ci"))
        lines.append(f"| {c['comparison']} | {c['ours']:.1f} | {c['theirs']:.1f} | {ratio} | {goal} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Diagnostics tables


DIAGNOSTIC_COLUMNS: dict[str, list[tuple[str, str, str]]] = {  # name -> (header, key, format)
    "rejections": [
        ("strict-rejected", "strict_rejected", "{}"),
        ("in nucleus", "rejected_in_nucleus", "{:.1%}"),
        ("in nucleus 95 %", "rejected_in_nucleus_ci", "{:.1%}"),
        ("in top-10", "rejected_in_top10", "{:.1%}"),
        ("extra accepted", "extra_accepted", "{}"),
        ("extra in core", "extra_in_nucleus_core", "{:.1%}"),
        ("extra in top-5", "extra_in_top5", "{:.1%}"),
        ("H(q) extra", "extra_entropy_draft", "{:.3f}"),
        ("H(p) extra", "extra_entropy_target", "{:.3f}"),
        ("H(p) > H(q)", "extra_target_entropy_higher", "{:.1%}"),
        ("H(p) ≥ 0.5 emitted", "entropy_emitted_uncertain", "{:.1%}"),
        ("H(p) ≥ 0.5 rejected", "entropy_rejected_uncertain", "{:.1%}"),
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
    if isinstance(value, dict) and "low" in value:  # an interval: [low–high] in the column's format
        return f"[{fmt.format(value['low'])}–{fmt.format(value['high'])}]"
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
