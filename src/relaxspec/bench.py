"""``relaxspec bench``: methods side by side on the same prompts, in one process (DESIGN §6).

Measurement rules: models are loaded once; every runner is warmed up first; prompts are the outer
loop and runners the inner one (their order rotating per prompt), so machine drift hits all
runners alike; throughput is total new tokens / total in-flight seconds; speedup is throughput
over the ``ar`` throughput of the *same run*. Hugging Face ``generate()`` and assisted generation
run as peers on the same models and prompts.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from relaxspec.datasets import Example, load_examples
from relaxspec.engine import GenerationStats
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ModelSet, build_engine, get_method, resolve_params
from relaxspec.models import LoadedModel, load_model
from relaxspec.sampling import SamplingParams


@dataclass
class BenchConfig:
    methods: list[str]
    target: str
    draft: str | None = None
    dataset: str = "math"
    limit: int = 10
    k: int = 8
    theta: float = 0.95
    temperature: float = 0.0
    max_new_tokens: int = 128
    seed: int = 0
    peers: bool = True
    out: str | None = "results/bench.json"
    warmup_tokens: int = 16


@dataclass
class Record:
    """One runner on one prompt."""

    example: str
    tokens: list[int]
    text: str
    seconds: float
    stats: GenerationStats | None = None
    quality: float | None = None


@dataclass
class Row:
    """Aggregate of one runner over all prompts."""

    name: str
    new_tokens: int = 0
    seconds: float = 0.0
    tokens_per_second: float = 0.0
    speedup: float | None = None
    tau: float | None = None
    verifier_calls_per_token: float | None = None
    draft_calls_per_token: float | None = None
    time_split: dict[str, float] | None = None  # draft / verify / other, fractions of wall time
    position_acceptance: list[float] = field(default_factory=list)
    accepted_by_relaxation: int | None = None
    quality: float | None = None
    agreement_with_ar: float | None = None  # share of prompts token-identical to greedy ar


def _method_params(method: str, config: BenchConfig) -> dict[str, Any]:
    spec = get_method(method).params
    wanted = {"k": config.k, "theta": config.theta}
    return {name: value for name, value in wanted.items() if name in spec}


def _engine_runner(engine, params: SamplingParams) -> Callable[[Example], Record]:
    def run(ex: Example) -> Record:
        p = SamplingParams(**{**asdict(params), "stop": ex.stop})
        result = engine.generate(ex.prompt, p)
        return Record(ex.id, result.tokens, result.text, result.stats.total_seconds, result.stats)

    return run


def _hf_runner(
    target: LoadedModel, params: SamplingParams, assistant: LoadedModel | None, k: int
) -> Callable[[Example], Record]:
    """Hugging Face ``generate()`` (or assisted generation with ``assistant_model=``) as a peer."""
    tok = target.tokenizer
    eos = tok.eos_token_id

    def run(ex: Example) -> Record:
        ids = tok(ex.prompt, return_tensors="pt")["input_ids"]
        kwargs: dict[str, Any] = dict(
            max_new_tokens=params.max_new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=eos,
            do_sample=not params.greedy,
        )
        if not params.greedy:
            kwargs.update(temperature=params.temperature, top_k=params.top_k or None, top_p=params.top_p)
        if ex.stop:
            kwargs.update(stop_strings=list(ex.stop), tokenizer=tok)
        if assistant is not None:
            # Like for like with our sd: K draft tokens per round, not HF's adaptive schedule.
            assistant.model.generation_config.num_assistant_tokens = k
            assistant.model.generation_config.num_assistant_tokens_schedule = "constant"
            kwargs.update(assistant_model=assistant.model)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = target.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        seconds = time.perf_counter() - t0
        new = out[0, ids.shape[1] :].tolist()
        while new and new[-1] in (eos, tok.pad_token_id):
            new.pop()
        return Record(ex.id, new, tok.decode(new, skip_special_tokens=True), seconds)

    return run


def _aggregate(name: str, records: list[Record]) -> Row:
    row = Row(name)
    row.new_tokens = sum(len(r.tokens) for r in records)
    row.seconds = sum(r.seconds for r in records)
    row.tokens_per_second = row.new_tokens / row.seconds if row.seconds > 0 else 0.0
    stats = [r.stats for r in records if r.stats is not None]
    if stats:
        total = stats[0]
        for s in stats[1:]:
            total = total.merge(s)
        n = max(total.new_tokens, 1)
        row.tau = total.tau
        row.verifier_calls_per_token = total.verifier_calls / n
        row.draft_calls_per_token = total.draft_calls / n
        wall = max(total.total_seconds, 1e-12)
        row.time_split = {
            "draft": total.draft_seconds / wall,
            "verify": total.verify_seconds / wall,
            "other": total.other_seconds / wall,
        }
        row.position_acceptance = total.position_acceptance
        row.accepted_by_relaxation = total.accepted_by_relaxation
    scores = [r.quality for r in records if r.quality is not None]
    row.quality = sum(scores) / len(scores) if scores else None
    return row


def _environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def print_table(rows: list[Row], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in (
        "runner",
        "new tok",
        "sec",
        "tok/s",
        "speedup",
        "τ",
        "verif/tok",
        "draft/tok",
        "draft/verify/other",
        "quality",
        "= ar",
    ):
        table.add_column(col, justify="right" if col != "runner" else "left")
    fmt = lambda x, f="{:.2f}": "-" if x is None else f.format(x)  # noqa: E731
    for r in rows:
        split = (
            "-"
            if r.time_split is None
            else "/".join(f"{100 * r.time_split[k]:.0f}" for k in ("draft", "verify", "other"))
        )
        table.add_row(
            r.name,
            str(r.new_tokens),
            fmt(r.seconds),
            fmt(r.tokens_per_second, "{:.1f}"),
            fmt(r.speedup, "{:.2f}x"),
            fmt(r.tau),
            fmt(r.verifier_calls_per_token, "{:.3f}"),
            fmt(r.draft_calls_per_token),
            split,
            fmt(r.quality, "{:.3f}"),
            fmt(r.agreement_with_ar, "{:.2f}"),
        )
    Console().print(table)


def run_bench(config: BenchConfig, progress: bool = True) -> dict[str, Any]:
    """Run the benchmark, print the table, write JSON to ``config.out``; return the report."""
    if not config.methods:
        raise RelaxSpecError("no methods given")
    for m in config.methods:
        resolve_params(m, {})
    methods = list(dict.fromkeys(["ar", *config.methods]))  # speedups need ar from the same run
    if config.out is not None:
        out = Path(config.out)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("a"):
                pass
        except OSError as err:
            raise RelaxSpecError(f"cannot write benchmark output {out}: {err.strerror}") from None
    examples = load_examples(config.dataset, config.limit)
    params = SamplingParams(
        temperature=config.temperature, max_new_tokens=config.max_new_tokens, seed=config.seed
    )
    target = load_model(config.target)
    needs_draft = any("draft" in get_method(m).needs for m in methods) or config.peers
    draft = load_model(config.draft) if needs_draft and config.draft else None
    models = ModelSet(target=target, draft=draft)

    runners: dict[str, Callable[[Example], Record]] = {}
    for m in methods:
        engine = build_engine(m, models, **_method_params(m, config))
        label = m + "".join(f" {k}={v}" for k, v in _method_params(m, config).items())
        runners[label] = _engine_runner(engine, params)
    if config.peers:
        runners["hf-generate"] = _hf_runner(target, params, None, config.k)
        if draft is not None:
            runners["hf-assisted"] = _hf_runner(target, params, draft, config.k)

    warm = Example("warmup", examples[0].prompt)
    warm_params = SamplingParams(**{**asdict(params), "max_new_tokens": config.warmup_tokens})
    for m in methods:
        _engine_runner(build_engine(m, models, **_method_params(m, config)), warm_params)(warm)
    for name, run in runners.items():
        if name.startswith("hf-"):
            run(warm)

    from tqdm.auto import tqdm

    records: dict[str, list[Record]] = {name: [] for name in runners}
    names = list(runners)
    for i, ex in enumerate(tqdm(examples, desc="bench", disable=not progress)):
        order = names[i % len(names) :] + names[: i % len(names)]  # rotate to spread drift
        for name in order:
            rec = runners[name](ex)
            rec.quality = ex.score(rec.text)
            records[name].append(rec)

    rows = [_aggregate(name, recs) for name, recs in records.items()]
    ar_row = rows[0]
    ar_tokens = {r.example: r.tokens for r in records[names[0]]}
    for row in rows:
        if ar_row.tokens_per_second > 0:
            row.speedup = row.tokens_per_second / ar_row.tokens_per_second
        if params.greedy:
            same = [r.tokens == ar_tokens[r.example] for r in records[row.name]]
            row.agreement_with_ar = sum(same) / len(same)
    title = (
        f"{config.dataset} x{len(examples)}, T={config.temperature}, K={config.k}, "
        f"max_new_tokens={config.max_new_tokens}"
    )
    print_table(rows, title)
    report = {
        "config": asdict(config),
        "environment": _environment(),
        "rows": [asdict(r) for r in rows],
        "records": {
            name: [
                {
                    "example": r.example,
                    "new_tokens": len(r.tokens),
                    "seconds": r.seconds,
                    "quality": r.quality,
                    "stats": r.stats.to_dict() if r.stats else None,
                }
                for r in recs
            ]
            for name, recs in records.items()
        },
    }
    if config.out is not None:
        Path(config.out).write_text(json.dumps(report, indent=1))
    return report
