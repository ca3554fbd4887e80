"""Benchmark cells and the rows recomputed from their records (:func:`build_rows`).

The benchmark and the report alike rebuild rows from the records: throughput is total new tokens
/ total in-flight seconds of a cell, speedup is relative to the ``ar`` cell of the same dataset,
seed and sampling settings. Every quality figure (task quality, agreement with greedy AR) carries
its n and 95 % interval, every speedup its 95 % interval over prompts, and every row a paired
comparison with its baseline row on the same prompts and seeds (:mod:`relaxspec.eval.intervals`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from relaxspec.engine import GenerationStats
from relaxspec.errors import RelaxSpecError
from relaxspec.eval import diagnostics, intervals
from relaxspec.eval.peers import family, is_peer, runner_params

# ---------------------------------------------------------------------------------------------
# Cells


@dataclass(frozen=True)
class Cell:
    """One row of the results: a runner with fixed parameters on one dataset with one seed."""

    method: str
    params: dict[str, Any]
    dataset: str
    seed: int
    sampling: dict[str, Any]  # temperature, top_k, top_p, max_new_tokens

    @property
    def key(self) -> str:
        return json.dumps([self.method, self.params, self.dataset, self.sampling, self.seed], sort_keys=True)

    @property
    def label(self) -> str:
        return label(self.method, self.params)

    @property
    def runner_key(self) -> str:
        """What the cell's runner is built from: method, parameters and sampling (a runner holds its
        sampling, so cells differing only in top-p, as AR and top-p AR, need two runners)."""
        return json.dumps([self.method, self.params, self.sampling], sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "params": self.params,
            "dataset": self.dataset,
            "seed": self.seed,
            "sampling": self.sampling,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Cell:
        return Cell(d["method"], dict(d["params"]), d["dataset"], int(d["seed"]), dict(d["sampling"]))


def label(method: str, params: dict[str, Any]) -> str:
    """Every parameter: ``nsd k=8 theta=0.9`` (a row's name; its runner is ``Cell.runner_key``)."""
    return " ".join([method, *(f"{k}={v}" for k, v in sorted(params.items()))])


ALWAYS_SHOWN = ("k",)  # draft length: needed to pair our sd with HF assisted generation


def display_labels(cells: Iterable[Cell]) -> dict[str, str]:
    """Short row labels: a method's parameters that vary among ``cells``, differ from the preset's
    default, or are always shown (``k``). Full parameters stay in the rows' ``params``.
    """
    cells = list(cells)
    values: dict[str, dict[str, set[str]]] = {}
    for c in cells:
        for k, v in c.params.items():
            values.setdefault(c.method, {}).setdefault(k, set()).add(json.dumps(v))
    out = {}
    for c in cells:
        try:
            defaults = runner_params(c.method)
        except RelaxSpecError:
            defaults = {}
        shown = {
            k: v
            for k, v in c.params.items()
            if k in ALWAYS_SHOWN or len(values[c.method][k]) > 1 or (k in defaults and defaults[k] != v)
        }
        out[c.key] = label(c.method, shown)
    return out


# ---------------------------------------------------------------------------------------------
# Measurement arithmetic (pure)


def throughput(tokens: int, seconds: float) -> float:
    """Total new tokens / total in-flight seconds (0 when nothing was timed)."""
    return tokens / seconds if seconds > 0 else 0.0


def speedup(tokens_per_second: float, base_tokens_per_second: float | None) -> float | None:
    """Throughput relative to the baseline (AR) of the same run (None without one measured)."""
    if not base_tokens_per_second:
        return None
    return tokens_per_second / base_tokens_per_second


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def merged_stats(stats: Iterable[dict[str, Any]]) -> GenerationStats | None:
    """Sum of per-generation stats (as stored by ``GenerationStats.to_dict``), via ``merge``."""
    names = {f.name for f in fields(GenerationStats)}
    total: GenerationStats | None = None
    for d in stats:
        s = GenerationStats(**{k: v for k, v in d.items() if k in names})
        total = s if total is None else total.merge(s)
    return total


# ---------------------------------------------------------------------------------------------
# Rows


@dataclass
class Row:
    """Aggregate of one cell over its prompts (everything the tables, CSV and plots show)."""

    key: str
    method: str
    label: str
    family: str
    peer: bool
    params: dict[str, Any]
    dataset: str
    seed: int
    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    prompts: int = 0
    errors: int = 0
    error: str | None = None
    new_tokens: int = 0
    seconds: float = 0.0
    tokens_per_second: float = 0.0
    speedup: float | None = None
    # its 95 % interval (intervals.speed_ratio: jackknife over prompts of the paired log ratio)
    speedup_ci: dict[str, Any] | None = None
    tau: float | None = None
    verifier_calls_per_token: float | None = None
    draft_calls_per_token: float | None = None
    verify_ms_per_token: float | None = None
    verify_ms_per_call: float | None = None
    rounds: int | None = None  # engine cycles (draft rounds)
    draft_ms_per_round: float | None = None
    time_split: dict[str, float] | None = None  # draft / verify / other, fractions of wall time
    position_acceptance: list[float] = field(default_factory=list)
    accepted_by_relaxation: int | None = None
    skipped_tokens: int | None = None
    strict_agreement: float | None = None  # VS: committed tokens strict verification accepts
    full_prefix_acceptance: float | None = None  # VS: rounds whose whole commit strict accepts
    quality: float | None = None
    quality_metric: str | None = None
    sandbox: str | None = None  # pass@1: "namespaces" (trusted), "guard-only" or "unknown" (untrusted)
    ar_identical: float | None = None  # share of prompts token-identical to greedy AR
    ar_prefix: float | None = None  # mean tokens in common with greedy AR before the first difference
    # 95 % intervals (intervals.Interval.to_dict: estimate, low, high, n, method, ...)
    quality_ci: dict[str, Any] | None = None
    ar_identical_ci: dict[str, Any] | None = None
    ar_prefix_ci: dict[str, Any] | None = None
    # vs the baseline row (baseline_of: ar by default, else sd) on common (dataset, example, seed):
    # {"baseline": label, "n_pairs": n, "quality": Paired.to_dict | None, "ar_identical": ...}
    paired: dict[str, Any] | None = None
    diagnostics: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions: int = 0
    seeds: list[int] = field(default_factory=list)


def _stats_fields(row: Row, total: GenerationStats) -> None:
    n = max(total.new_tokens, 1)
    row.tau = total.tau
    row.verifier_calls_per_token = total.verifier_calls / n
    row.draft_calls_per_token = total.draft_calls / n
    row.verify_ms_per_token = 1000 * total.verify_seconds / n
    row.verify_ms_per_call = (
        1000 * total.verify_seconds / total.verifier_calls if total.verifier_calls else None
    )
    row.rounds = total.cycles
    # shadow-verifier agreement (VS §3), where the engine reports it
    row.strict_agreement = getattr(total, "strict_agreement", None)
    row.full_prefix_acceptance = getattr(total, "full_prefix_acceptance", None)
    row.draft_ms_per_round = 1000 * total.draft_seconds / total.cycles if total.cycles else None
    wall = max(total.total_seconds, 1e-12)
    row.time_split = {
        "draft": total.draft_seconds / wall,
        "verify": total.verify_seconds / wall,
        "other": total.other_seconds / wall,
    }
    row.position_acceptance = total.position_acceptance
    row.accepted_by_relaxation = total.accepted_by_relaxation
    row.skipped_tokens = total.skipped_tokens


def summarize_cell(cell: Cell, records: Sequence[dict[str, Any]], reference: dict[str, list[int]]) -> Row:
    """One :class:`Row` from a cell's records; ``reference`` maps example ids to greedy AR tokens."""
    s = cell.sampling
    row = Row(
        cell.key,
        cell.method,
        cell.label,
        family(cell.method),
        is_peer(cell.method),
        cell.params,
        cell.dataset,
        cell.seed,
        s["temperature"],
        s["top_k"],
        s["top_p"],
        s["max_new_tokens"],
    )
    ok = [r for r in records if r.get("error") is None]
    failed = [r for r in records if r.get("error") is not None]
    row.prompts, row.errors = len(ok), len(failed)
    row.error = failed[0]["error"] if failed else None
    row.sessions = len({r.get("session") for r in records})
    row.new_tokens = sum(len(r["tokens"]) for r in ok)
    row.seconds = sum(r["seconds"] for r in ok)
    row.tokens_per_second = throughput(row.new_tokens, row.seconds)
    total = merged_stats(r["stats"] for r in ok if r.get("stats"))
    if total is not None:
        _stats_fields(row, total)
    scores = [r["quality"] for r in ok if r.get("quality") is not None]
    row.quality = sum(scores) / len(scores) if scores else None
    row.quality_metric = next((r.get("metric") for r in ok if r.get("metric")), None)
    row.sandbox = sandbox_of(ok)
    refs = [(r["tokens"], reference[r["example"]]) for r in ok if r["example"] in reference]
    if refs:
        row.ar_identical = sum(a == b for a, b in refs) / len(refs)
        row.ar_prefix = sum(common_prefix(a, b) for a, b in refs) / len(refs)
    outcomes = per_prompt(ok, reference)
    row.quality_ci = figure_interval(outcomes["quality"])
    row.ar_identical_ci = figure_interval(outcomes["ar_identical"], proportion=True)
    row.ar_prefix_ci = figure_interval(outcomes["ar_prefix"], proportion=False)  # a token count
    counters: dict[str, Any] = {}
    for r in ok:
        if r.get("diagnostics"):
            counters = diagnostics.merge_counters(counters, r["diagnostics"])
    row.diagnostics = diagnostics.summarize(counters)
    if "rejections" in row.diagnostics:
        row.diagnostics["rejections"]["rejected_in_nucleus_ci"] = diagnostics.nucleus_share_interval(ok)
    return row


QUALITY_FIGURES = ("quality", "ar_identical", "ar_prefix")
PAIRED_FIGURES = ("quality", "ar_identical")
Outcome = tuple[str, str, int]  # (dataset, example id, seed): the unit pairs are matched on


def per_prompt(
    records: Iterable[dict[str, Any]], reference: dict[str, list[int]]
) -> dict[str, dict[Outcome, float]]:
    """Each quality figure's outcome per (dataset, example, seed) of successful ``records``:
    ``quality`` (the task score), ``ar_identical`` (1 if token-identical to greedy AR) and
    ``ar_prefix`` (tokens in common with greedy AR before the first difference)."""
    out: dict[str, dict[Outcome, float]] = {name: {} for name in QUALITY_FIGURES}
    for r in records:
        if r.get("error") is not None:
            continue
        key = (r["cell"]["dataset"], r["example"], int(r["cell"]["seed"]))
        if r.get("quality") is not None:
            out["quality"][key] = float(r["quality"])
        ref = reference.get(r["example"])
        if ref is not None:
            out["ar_identical"][key] = float(r["tokens"] == ref)
            out["ar_prefix"][key] = float(common_prefix(r["tokens"], ref))
    return out


Timings = dict[Outcome, tuple[int, float]]  # (new tokens, seconds) per (dataset, example, seed)


def timings(records: Iterable[dict[str, Any]]) -> Timings:
    """(new tokens, in-flight seconds) per (dataset, example, seed) of successful ``records``."""
    return {
        (r["cell"]["dataset"], r["example"], int(r["cell"]["seed"])): (len(r["tokens"]), float(r["seconds"]))
        for r in records
        if r.get("error") is None
    }


def speed_interval(row: Timings, baseline: Timings) -> dict[str, Any] | None:
    """95 % interval of a row's speed over its baseline's on their common (dataset, example,
    seed), all seeds of a prompt left out together (:func:`intervals.speed_ratio`); None where
    fewer than two prompts are common or a side timed nothing."""
    keys, x, y = intervals.pair_by_key(row, baseline)
    if not keys or min(sum(t[i] for t in side) for side in (x, y) for i in (0, 1)) <= 0:
        return None
    tok_x, sec_x = zip(*x, strict=True)
    tok_y, sec_y = zip(*y, strict=True)
    iv = intervals.speed_ratio(tok_x, sec_x, tok_y, sec_y, _clusters(keys))
    return None if iv is None else iv.to_dict()


def _clusters(keys: Iterable[Outcome]) -> list[tuple[str, str]]:
    """The prompt of each outcome: all seeds of one prompt are resampled together."""
    return [(dataset, example) for dataset, example, _ in keys]


def figure_interval(outcomes: dict[Outcome, float], proportion: bool | None = None) -> dict[str, Any] | None:
    """95 % interval of one figure's mean over its outcomes (:func:`intervals.mean_interval`:
    Wilson for 0/1 outcomes — at the effective sample size where a prompt has several seeds —
    else a percentile bootstrap, clustered by prompt)."""
    if not outcomes:
        return None
    values = list(outcomes.values())
    return intervals.mean_interval(values, _clusters(outcomes), proportion=proportion).to_dict()


def paired_figures(
    row: dict[str, dict[Outcome, float]], baseline: dict[str, dict[Outcome, float]], label: str
) -> dict[str, Any]:
    """A row's paired comparison with its baseline on their common (dataset, example, seed)."""
    out: dict[str, Any] = {"baseline": label, "n_pairs": 0}
    for name in PAIRED_FIGURES:
        keys, x, y = intervals.pair_by_key(row[name], baseline[name])
        out[name] = intervals.paired_comparison(x, y, _clusters(keys)).to_dict() if keys else None
        out["n_pairs"] = max(out["n_pairs"], len(keys))
    return out


def is_baseline(row: Row, baseline: str) -> bool:
    """Whether ``row`` is the named baseline: its runner label, else its method."""
    return row.label == baseline or row.method == baseline


def baseline_of(row: Row, candidates: Sequence[Row], baseline: str = "ar") -> Row | None:
    """The row ``row`` is compared with: the ``baseline`` row (a runner label or method, e.g.
    ``vllm-ar`` for rows that verify with the model that peer decodes) of the same dataset, seed
    and sampling settings; by default ``ar``, else ``sd`` (same ``k`` where there is one); None
    where there is none, and for the baseline itself."""
    named = [c for c in candidates if is_baseline(c, baseline)]
    sd = [c for c in candidates if c.method == "sd"]
    if named:
        base = named[0]
    elif baseline == "ar" and sd:
        base = next((c for c in sd if c.params.get("k") == row.params.get("k")), sd[0])
    else:
        return None
    return None if base.key == row.key else base


def sandbox_of(records: Iterable[dict[str, Any]]) -> str | None:
    """Isolation of a cell's executed scores: ``namespaces`` only if every one ran there.

    ``guard-only`` if any ran without namespaces; ``unknown`` for pass@1 records written before
    the sandbox recorded it (their verdict was the exit status, which a completion could forge).
    """
    seen = {
        r.get("sandbox") or "unknown"
        for r in records
        if r.get("quality") is not None and (r.get("sandbox") or r.get("metric") == "pass@1")
    }
    if not seen:
        return None
    if seen == {"namespaces"}:
        return "namespaces"
    return "guard-only" if "guard-only" in seen else "unknown"


def latest_records(records: Iterable[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The last record of every (cell key, example): a re-run supersedes a failed attempt."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        if r.get("type") == "record":
            out[(Cell.from_dict(r["cell"]).key, r["example"])] = r
    return out


def references(records: Iterable[dict[str, Any]]) -> dict[tuple[str, int], dict[str, list[int]]]:
    """Greedy AR tokens per (dataset, max_new_tokens) and example.

    From ``reference`` records (written when the grid samples) and from ``ar`` cells at
    temperature 0 (which *are* greedy AR).
    """
    out: dict[tuple[str, int], dict[str, list[int]]] = {}
    for r in records:
        if r.get("type") == "reference":
            out.setdefault((r["dataset"], r["max_new_tokens"]), {})[r["example"]] = r["tokens"]
        elif r.get("type") == "record" and r.get("error") is None:
            c = r["cell"]
            if c["method"] == "ar" and c["sampling"]["temperature"] == 0:
                key = (c["dataset"], c["sampling"]["max_new_tokens"])
                out.setdefault(key, {})[r["example"]] = r["tokens"]
    return out


ALL_SEEDS = -1  # the seed of a row that pools every seed of its cell


def build_rows(
    records: Sequence[dict[str, Any]],
    order: Sequence[str] | None = None,
    combine_seeds: bool = False,
    baseline: str = "ar",
) -> list[Row]:
    """Rows of every cell in ``records`` (in ``order`` of cell keys first), with speedups and
    paired quality vs the ``baseline`` row (:func:`baseline_of`; default ``ar``).

    ``combine_seeds`` pools the records of all seeds of a cell into one row (seed ``ALL_SEEDS``):
    total tokens over total seconds again, never a mean of per-seed rates.
    """
    cells, by_cell, seeds = records_by_cell(records, combine_seeds)
    refs = references(records)
    keys = [k for k in (order or []) if k in cells] + [k for k in cells if k not in set(order or [])]

    def ref(k: str) -> dict[str, list[int]]:
        return refs.get((cells[k].dataset, cells[k].sampling["max_new_tokens"]), {})

    rows = [summarize_cell(cells[k], by_cell[k], ref(k)) for k in keys]
    labels = display_labels(cells.values())
    for row in rows:
        row.seeds = sorted(seeds[row.key])
        row.label = labels[row.key]

    def group(r: Row) -> tuple:
        return (r.dataset, r.seed, r.temperature, r.top_k, r.top_p, r.max_new_tokens)

    base: dict[tuple, Row] = {}
    for r in rows:
        if is_baseline(r, baseline):
            base.setdefault(group(r), r)
    for r in rows:
        b = base.get(group(r))
        if r.prompts and b is not None:
            r.speedup = speedup(r.tokens_per_second, b.tokens_per_second)
            if b.key != r.key and r.speedup is not None:
                r.speedup_ci = speed_interval(timings(by_cell[r.key]), timings(by_cell[b.key]))
    pair_rows(rows, {k: per_prompt(by_cell[k], ref(k)) for k in keys}, cells, baseline)
    return rows


def records_by_cell(
    records: Iterable[dict[str, Any]], combine_seeds: bool = False
) -> tuple[dict[str, Cell], dict[str, list[dict[str, Any]]], dict[str, set[int]]]:
    """(cells, latest records, seeds) by cell key; ``combine_seeds``: one pooled cell (seed
    ``ALL_SEEDS``) for all seeds of a runner."""
    cells: dict[str, Cell] = {}
    by_cell: dict[str, list[dict[str, Any]]] = {}
    seeds: dict[str, set[int]] = {}
    for r in latest_records(records).values():
        cell = Cell.from_dict(r["cell"])
        seed = cell.seed
        if combine_seeds:
            cell = replace(cell, seed=ALL_SEEDS)
        cells.setdefault(cell.key, cell)
        by_cell.setdefault(cell.key, []).append(r)
        seeds.setdefault(cell.key, set()).add(seed)
    return cells, by_cell, seeds


def cell_timings(records: Iterable[dict[str, Any]], combine_seeds: bool = False) -> dict[str, Timings]:
    """:func:`timings` of every cell by key (the keys :func:`build_rows` gives its rows)."""
    _, by_cell, _ = records_by_cell(records, combine_seeds)
    return {key: timings(rs) for key, rs in by_cell.items()}


def speed_between(x: Row, y: Row, times: dict[str, Timings] | None) -> tuple[float | None, dict | None]:
    """Speed of row ``x`` over row ``y`` (ratio of their throughputs) and its 95 % interval on
    their common prompts (:func:`speed_interval`; None without ``times``, the rows' timings)."""
    ratio = x.tokens_per_second / y.tokens_per_second if y.tokens_per_second else None
    if ratio is None or times is None or x.key not in times or y.key not in times:
        return ratio, None
    return ratio, speed_interval(times[x.key], times[y.key])


def pair_rows(
    rows: Sequence[Row],
    outcomes: dict[str, dict[str, dict[Outcome, float]]],
    cells: dict[str, Cell],
    baseline: str = "ar",
) -> None:
    """Set every row's paired comparison with its :func:`baseline_of` (same dataset, seed and
    sampling settings, engine included), from the per-prompt ``outcomes`` of each cell key."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        c = cells[r.key]
        groups.setdefault(json.dumps([c.dataset, c.seed, c.sampling], sort_keys=True), []).append(r)
    for group in groups.values():
        for r in group:
            base = baseline_of(r, group, baseline)
            if base is not None and r.prompts:
                r.paired = paired_figures(outcomes[r.key], outcomes[base.key], base.label)
