"""Benchmark results: cells, per-prompt records, rows, the results directory and its tables.

A results directory holds ``manifest.json`` (models with fingerprints, one entry per session with
its command line and environment) and ``records.jsonl`` (one JSON object per line, appended and
fsync'ed as soon as a generation is done): ``record`` lines — one cell on one prompt: tokens, text,
seconds, the engine's stats, quality, diagnostics counters or an error — and ``reference`` lines —
greedy AR tokens for agreement when the grid samples. The manifest and the tables are replaced
whole (:mod:`relaxspec.atomic`); a record torn by a kill is the last line, cut off at resume; a
resume refuses records the manifest does not account for (their models would be unknown).

Rows are always recomputed from the records (:func:`build_rows`), by the benchmark and the report
alike: throughput is total new tokens / total in-flight seconds of a cell, speedup is relative to
the ``ar`` cell of the same dataset, seed and sampling settings. Every quality figure (task
quality, agreement with greedy AR) carries its n and 95 % interval, every speedup its 95 %
interval over prompts, and every row a paired comparison with its baseline row on the same
prompts and seeds (:mod:`relaxspec.eval.intervals`).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from relaxspec import atomic
from relaxspec.engine import GenerationStats
from relaxspec.errors import RelaxSpecError
from relaxspec.eval import diagnostics, intervals
from relaxspec.eval.peers import family, is_peer, runner_params

RECORDS = "records.jsonl"
MANIFEST = "manifest.json"
FORMAT_VERSION = 1


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
    """Every parameter: ``nsd k=8 theta=0.9`` (identifies a runner)."""
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


# ---------------------------------------------------------------------------------------------
# Results directory: manifest + append-only records


CARD_RECORDS = ("training.json", "sweep.json")


def model_fingerprint(path: Path) -> str:
    """Hash of a model's config, tokenizer and weight files (to detect a changed model on resume).

    The records a model card is written from (``training.json``, ``sweep.json``) are left out:
    recording a metric measured later must not make earlier results look like another model's.
    """
    h = hashlib.sha1()
    files = [path] if path.is_file() else sorted(f for f in path.iterdir() if f.is_file())
    for f in files:
        if f.name in CARD_RECORDS:
            continue
        if f.suffix in (".json", ".safetensors", ".bin", ".pt", ".txt", ".model"):
            h.update(f.name.encode())
            with f.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:16]


class ResultsStore:
    """``<out>/manifest.json`` (models, sessions) and ``<out>/records.jsonl`` (one JSON per line)."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        if self.out.suffix == ".json":
            raise RelaxSpecError(f"--out is a directory for the results, not a .json file: {self.out}")
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            probe = self.out / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as err:
            raise RelaxSpecError(f"cannot write results to {self.out}: {err.strerror or err}") from None
        self.records = load_records(self.out) if (self.out / RECORDS).exists() else []
        self.manifest = load_manifest(self.out)
        check_sessions(self.out, self.records, self.manifest)
        trim_torn_tail(self.out / RECORDS)  # appends start on a line of their own

    def check_models(self, fingerprints: dict[str, dict[str, str]]) -> None:
        """Resuming with different models would mix incomparable numbers: refuse."""
        for role, info in fingerprints.items():
            old = self.manifest["models"].get(role)
            if old is not None and old["fingerprint"] != info["fingerprint"]:
                raise RelaxSpecError(
                    f"{self.out} holds results of a different {role} model ({old['path']}); "
                    "use a new --out directory"
                )
            kernels = info.get("kernels", "-")  # "-": not a transformers model
            old_kernels = old.get("kernels", "hf") if old is not None and kernels != "-" else kernels
            if old_kernels != kernels:
                raise RelaxSpecError(
                    f"{self.out} holds results of the {role} model on {old_kernels} kernels, this run "
                    f"uses {kernels}; pass --kernels {old_kernels} or use a new --out directory"
                )
        self.manifest["models"].update(fingerprints)

    def start_session(self, command: str) -> str:
        session = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.manifest["sessions"].append({"id": session, "command": command, "environment": environment()})
        self.save_manifest()
        return session

    def save_manifest(self) -> None:
        atomic.write_json(self.out / MANIFEST, self.manifest)

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        with (self.out / RECORDS).open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def done(self) -> set[tuple[str, str]]:
        """(cell key, example) pairs with a successful record."""
        return {k for k, r in latest_records(self.records).items() if r.get("error") is None}


def parse_record(line: str) -> dict[str, Any]:
    """One line of ``records.jsonl`` as a record; ValueError if it is not one."""
    try:
        r = json.loads(line)
        if r.get("type") == "record":
            Cell.from_dict(r["cell"])
            assert isinstance(r["example"], str) and isinstance(r["tokens"], list)
            assert isinstance(r["seconds"], int | float)
        elif r.get("type") == "reference":
            assert isinstance(r["tokens"], list) and isinstance(r["example"], str)
        else:
            raise ValueError(r.get("type"))
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError):
        raise ValueError("not a benchmark record") from None
    return r


def load_records(out: str | Path) -> list[dict[str, Any]]:
    """Every record of ``<out>/records.jsonl``; a malformed line is one clear error.

    A last line without its newline that is not a whole record is an append still in flight (or
    killed midway): it is skipped here, and :func:`trim_torn_tail` drops it before a resume.
    """
    path = Path(out) / RECORDS
    if not path.is_file():
        raise RelaxSpecError(f"no benchmark results in {out} (missing {RECORDS})")
    *lines, tail = path.read_text(encoding="utf-8").split("\n")
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(parse_record(line))
        except ValueError:
            raise RelaxSpecError(
                f"corrupted results file {path}, line {lineno}: not a benchmark record; delete that "
                "line to resume, or use a new --out directory"
            ) from None
    if tail.strip():
        with contextlib.suppress(ValueError):  # an append in flight: not a record yet
            records.append(parse_record(tail))
    return records


def trim_torn_tail(path: Path) -> None:
    """Make ``path`` end in a newline before anything is appended: a last line that is a whole
    record gets its newline, one that is not (a write killed midway) is cut off, with a note."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    try:
        parse_record(data[cut:].decode("utf-8"))
        with path.open("ab") as f:
            f.write(b"\n")
    except (ValueError, UnicodeDecodeError):
        with path.open("r+b") as f:
            f.truncate(cut)
        print(f"note: {path}: dropped an incomplete last record (an interrupted write)", file=sys.stderr)


def check_sessions(out: Path, records: Sequence[dict[str, Any]], manifest: dict[str, Any]) -> None:
    """Records the manifest does not account for cannot be resumed: without their session the
    models they were measured with are unknown, and a resume would mix them with this run's."""
    if records and not (out / MANIFEST).exists():
        raise RelaxSpecError(
            f"{out} holds {len(records)} benchmark records but no {MANIFEST} (the models they were "
            "measured with are unknown): restore it, or use a new --out directory"
        )
    known = {s.get("id") for s in manifest["sessions"]}
    orphans = sorted({r["session"] for r in records if r.get("session") and r["session"] not in known})
    if orphans:
        raise RelaxSpecError(
            f"{out}: records of session {', '.join(orphans)} that {MANIFEST} does not list (a manifest "
            "from elsewhere?): restore the right one, or use a new --out directory"
        )


def load_manifest(out: str | Path) -> dict[str, Any]:
    path = Path(out) / MANIFEST
    if not path.exists():
        return {"version": FORMAT_VERSION, "models": {}, "sessions": []}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        assert manifest["version"] == FORMAT_VERSION
        assert isinstance(manifest["models"], dict) and isinstance(manifest["sessions"], list)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise RelaxSpecError(
            f"corrupted results manifest {path} (not the JSON manifest a bench writes): restore it, or "
            "use a new --out directory"
        ) from None
    return manifest


def environment() -> dict[str, Any]:
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


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


def markdown_table(rows: Sequence[Row], columns: Sequence[tuple[str, Callable[[Row], str]]] = ()) -> str:
    cols = list(columns) or COLUMNS
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
    for name, _ in TERMINAL_COLUMNS:
        table.add_column(name, justify="left" if name == "runner" else "right")
    for r in rows:
        table.add_row(*(fn(r) for _, fn in TERMINAL_COLUMNS))
    Console(width=None if sys.stdout.isatty() else 160).print(table)
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
