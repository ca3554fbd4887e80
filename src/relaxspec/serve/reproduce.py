"""Do seeded and greedy requests reproduce through a running server? (issue 36, docs/server.md
"Reproducibility").

The same requests — half greedy, half sampled at T = 1 with a seed each — go to a server several
times: the first half of the runs one request at a time, the rest from several concurrent clients
in a shuffled order (so each request meets different neighbours, methods mixed). A request
reproduces when every run returned the same text. Servers are spawned with
:class:`~relaxspec.serve.loadtest.SpawnedServer` on free loopback ports: for ``relaxspec`` one
server (adaptive K on) that takes every method as a per-request override; for ``vllm`` one server
with the plugin and a batch-size schedule of K (vLLM's form of an adaptive draft length) for the
speculative methods (the rule per request in ``vllm_xargs``) and one without speculation for
``ar``. ``scripts/reproducible.py`` is the command line.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from relaxspec.errors import RelaxSpecError, check_int
from relaxspec.serve.loadtest import LoadtestConfig, Prompt, SpawnedServer, load_prompts

ENGINES = ("relaxspec", "vllm")
METHODS = ("ar", "sd", "nsd")
REGIMES = ("greedy", "seeded")
VLLM_DTYPES = ("auto", "bfloat16", "float16", "float32")
SERVED_NAME = "relaxspec"  # both servers' default model id


@dataclass
class ReproConfig:
    """What to send. ``prompts`` requests per method: the first half greedy, the rest at
    ``temperature`` with seed ``seed + i``; ``runs`` passes, the first half sequential."""

    engine: str = "relaxspec"
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    dataset: str = "math"
    prompts: int = 20
    runs: int = 4
    concurrency: int = 4
    max_tokens: int = 48
    temperature: float = 1.0
    seed: int = 0
    k: int = 4
    theta: float = 0.8
    k_schedule: str = "1-2:4,3-8:2,9-1024:0"  # vLLM only: K = 4 for 1-2 running requests, 2 to 8
    max_model_len: int = 512  # vLLM only
    vllm_dtype: str | None = None  # vLLM only: its --dtype (e.g. float32); None: the model's (bf16)
    startup_timeout: float = 900.0
    timeout: float = 600.0


@dataclass(frozen=True)
class Job:
    """One request: a method on one prompt, in one regime."""

    method: str
    index: int  # prompt index
    regime: str  # "greedy" or "seeded"


def validate(config: ReproConfig) -> None:
    """One clear error per bad setting (:class:`RelaxSpecError`)."""
    if config.engine not in ENGINES:
        raise RelaxSpecError(f"--engine must be one of {', '.join(ENGINES)}, got {config.engine!r}")
    bad = [m for m in config.methods if m not in METHODS]
    if bad or not config.methods or len(set(config.methods)) != len(config.methods):
        raise RelaxSpecError(
            f"--methods takes distinct names among {', '.join(METHODS)}, got {bad or config.methods}"
        )
    if config.vllm_dtype not in (None, *VLLM_DTYPES):
        raise RelaxSpecError(f"--vllm-dtype must be one of {', '.join(VLLM_DTYPES)}, got {config.vllm_dtype}")
    check_int("--prompts", config.prompts, 2)
    if config.prompts % 2:
        raise RelaxSpecError(f"--prompts must be even (half greedy, half seeded), got {config.prompts}")
    check_int("--runs", config.runs, 2)
    check_int("--concurrency", config.concurrency, 2)
    check_int("--max-tokens", config.max_tokens, 1)
    check_int("--k", config.k, 1)
    check_int("--seed", config.seed, 0)
    if not 0 < config.temperature <= 10:
        raise RelaxSpecError(f"--temperature must be in (0, 10], got {config.temperature}")
    if not 0 < config.theta <= 1:
        raise RelaxSpecError(f"--theta must be in (0, 1], got {config.theta}")
    if config.engine == "vllm":
        from relaxspec.integrations.vllm.serve import parse_k_schedule

        if max(k for _, _, k in parse_k_schedule(config.k_schedule)) > config.k:
            raise RelaxSpecError(f"--k-schedule asks for more than --k = {config.k} draft tokens")


def jobs(config: ReproConfig) -> list[Job]:
    half = config.prompts // 2
    return [
        Job(m, i, "greedy" if i < half else "seeded") for m in config.methods for i in range(config.prompts)
    ]


def request_body(job: Job, prompt: Prompt, config: ReproConfig) -> dict[str, Any]:
    """The completion request of ``job`` (the method as the engine's server takes it)."""
    body: dict[str, Any] = {"model": SERVED_NAME, "prompt": prompt.text, "max_tokens": config.max_tokens}
    if job.regime == "greedy":
        body["temperature"] = 0.0
    else:
        body["temperature"] = config.temperature
        body["seed"] = config.seed + job.index
    if prompt.stop:
        body["stop"] = list(prompt.stop)[:4]  # OpenAI's limit
    params: dict[str, Any] = {"k": config.k} if job.method != "ar" else {}
    if job.method == "nsd":
        params["theta"] = config.theta
    if config.engine == "relaxspec":
        body["relaxspec"] = {"method": job.method, "params": params}
    elif job.method != "ar":  # vLLM: K is the server's; the rule per request
        body["vllm_xargs"] = {"rule": job.method, **({"theta": config.theta} if job.method == "nsd" else {})}
    return body


def spawn_servers(config: ReproConfig, stack: ExitStack, log_dir: Path | None = None) -> dict[str, str]:
    """Start the engine's servers (stopped when ``stack`` closes) -> URL per method. Their logs go
    to ``log_dir`` (``<engine>/serve-<method>.log``; None: a temporary directory)."""
    if log_dir is None:
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="relaxspec-repro-")))
    log_dir = log_dir / config.engine
    log_dir.mkdir(parents=True, exist_ok=True)
    spec_args = ["--k", str(config.k), "--theta", str(config.theta)]
    if config.engine == "relaxspec":
        kinds = {"nsd": config.methods}
        method_args = {"nsd": [*spec_args, "--adaptive-k", "--batching"]}
        common: list[str] = []
    else:
        speculative = [m for m in config.methods if m != "ar"]
        kinds = {"ar": ["ar"] if "ar" in config.methods else [], "nsd": speculative}
        kinds = {kind: methods for kind, methods in kinds.items() if methods}
        method_args = {"nsd": [*spec_args, "--k-schedule", config.k_schedule]}
        common = ["--max-model-len", str(config.max_model_len)]
        common += ["--dtype", config.vllm_dtype] if config.vllm_dtype else []
    loadtest = LoadtestConfig(
        concurrency=[config.concurrency], spawn_args=common, method_args=method_args, engine=config.engine
    )
    urls: dict[str, str] = {}
    servers = []
    for kind, methods in kinds.items():
        server = SpawnedServer(kind, loadtest, log_dir)
        stack.callback(server.stop)
        servers.append(server)
        urls.update(dict.fromkeys(methods, server.url))
    for server in servers:
        server.wait_ready(config.startup_timeout)
    return urls


def send(client: httpx.Client, url: str, body: dict[str, Any], errors: list[str]) -> str | None:
    """The completion's text, or None for a failed request (its message appended to ``errors``)."""
    try:
        response = client.post(f"{url}/v1/completions", json=body)
    except httpx.HTTPError as err:
        errors.append(f"{type(err).__name__}: {err}")
        return None
    if response.status_code != 200:
        errors.append(f"HTTP {response.status_code}: {response.text[:300]}")
        return None
    return response.json()["choices"][0]["text"]


def run_once(
    urls: dict[str, str],
    prompts: Sequence[Prompt],
    config: ReproConfig,
    concurrent: bool,
    order_seed: int,
    errors: list[str],
) -> dict[Job, str | None]:
    """Every job once: in order, one at a time, or shuffled among ``config.concurrency`` clients."""
    todo = jobs(config)
    if concurrent:
        random.Random(order_seed).shuffle(todo)
    limits = httpx.Limits(max_connections=config.concurrency)
    with httpx.Client(timeout=config.timeout, limits=limits) as client:

        def one(job: Job) -> str | None:
            return send(client, urls[job.method], request_body(job, prompts[job.index], config), errors)

        with ThreadPoolExecutor(max_workers=config.concurrency if concurrent else 1) as pool:
            return dict(zip(todo, pool.map(one, todo), strict=True))


def summarize(
    config: ReproConfig, runs: Sequence[dict[Job, str | None]], errors: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """One row per (method, regime): requests, failed ones, the most distinct outputs any request
    gave across the runs, and whether every request gave one output every time."""
    rows = []
    for method in config.methods:
        for regime in REGIMES:
            mine = [j for j in jobs(config) if j.method == method and j.regime == regime]
            outputs = {j: [run[j] for run in runs] for j in mine}
            failed = sum(o is None for outs in outputs.values() for o in outs)
            distinct = {j: len(set(outs)) for j, outs in outputs.items()}
            differing = {
                str(j.index): outs for j, outs in outputs.items() if len(set(outs)) > 1 or None in outs
            }
            rows.append(
                {
                    "engine": config.engine,
                    "method": method,
                    "regime": regime,
                    "requests": len(mine),
                    "runs": len(runs),
                    "failed": failed,
                    "distinct_max": max(distinct.values()),
                    "identical": failed == 0 and all(d == 1 for d in distinct.values()),
                    "differing": differing,  # prompt index -> its outputs per run
                    "errors": list(dict.fromkeys(errors))[:5] if failed else [],
                }
            )
    return rows


def check_engine(
    config: ReproConfig, progress: Any = None, log_dir: Path | None = None
) -> list[dict[str, Any]]:
    """Spawn the engine's servers, send every run, stop the servers -> the summary rows
    (``log_dir``: where the servers' logs stay; None: a temporary directory)."""
    validate(config)
    prompts = load_prompts(config.dataset, config.prompts)
    if len(prompts) < config.prompts:
        raise RelaxSpecError(
            f"{config.dataset!r} has {len(prompts)} prompts, --prompts asks for {config.prompts}"
        )
    sequential = (config.runs + 1) // 2
    with ExitStack() as stack:
        urls = spawn_servers(config, stack, log_dir)
        runs, errors = [], []
        for r in range(config.runs):
            concurrent = r >= sequential
            if progress:
                how = f"{config.concurrency} concurrent clients" if concurrent else "sequential"
                progress(f"{config.engine}: run {r + 1}/{config.runs} ({how})")
            runs.append(run_once(urls, prompts, config, concurrent, r, errors))
    return summarize(config, runs, errors)


def format_table(rows: Sequence[dict[str, Any]], concurrency: int, temperature: float = 1.0) -> str:
    """The summary as a Markdown table."""
    lines = [
        f"| engine | method | regime | requests | runs (sequential + {concurrency} concurrent) | failed "
        "| distinct outputs per request (max) | identical |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        regime = "greedy" if row["regime"] == "greedy" else f"T = {temperature:g}, seeded"
        lines.append(
            f"| {row['engine']} | {row['method']} | {regime} | {row['requests']} | {row['runs']} "
            f"| {row['failed']} | {row['distinct_max']} | {'yes' if row['identical'] else 'no'} |"
        )
    return "\n".join(lines)
