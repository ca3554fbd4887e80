"""``relaxspec bench``: a grid of methods × parameters × datasets × seeds, in one process (docs/design.md §6).

Measurement rules:

- models are loaded once; every runner is warmed up before the first timed generation;
- prompts are the outer loop and the grid's cells the inner one, their order rotating per prompt,
  so machine drift hits all cells alike;
- throughput is total new tokens / total in-flight seconds of a cell (never a mean of per-prompt
  rates); speedup is a cell's throughput over that of the ``ar`` cell of the *same run*, dataset,
  seed and sampling settings (``ar`` is always part of the grid);
- Hugging Face ``generate()``, assisted generation (``assistant_model=``) and prompt lookup
  (``prompt_lookup_num_tokens=``) run as peers on the same models and prompts, as their own rows;
- quality (math exact match, HumanEval pass@1) and agreement with greedy AR are computed outside
  the timed region; a pass@1 record carries the code sandbox's isolation (``sandbox``), and a row
  whose pass@1 was not measured in the namespace sandbox is marked untrusted.

Every (cell, prompt) result is appended to ``<out>/records.jsonl`` as soon as it exists, so an
interrupted run resumes where it stopped (finished prompts are skipped; failed ones run again).
Rows are always recomputed from the records (:func:`build_rows`), by the benchmark and by the
report alike. A crash in one cell is recorded in that cell and the grid goes on.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.packed import kernels_of
from relaxspec.engine.proposers.eagle import is_eagle_dir
from relaxspec.errors import RelaxSpecError, check_int
from relaxspec.eval import diagnostics
from relaxspec.eval.datasets import Example, load_examples
from relaxspec.eval.grid import expand_grid, parse_sets
from relaxspec.eval.peers import (
    PEERS,
    Runner,
    hf_runner,
    is_peer,
    llamacpp_runner,
    runner_needs,
    runner_optional,
)
from relaxspec.eval.records import ResultsStore, model_fingerprint
from relaxspec.eval.rows import Cell, Row, build_rows, display_labels, references
from relaxspec.eval.tables import print_table, write_outputs
from relaxspec.integrations import llamacpp
from relaxspec.integrations.vllm import runners as vllm_runners
from relaxspec.methods import ModelSet, build_engine, load_role
from relaxspec.models import bundled, model_dir

# ---------------------------------------------------------------------------------------------
# The grid


@dataclass
class BenchConfig:
    methods: list[str]
    datasets: list[str] = field(default_factory=lambda: ["math"])
    limit: int = 10
    temperature: float = 0.0
    # The whole grid again at each of these temperatures, interleaved in the same run (so a row at
    # one temperature and a row at another compare on the same timings); every temperature > 0.
    more_temperatures: list[float] = field(default_factory=list)
    top_k: int = 0
    top_p: float = 1.0
    seeds: list[int] = field(default_factory=lambda: [0])
    max_new_tokens: int = 128
    sets: list[str] = field(default_factory=list)  # "[method.]name=v1,v2"
    peers: list[str] | None = None  # None: every peer whose models are available
    models: dict[str, str | None] = field(default_factory=dict)  # role -> directory (default bundled)
    out: str = "results"
    warmup_tokens: int = 16
    diagnostics: bool = False
    exec_timeout: float = 10.0  # seconds per HumanEval test program
    progress: bool = True
    command: str = ""  # the command line, recorded in the manifest
    engine: str = "relaxspec"  # "vllm": methods run inside vLLM with the plugin (docs/design.md §8)
    kernels: str = "auto"  # our engine's forwards: engine/packed.py KERNELS
    baseline: str = "ar"  # the row speedups and paired quality are measured against (label or method)


def _check_config(config: BenchConfig) -> None:
    if not config.methods:
        raise RelaxSpecError("no methods given")
    if not config.datasets:
        raise RelaxSpecError("no dataset given")
    check_int("--limit", config.limit, 1)
    if not config.seeds or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in config.seeds
    ):
        raise RelaxSpecError(f"seeds must be non-negative integers, got {config.seeds!r}")
    temperatures = [config.temperature, *config.more_temperatures]
    for t in temperatures:
        SamplingParams(
            temperature=t, top_k=config.top_k, top_p=config.top_p, max_new_tokens=config.max_new_tokens
        )
    if len(temperatures) > 1 and (len(set(temperatures)) < len(temperatures) or min(temperatures) <= 0):
        raise RelaxSpecError(
            f"several temperatures must be distinct and all > 0 (greedy rows run alone), got {temperatures}"
        )


def plan(config: BenchConfig) -> list[Cell]:
    """The grid of ``config`` (validates methods, peers and ``--set`` names before any model loads)."""
    _check_config(config)
    sampling = {
        "temperature": config.temperature,
        "top_k": config.top_k,
        "top_p": config.top_p,
        "max_new_tokens": config.max_new_tokens,
    }
    if config.engine not in ("relaxspec", "vllm"):
        raise RelaxSpecError(f"--engine must be relaxspec or vllm, got {config.engine!r}")
    default_peers = list(vllm_runners.DEFAULT_PEERS) if config.engine == "vllm" else list(PEERS)
    if config.engine == "vllm":
        sampling["engine"] = "vllm"  # part of each cell's identity: no mixing with our engine's rows
    peers = default_peers if config.peers is None else config.peers
    cells = expand_grid(
        config.methods, peers, parse_sets(config.sets), config.datasets, config.seeds, sampling, config.engine
    )
    cells += [
        replace(c, sampling={**c.sampling, "temperature": t})
        for t in config.more_temperatures
        for c in list(cells)
    ]
    if config.peers is None:  # default peers: only those whose models exist
        have = {r for r in ("target", "draft") if Path(config.models.get(r) or bundled(r)).exists()}
        if is_eagle_dir(config.models.get("draft") or bundled("draft")):
            have.discard("draft")  # HF's assisted generation needs a causal LM, not an EAGLE head
        cells = [c for c in cells if not is_peer(c.method) or set(runner_needs(c.method)) <= have]
    return cells


# ---------------------------------------------------------------------------------------------
# Runners and models


def _engine_runner(
    method: str, params: dict[str, Any], models: ModelSet, sampling: SamplingParams, collect: bool
) -> Runner:
    engine = build_engine(method, models, **params)

    def run(ex: Example, seed: int, max_new_tokens: int | None = None) -> dict[str, Any]:
        cycles: list = []
        budget = max_new_tokens or sampling.max_new_tokens
        result = engine.generate(
            ex.prompt,
            replace(sampling, seed=seed, stop=ex.stop, max_new_tokens=budget),
            on_cycle=cycles.append if collect else None,
        )
        out = {
            "tokens": result.tokens,
            "text": result.text,
            "seconds": result.stats.total_seconds,
            "stats": result.stats.to_dict(),
        }
        if collect:
            out["diagnostics"] = diagnostics.collect(
                diagnostics.Generation(
                    method,
                    params,
                    cycles,
                    engine.encode(ex.prompt),
                    result.tokens,
                    models,
                    greedy=sampling.temperature == 0,
                )
            )
        return out

    return run


def make_runner(
    cell: Cell, models: ModelSet, collect: bool, pool: vllm_runners.EnginePool | None = None
) -> Runner:
    s = cell.sampling
    sampling = SamplingParams(
        temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"], max_new_tokens=s["max_new_tokens"]
    )
    if s.get("engine") == "vllm" or vllm_runners.is_peer(cell.method):
        if pool is None:
            raise RelaxSpecError("vLLM rows need an engine pool")
        return vllm_runners.runner(cell.method, cell.params, sampling, pool)
    if llamacpp.is_peer(cell.method):
        return llamacpp_runner(cell.method, cell.params, models, sampling)
    if is_peer(cell.method):
        return hf_runner(cell.method, cell.params, models, sampling)
    return _engine_runner(cell.method, cell.params, models, sampling, collect)


def model_paths(cells: Iterable[Cell], paths: dict[str, str | Path | None]) -> dict[str, Path]:
    """Directory of every role the grid uses: required ones (missing: clear error), optional ones
    where given or bundled (a method whose chosen parameters need a missing one fails in its cell).
    """
    cells = list(cells)
    out: dict[str, Path] = {}
    for role in dict.fromkeys(r for c in cells for r in runner_needs(c.method)):
        out[role] = model_dir(role, paths.get(role), "the grid")
    for role in dict.fromkeys(r for c in cells for r in runner_optional(c.method)):
        path = model_dir(role, paths.get(role), required=False)
        if role not in out and path is not None:
            out[role] = path
    return out


def role_kernels(models: ModelSet, role: str) -> str:
    """What ``role``'s decoding forwards run on (``hf``, ``packed``, ``packed-bf16``; ``-``: not a
    transformers model)."""
    model = getattr(getattr(models, role, None), "model", None)
    return kernels_of(model) if isinstance(model, PreTrainedModel) else "-"


def load_role_models(paths: dict[str, Path], kernels: str = "auto") -> ModelSet:
    """Each role once, with its role's loader (``kernels``: see :func:`load_role`)."""
    models = ModelSet()
    for role, path in paths.items():
        setattr(models, role, load_role(role, path, kernels))
    return models


# ---------------------------------------------------------------------------------------------
# The benchmark


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".strip()


def progress_bar(enabled: bool):
    """A rich progress bar on stderr (a no-op when not ``enabled``); its task takes a ``cell`` field."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[cell]}"),
        console=Console(stderr=True),
        disable=not enabled,
    )


def fitting_examples(examples: dict[str, list[Example]], models: ModelSet) -> dict[str, list[Example]]:
    """Drop prompts that leave no room to generate in the smallest context window of the run.

    Every cell then sees the same prompts (a prompt too long for the context would otherwise fail
    in some cells only). Says on stderr what it dropped; no prompt left is an error.
    """
    lms = [
        m for m in (models.target, models.draft, models.block) if getattr(m, "tokenizer", None) is not None
    ]
    if not lms:
        return examples
    context = min(m.context_length for m in lms)
    tok = lms[0].tokenizer
    out = {}
    for dataset, exs in examples.items():
        keep = [ex for ex in exs if len(tok(ex.prompt)["input_ids"]) < context]
        if len(keep) < len(exs):
            print(
                f"note: {dataset}: skipping {len(exs) - len(keep)} of {len(exs)} prompts longer than the "
                f"context window ({context} tokens)",
                file=sys.stderr,
            )
        if not keep:
            raise RelaxSpecError(
                f"dataset {dataset!r}: no prompt fits the context window of {context} tokens"
            )
        out[dataset] = keep
    return out


def warm_up(
    cells: Sequence[Cell],
    models: ModelSet,
    examples: dict[str, list[Example]],
    config: BenchConfig,
    pool: vllm_runners.EnginePool | None = None,
) -> tuple[dict[str, Runner], dict[str, str]]:
    """Build and warm up one runner per (method, params, sampling): (runners, errors) keyed by
    ``Cell.runner_key``.

    A runner that cannot be built or fails its warm-up generation is an error of its cells only.
    """
    runners: dict[str, Runner] = {}
    broken: dict[str, str] = {}
    for cell in cells:
        key = cell.runner_key
        if key in runners or key in broken:
            continue
        try:
            run = make_runner(cell, models, config.diagnostics, pool)
            run(Example("warmup", examples[cell.dataset][0].prompt), 0, config.warmup_tokens)
            runners[key] = run
        except Exception as err:  # recorded in the cell, the grid goes on
            broken[key] = _error(err)
    return runners, broken


def example_seed(seed: int, example_id: str) -> int:
    """The sampler's seed for one prompt of a cell with seed ``seed``: a stable 63-bit hash of both.

    One seed for every prompt would draw the same uniform stream for each of them, so their
    outcomes would be correlated (one unlucky stream sinks many prompts together) and intervals
    that treat prompts as independent would be too narrow. Every row of a grid uses the same
    per-prompt seeds, so rows stay paired.
    """
    digest = hashlib.blake2b(f"{seed}:{example_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def run_cell(runner: Runner, ex: Example, seed: int, exec_timeout: float) -> dict[str, Any]:
    """One timed generation plus its (untimed) quality score, as record fields; errors recorded.
    ``seed`` is the cell's; the sampler gets :func:`example_seed` of it and the prompt."""
    try:
        out = runner(ex, example_seed(seed, ex.id), None)
        quality, sandbox = ex.evaluate(out["text"], exec_timeout)
        return {**out, "metric": ex.metric, "quality": quality, "sandbox": sandbox, "error": None}
    except Exception as err:  # recorded in the cell, the grid goes on
        return {"error": _error(err)}


def reference_record(runner: Runner, dataset: str, ex: Example, max_new_tokens: int) -> dict[str, Any] | None:
    """Greedy AR tokens of one prompt (for agreement when the grid samples); None if it fails."""
    try:
        tokens = runner(ex, 0, None)["tokens"]
    except Exception as err:  # agreement is then missing for this prompt only
        print(f"warning: greedy AR reference failed on {ex.id}: {_error(err)}", file=sys.stderr)
        return None
    return {
        "type": "reference",
        "dataset": dataset,
        "example": ex.id,
        "max_new_tokens": max_new_tokens,
        "tokens": tokens,
    }


def check_baseline(baseline: str, cells: Sequence[Cell]) -> None:
    """``--baseline`` must name a row of the grid (a runner label as the table shows it, or a
    method); ``ar`` is always there."""
    names = set(display_labels(cells).values()) | {c.method for c in cells}
    if baseline not in names:
        raise RelaxSpecError(
            f"--baseline {baseline!r} names no row of the grid; rows: {', '.join(sorted(names))}"
        )


def run_bench(config: BenchConfig, extra_cells: Sequence[Cell] = ()) -> dict[str, Any]:
    """Run (or resume) the grid; write records, JSON, CSV and Markdown to ``config.out``.

    ``extra_cells``: cells beyond the grid of ``config`` (e.g. the tournament's top-p AR, whose
    sampling differs from the grid's). Returns ``{"rows": [...], "out": path}`` for the whole
    results directory.
    """
    cells = plan(config) + list(extra_cells)
    check_baseline(config.baseline, cells)
    examples = {d: load_examples(d, config.limit) for d in config.datasets}
    store = ResultsStore(config.out)
    paths = model_paths(cells, config.models)
    models = load_role_models(paths, config.kernels)
    store.check_models(
        {
            role: {"path": str(p), "fingerprint": model_fingerprint(p), "kernels": role_kernels(models, role)}
            for role, p in paths.items()
        }
    )
    examples = fitting_examples(examples, models)
    session = store.start_session(config.command or " ".join(sys.argv))

    done = store.done()
    pending = [(c, ex) for c in cells for ex in examples[c.dataset] if (c.key, ex.id) not in done]
    refs = references(store.records)
    need_ref = {
        (d, ex.id)
        for d in config.datasets
        for ex in examples[d]
        if config.temperature > 0 and ex.id not in refs.get((d, config.max_new_tokens), {})
    }
    pool = None
    if any(is_vllm_cell(c) for c in cells):
        pool = vllm_runners.EnginePool(target=paths.get("target"), draft=paths.get("draft"))
    try:
        rows = _run_grid(config, cells, examples, store, models, session, pending, need_ref, pool)
    finally:
        llamacpp.close_all()
        if pool is not None:
            pool.close()  # before the table: vLLM's shutdown log must not follow (bury) it
    grid = {c.key for c in cells}
    print_table([r for r in rows if r.key in grid], title=_title(config))
    return {"rows": [asdict(r) for r in rows], "out": str(store.out)}


def _run_grid(
    config: BenchConfig,
    cells: list[Cell],
    examples: dict[str, list[Example]],
    store: ResultsStore,
    models: ModelSet,
    session: Any,
    pending: list[tuple[Cell, Example]],
    need_ref: set[tuple[str, str]],
    pool: vllm_runners.EnginePool | None,
) -> list[Row]:
    """The timed loop of :func:`run_bench` (prompts outer, cells inner and rotated); the rows
    built from every record of the store, written with the manifest."""
    runners, broken = warm_up(list({c.key: c for c, _ in pending}.values()), models, examples, config, pool)
    ref_cell = Cell("ar", {}, "", 0, {**cells[0].sampling, "temperature": 0.0})
    reference = make_runner(ref_cell, models, False, pool)
    todo = {(c.key, ex.id) for c, ex in pending}
    base = {"type": "record", "session": session, "tokens": [], "seconds": 0.0, "stats": None}

    with progress_bar(config.progress) as progress:
        task = progress.add_task("bench", total=len(pending) + len(need_ref), cell="")
        for dataset in config.datasets:
            row_cells = [c for c in cells if c.dataset == dataset]
            for i, ex in enumerate(examples[dataset]):
                if (dataset, ex.id) in need_ref:
                    progress.update(task, cell=f"greedy AR reference · {ex.id}")
                    ref = reference_record(reference, dataset, ex, config.max_new_tokens)
                    if ref is not None:
                        store.append(ref)
                    progress.advance(task)
                shift = i % max(len(row_cells), 1)
                for cell in row_cells[shift:] + row_cells[:shift]:  # rotate to spread drift
                    if (cell.key, ex.id) not in todo:
                        continue
                    progress.update(task, cell=f"{cell.label} · seed {cell.seed} · {ex.id}")
                    key = cell.runner_key
                    if key in broken:
                        out = {"error": broken[key]}
                    else:
                        if pool is not None and not is_vllm_cell(cell):
                            pool.settle()  # our rows are timed with vLLM's workers quiet
                        out = run_cell(runners[key], ex, cell.seed, config.exec_timeout)
                    store.append({**base, "cell": cell.to_dict(), "example": ex.id, **out})
                    progress.advance(task)

    rows = build_rows(store.records, [c.key for c in cells], baseline=config.baseline)
    write_outputs(store.out, rows, store.manifest)
    return rows


def is_vllm_cell(cell: Cell) -> bool:
    """A cell that runs in vLLM (a stock peer, or a method on ``--engine vllm``)."""
    return cell.sampling.get("engine") == "vllm" or vllm_runners.is_peer(cell.method)


def _title(config: BenchConfig) -> str:
    vs = "" if config.baseline == "ar" else f", speedup and Δ quality vs {config.baseline}"
    return (
        f"{', '.join(config.datasets)} x{config.limit}, T={config.temperature}, "
        f"seeds={','.join(map(str, config.seeds))}, max_new_tokens={config.max_new_tokens}{vs}"
    )
