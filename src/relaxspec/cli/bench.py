"""Measuring: ``relaxspec bench``, ``tournament``, ``report``, ``calibrate``, ``reproduce``,
``eval`` and ``latency`` (docs/design.md §6); each is a thin layer over :mod:`relaxspec.eval`."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from relaxspec.cli.common import (
    DraftOpt,
    EngineOpt,
    KernelsOpt,
    TargetOpt,
    ThreadsOpt,
    app,
    configure_engine_threads,
    int_list,
    role_dir,
)


@app.command("bench")
def bench_cmd(
    methods: Annotated[str, typer.Option(help="comma-separated presets (ar is always added)")] = "ar,sd,nsd",
    dataset: Annotated[str, typer.Option(help="math, code, humaneval or .jsonl (comma-separated)")] = "math",
    prompts: Annotated[
        Path | None,
        typer.Option(
            help="a .jsonl task file: {prompt, id?, answer?, stop?} rows (exact match), or HumanEval "
            "rows {task_id, prompt, test, entry_point, canonical_solution?} (pass@1 in the sandbox)"
        ),
    ] = None,
    limit: Annotated[int, typer.Option(help="prompts per dataset")] = 10,
    temperature: Annotated[
        str,
        typer.Option(
            help="sampling temperature; several (e.g. 1,0.9) run the whole grid at each, in one run"
        ),
    ] = "0",
    top_k: int = 0,
    top_p: float = 1.0,
    seeds: Annotated[str, typer.Option(help="comma-separated seeds, one cell per seed")] = "0",
    max_new_tokens: int = 128,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="sweep: [method.]name=v1,v2 (repeatable), e.g. nsd.theta=0.9,0.95"),
    ] = None,
    k: Annotated[int | None, typer.Option(help="draft length of every method that has one")] = None,
    peers: Annotated[
        str, typer.Option(help="hf-generate,hf-assisted,hf-lookup,vllm-ar,vllm-sd, auto or none")
    ] = "auto",
    target: TargetOpt = None,
    draft: DraftOpt = None,
    model: Annotated[
        list[str] | None, typer.Option(help="model of another role: role=DIR (block, diffusion, ...)")
    ] = None,
    out: Annotated[Path, typer.Option(help="results directory (re-running resumes it)")] = Path("results"),
    diagnostics: Annotated[bool, typer.Option(help="collect the papers' per-cycle diagnostics")] = False,
    warmup_tokens: int = 16,
    exec_timeout: Annotated[float, typer.Option(help="seconds per HumanEval test run")] = 10.0,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    engine: EngineOpt = "relaxspec",
    kernels: KernelsOpt = "auto",
    baseline: Annotated[
        str,
        typer.Option(
            help="the row speedup and paired Δ quality are measured against: a runner label or method "
            "(e.g. vllm-ar for rows verified by the model that peer decodes)"
        ),
    ] = "ar",
    threads: ThreadsOpt = None,
    busy_neighbour: Annotated[
        int,
        typer.Option(
            help="contention benchmark: run N busy-loop processes, each pinned to one CPU, for the "
            "whole run (docs/performance.md)"
        ),
    ] = 0,
) -> None:
    """Benchmark a grid of methods in one process: table, records, JSON, CSV and Markdown in --out.

    With --engine vllm the methods run inside vLLM with the plugin and the default peers are stock
    vLLM (vllm-ar, vllm-sd).
    """
    from relaxspec.eval.bench import BenchConfig, run_bench
    from relaxspec.eval.grid import parse_models, parse_peers, parse_seeds, parse_temperatures, split_list

    temps = parse_temperatures(temperature)
    config = BenchConfig(
        methods=split_list(methods),
        datasets=[str(prompts)] if prompts is not None else split_list(dataset),
        limit=limit,
        temperature=temps[0],
        more_temperatures=temps[1:],
        top_k=top_k,
        top_p=top_p,
        seeds=parse_seeds(seeds),
        max_new_tokens=max_new_tokens,
        sets=[*(set_ or []), *([f"k={k}"] if k is not None else [])],
        peers=parse_peers(peers),
        models=parse_models(target, draft, model or []),
        out=str(out),
        warmup_tokens=warmup_tokens,
        diagnostics=diagnostics,
        exec_timeout=exec_timeout,
        progress=progress,
        command=shlex.join(["relaxspec", *sys.argv[1:]]),
        engine=engine,
        kernels=kernels,
        baseline=baseline,
    )
    from relaxspec.eval.contention import busy_neighbours

    with busy_neighbours(busy_neighbour):
        configure_engine_threads(threads, engine)  # after the neighbours start: they are not ours
        run_bench(config)


@app.command("tournament")
def tournament_cmd(
    dataset: Annotated[
        str, typer.Option(help="datasets (comma-separated), e.g. math,synthcode-combos")
    ] = "math",
    temperatures: Annotated[str, typer.Option(help="comma-separated temperatures, one grid each")] = "0,1",
    rules: Annotated[str, typer.Option(help="relaxed rules to sweep (comma-separated)")] = (
        "nsd,topk,typical,lenience,topk-delta,threshold,fly"
    ),
    limit: Annotated[int, typer.Option(help="prompts per dataset")] = 20,
    seeds: Annotated[str, typer.Option(help="comma-separated seeds")] = "0",
    k: Annotated[int, typer.Option(help="draft length of every speculative row")] = 4,
    top_p: Annotated[float, typer.Option(help="top-p of every sampling row but plain AR (T > 0)")] = 0.95,
    max_new_tokens: int = 128,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    out: Annotated[Path, typer.Option(help="results directory (re-running resumes it)")] = Path(
        "results/tournament"
    ),
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    grid: Annotated[
        list[str] | None,
        typer.Option(help="replace a rule's grid, e.g. nsd.theta=0.8 (repeatable)"),
    ] = None,
) -> None:
    """Every relaxed rule over a grid of its parameter beside greedy AR, top-p AR and exact SD on
    the same models, prompts and seeds: table, speed–quality frontier plot, JSON and a verdict per
    dataset and temperature (docs/relaxed-rules.md)."""
    from relaxspec.eval.grid import parse_models, parse_seeds, parse_temperatures, split_list
    from relaxspec.eval.tournament import TournamentConfig, parse_grid, run_tournament

    temps = parse_temperatures(temperatures, "--temperatures")
    config = TournamentConfig(
        datasets=split_list(dataset),
        temperatures=temps,
        rules=split_list(rules),
        limit=limit,
        seeds=parse_seeds(seeds),
        k=k,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        models=parse_models(target, draft, []),
        out=str(out),
        progress=progress,
        command=shlex.join(["relaxspec", *sys.argv[1:]]),
        grid=parse_grid(grid or []),
    )
    run_tournament(config)


@app.command("report")
def report_cmd(
    results: Annotated[list[Path], typer.Argument(help="results directories written by relaxspec bench")],
    out: Annotated[Path | None, typer.Option(help="Markdown file (default: <results>/report.md)")] = None,
    title: str = "relaxspec benchmark report",
    html: Annotated[bool, typer.Option(help="also write an HTML version next to the Markdown")] = True,
) -> None:
    """Render a Markdown (and HTML) report with plots from one or more results directories."""
    from relaxspec.eval.report import render_report

    path = render_report(results, out or results[0] / "report.md", title=title, html=html)
    print(f"wrote {path}")


@app.command("calibrate")
def calibrate_cmd(
    results: Annotated[Path, typer.Argument(help="a results directory written by relaxspec bench")],
    target: Annotated[
        Path | None, typer.Option(help="the run's target, if it moved (its fingerprint must match)")
    ] = None,
    law_temperature: Annotated[
        float | None,
        typer.Option(help="check every row against the target's law at this temperature, not its own"),
    ] = None,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Does each sampling row (T > 0) emit tokens from the target's law? Per-token martingale
    z-scores from one teacher-forced target forward per record; a table, and JSON in the results."""
    from relaxspec.eval.calibration import calibrate, calibration_path, calibration_table

    rows = calibrate(results, target_dir=target, progress=progress, against=law_temperature)
    print(calibration_table(rows))
    print(f"wrote {calibration_path(results, law_temperature)}")


@app.command("reproduce")
def reproduce_cmd(
    out: Annotated[Path, typer.Option(help="the report to write")] = Path("docs/results.md"),
    results: Annotated[Path, typer.Option(help="where the experiments' results directories go")] = Path(
        "results/reproduce"
    ),
    limit: Annotated[int, typer.Option(help="prompts per dataset")] = 30,
    max_new_tokens: int = 128,
    only: Annotated[str | None, typer.Option(help="comma-separated experiment names (default: all)")] = None,
    progress: bool = True,
) -> None:
    """Re-run the papers' headline comparisons at our scale and write docs/results.md."""
    from relaxspec.eval.reproduce import reproduce

    path = reproduce(
        out,
        results,
        limit=limit,
        max_new_tokens=max_new_tokens,
        only=[x.strip() for x in only.split(",")] if only else None,
        progress=progress,
        command=shlex.join(["relaxspec", *sys.argv[1:]]),
    )
    print(f"wrote {path}")


@app.command("eval")
def eval_cmd(
    model: Annotated[Path | None, typer.Option(help="model directory (default: bundled target)")] = None,
    corpus: Path = Path("data/corpus"),
    limit: int = 500,
    out: Path | None = None,
) -> None:
    """Math exact-match accuracy (greedy) and held-out code loss of one model, as JSON."""
    from relaxspec.eval.evaluate import evaluate_model

    report = evaluate_model(role_dir(model, "target"), corpus, limit=limit, out=out)
    print(json.dumps(report, indent=1))


@app.command("latency")
def latency_cmd(
    model: Annotated[
        list[Path] | None, typer.Option(help="model directory (repeatable; default: target and draft)")
    ] = None,
    widths: Annotated[
        str, typer.Option(help="tokens per forward T to time (1 = decode; K+1 = verify)")
    ] = "1,5,9",
    context: int = 64,
    decode_steps: int = 64,
    rounds: int = 5,
    out: Path | None = None,
    kernels: KernelsOpt = "auto",
) -> None:
    """Forward latency (KV cache) of several models, interleaved in one run: ms per call and ratios."""
    from relaxspec.eval.evaluate import forward_latency, write_report

    dirs = model or [role_dir(None, "target"), role_dir(None, "draft")]
    width_list = int_list(widths, "widths")
    report = forward_latency(
        {str(d): d for d in dirs}, context=context, decode_steps=decode_steps, rounds=rounds,
        widths=tuple(width_list), kernels=kernels,
    )  # fmt: skip
    first = next(iter(report))
    columns = sorted(next(iter(report.values()))["ms_per_call"])
    print(f"{'model':<28} {'params':>10} {'kernels':>11} "
          + " ".join(f"{'T=' + str(w) + ' ms':>9}" for w in columns) + f" {'T=1 ratio':>10}")  # fmt: skip
    for name, row in report.items():
        calls = " ".join(f"{row['ms_per_call'][w]:>9.3f}" for w in columns)
        print(f"{name:<28} {row['parameters']:>10,} {row['kernels']:>11} {calls} "
              f"{row['ratio_to_first']:>10.2f}")  # fmt: skip
    print(f"(T=1 ratio: {first}'s per-token latency divided by each model's)")
    if out is not None:
        write_report(out, report)
