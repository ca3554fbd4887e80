"""Load test of the OpenAI-compatible server: throughput, latency and time to first token.

For each concurrency level C, ``C`` clients send streamed ``/v1/completions`` requests back to back
until ``requests`` have been sent. Per level (and method) it reports

- **throughput**: completion tokens of all successful requests / wall-clock seconds of the level
  (docs/design.md §6: total tokens over total time, not a mean of per-request rates),
- p50/p99 end-to-end **latency** and **time to first token** (the first non-empty text chunk),
- failed requests (non-200 answers, error events, broken connections) and τ from the usage.

Methods are measured either as per-request overrides (``"relaxspec": {"method": ...}``) against
one running server, or (``spawn``) on one server subprocess per method, started on free loopback
ports and stopped at the end. Levels are interleaved across methods so that a drift of the
machine's speed hits every method alike; speedup = throughput / ``ar`` throughput at the same C.
With several runs per cell (``repeats``, ``server_sets``) the speedup gets a 95 % interval: the
jackknife of ``eval.intervals.speed_ratio`` over the paired runs, whole server sets left out
together when there are several (a server process carries its own speed offset).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from relaxspec.engine.stats import tau
from relaxspec.errors import RelaxSpecError, check_int
from relaxspec.eval.intervals import speed_ratio
from relaxspec.serve import API_KEY_ENV

LOOPBACK = "127.0.0.1"


@dataclass
class Prompt:
    text: str
    stop: tuple[str, ...] = ()


@dataclass
class RequestRecord:
    """One request as the client saw it (times in seconds from sending it)."""

    ok: bool
    latency: float
    ttft: float | None = None
    completion_tokens: int = 0
    verifier_calls: int = 0
    cycles: int = 0
    error: str | None = None


@dataclass
class LevelResult:
    """One (method, concurrency) cell of the load test."""

    method: str
    concurrency: int
    requests: int
    failed: int
    wall_seconds: float
    completion_tokens: int
    throughput: float  # completion tokens / s
    latency_p50: float | None
    latency_p99: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    tau: float | None
    errors: list[str] = field(default_factory=list)  # the first few distinct messages
    repeat_throughputs: list[float] = field(default_factory=list)  # tok/s of each repeat (--repeats)
    repeat_tokens: list[int] = field(default_factory=list)  # completion tokens of each repeat
    repeat_seconds: list[float] = field(default_factory=list)  # wall seconds of each repeat


@dataclass
class LoadtestConfig:
    """What to measure. ``methods`` empty = the server's default method (shown as "default")."""

    url: str = f"http://{LOOPBACK}:8000"
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    requests: int = 64
    max_tokens: int = 64
    methods: list[str] = field(default_factory=list)
    dataset: str = "math"
    temperature: float = 0.0
    seed: int | None = 0
    fixed_length: bool = False  # ignore EOS and stop strings: max_tokens per request for every method
    warmup: int = 8
    timeout: float = 600.0
    spawn: bool = False
    spawn_args: list[str] = field(default_factory=list)  # model/parameter options for `relaxspec serve`
    method_args: dict[str, list[str]] = field(default_factory=dict)  # more options for one method's server
    startup_timeout: float = 300.0
    api_key: str | None = None  # sent as a bearer token; spawned servers get it in their environment
    engine: str = "relaxspec"  # spawned servers: "vllm" = vLLM's server with the plugin (vllm-*: stock)
    repeats: int = 1  # each level measured this many times per method, in ABBA order, then pooled
    server_sets: int = 1  # spawned servers: run every level on this many fresh sets of processes, pooled

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


# ---------------------------------------------------------------------------------------------
# Arithmetic


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) with linear interpolation between order statistics
    (NumPy's default); None for no values."""
    if not 0 <= q <= 100:
        raise RelaxSpecError(f"percentile must be in [0, 100], got {q}")
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(
    method: str, concurrency: int, records: Sequence[RequestRecord], wall_seconds: float
) -> LevelResult:
    """Aggregate one level: throughput over the wall time, percentiles over successful requests."""
    ok = [r for r in records if r.ok]
    tokens = sum(r.completion_tokens for r in ok)
    calls = sum(r.verifier_calls for r in ok)
    cycles = sum(r.cycles for r in ok)
    latencies = [r.latency for r in ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    errors = list(dict.fromkeys(r.error for r in records if not r.ok and r.error))[:5]
    return LevelResult(
        method=method,
        concurrency=concurrency,
        requests=len(records),
        failed=len(records) - len(ok),
        wall_seconds=wall_seconds,
        completion_tokens=tokens,
        throughput=tokens / wall_seconds if wall_seconds > 0 else 0.0,
        latency_p50=percentile(latencies, 50),
        latency_p99=percentile(latencies, 99),
        ttft_p50=percentile(ttfts, 50),
        ttft_p99=percentile(ttfts, 99),
        tau=tau(tokens, calls, cycles) if calls or cycles else None,  # None: the server reports no calls
        errors=errors,
    )


BASELINES = ("ar", "vllm-ar")  # the speed-up's reference, the first of these measured


def baseline_of(levels: Sequence[LevelResult]) -> str:
    """``ar`` when it was measured, else ``vllm-ar`` (a load test of vLLM servers only)."""
    measured = {lv.method for lv in levels}
    return next((b for b in BASELINES if b in measured), BASELINES[0])


def speedups(levels: Sequence[LevelResult], baseline: str = "ar") -> dict[str, dict[int, float | None]]:
    """Throughput relative to ``baseline`` at the same concurrency, per other method."""
    base = {lv.concurrency: lv.throughput for lv in levels if lv.method == baseline}
    out: dict[str, dict[int, float | None]] = {}
    for lv in levels:
        if lv.method == baseline or lv.concurrency not in base:
            continue
        ref = base[lv.concurrency]
        out.setdefault(lv.method, {})[lv.concurrency] = lv.throughput / ref if ref > 0 else None
    return out


# ---------------------------------------------------------------------------------------------
# The client


def request_body(prompt: Prompt, config: LoadtestConfig, method: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": prompt.text,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.seed is not None:
        body["seed"] = config.seed
    if config.fixed_length:
        body["ignore_eos"] = True
    elif prompt.stop:
        body["stop"] = list(prompt.stop)
    if method is not None:
        body["relaxspec"] = {"method": method}
    return body


def _error_message(status: int, raw: bytes) -> str:
    try:
        return f"HTTP {status}: {json.loads(raw)['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {raw[:200].decode(errors='replace')}"


async def stream_completion(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> RequestRecord:
    """Send one streamed completion; time the first text chunk and the end."""
    start = time.perf_counter()
    ttft: float | None = None
    tokens = calls = cycles = 0
    done = False
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                raw = await response.aread()
                return RequestRecord(
                    False, time.perf_counter() - start, error=_error_message(response.status_code, raw)
                )
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    return RequestRecord(False, time.perf_counter() - start, error=event["error"]["message"])
                if ttft is None and any(c.get("text") for c in event.get("choices", [])):
                    ttft = time.perf_counter() - start
                if event.get("usage"):
                    tokens = int(event["usage"]["completion_tokens"])
                    decoding = event["usage"].get("relaxspec", {})
                    calls, cycles = int(decoding.get("verifier_calls", 0)), int(decoding.get("cycles", 0))
    except (httpx.HTTPError, json.JSONDecodeError) as err:
        return RequestRecord(False, time.perf_counter() - start, error=f"{type(err).__name__}: {err}")
    latency = time.perf_counter() - start
    if not done:
        return RequestRecord(False, latency, ttft, error="the stream ended without [DONE]")
    return RequestRecord(True, latency, ttft, tokens, calls, cycles)


async def run_level(
    url: str, prompts: Sequence[Prompt], config: LoadtestConfig, concurrency: int, method: str | None
) -> tuple[list[RequestRecord], float]:
    """``config.requests`` requests from ``concurrency`` clients; the records and the wall time."""
    records: list[RequestRecord] = []
    counter = itertools.count()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=config.timeout, limits=limits, headers=config.headers) as client:

        async def worker() -> None:
            while (i := next(counter)) < config.requests:
                body = request_body(prompts[i % len(prompts)], config, method)
                records.append(await stream_completion(client, url, body))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return records, wall


async def warm_up(url: str, prompts: Sequence[Prompt], config: LoadtestConfig, method: str | None) -> None:
    """A few unrecorded requests (first-call overheads); a failure here aborts the run."""
    async with httpx.AsyncClient(timeout=config.timeout, headers=config.headers) as client:
        for i in range(config.warmup):
            record = await stream_completion(
                client, url, request_body(prompts[i % len(prompts)], config, method)
            )
            if not record.ok:
                raise RelaxSpecError(f"warm-up request to {url} failed: {record.error}")


# ---------------------------------------------------------------------------------------------
# Spawned servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen, timeout: float, interval: float = 0.2) -> bool:
    """Poll ``url/health`` until it answers 200 (True), or ``process`` exits or ``timeout`` seconds
    pass (False). One client for every poll: ``httpx.get`` builds a client, and its TLS context,
    per call, a CPU cost taken from the starting server (docs/design.md §11)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if client.get(f"{url}/health").status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(interval)
    return False


class SpawnedServer:
    """``relaxspec serve`` for one method in a subprocess on a free loopback port."""

    def __init__(self, method: str, config: LoadtestConfig, log_dir: Path) -> None:
        self.method = method
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        top = max(config.concurrency)
        self.log_path = log_dir / f"serve-{method}.log"
        options = [*config.spawn_args, *config.method_args.get(method, [])]
        command = [
            sys.executable, "-m", "relaxspec.cli", "serve",
            "--method", method,
            "--host", LOOPBACK,
            "--port", str(self.port),
            "--max-concurrency", str(top),
            "--max-queue", str(top),
            *options,
        ]  # fmt: skip
        if config.engine == "vllm":
            from relaxspec.integrations.vllm.runners import serve_command

            where = ["--host", LOOPBACK, "--port", str(self.port)]
            command = serve_command(method, [*where, *options])
        env = {k: v for k, v in os.environ.items() if k not in (API_KEY_ENV, "VLLM_API_KEY")}
        if config.api_key:
            env[API_KEY_ENV] = config.api_key  # not on the command line, where `ps` would show it
            env["VLLM_API_KEY"] = config.api_key
        from relaxspec.integrations.vllm import lifeline

        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, preexec_fn=lifeline()
        )

    def wait_ready(self, timeout: float) -> None:
        """Poll ``/health`` until it answers; a clear error if the process exits or times out."""
        if not wait_healthy(self.url, self.process, timeout):
            what = (
                "exited at start-up"
                if self.process.poll() is not None
                else f"did not start within {timeout:.0f}s"
            )
            raise RelaxSpecError(f"the {self.method} server {what}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


# ---------------------------------------------------------------------------------------------
# The run


def load_prompts(dataset: str, limit: int) -> list[Prompt]:
    """Prompts (and their stop strings) of a dataset: math, code, humaneval or a .jsonl file."""
    from relaxspec.eval.datasets import load_examples

    return [Prompt(e.prompt, e.stop) for e in load_examples(dataset, limit)]


def validate(config: LoadtestConfig) -> None:
    if not config.concurrency or min(config.concurrency) < 1:
        raise RelaxSpecError(f"concurrency levels must be integers >= 1, got {config.concurrency}")
    for name in ("requests", "max_tokens"):
        value = getattr(config, name)
        check_int(name, value, 1)
    if config.warmup < 0:
        raise RelaxSpecError(f"warmup must be >= 0, got {config.warmup}")
    if config.repeats < 1:
        raise RelaxSpecError(f"--repeats must be >= 1, got {config.repeats}")
    if config.spawn and not config.methods:
        raise RelaxSpecError("--spawn needs --method (one server is started per method)")
    if (
        isinstance(config.server_sets, bool)
        or not isinstance(config.server_sets, int)
        or config.server_sets < 1
    ):
        raise RelaxSpecError(f"--server-sets must be an integer >= 1, got {config.server_sets!r}")
    unknown = sorted(set(config.method_args) - set(config.methods))
    if unknown:
        raise RelaxSpecError(f"--method-args for {', '.join(unknown)}, which is not among --method")
    if config.server_sets > 1 and not config.spawn:
        raise RelaxSpecError("--server-sets needs --spawn (fresh server processes per set)")
    if not config.spawn and not config.url.startswith(("http://", "https://")):
        raise RelaxSpecError(f"--url must start with http:// or https://, got {config.url!r}")


def run_loadtest(config: LoadtestConfig, prompts: Sequence[Prompt], progress: Any = None) -> dict[str, Any]:
    """Measure every (concurrency, method) cell; returns the JSON-able report.

    ``progress(text)`` (optional) is called before each cell.
    """
    validate(config)
    if not prompts:
        raise RelaxSpecError("the load test needs at least one prompt")
    methods: list[str | None] = list(config.methods) or [None]
    runs: dict[int, dict[str | None, list[tuple[list[RequestRecord], float]]]] = {
        c: {m: [] for m in methods} for c in config.concurrency
    }  # (records, wall seconds) of each repeat (and server set), in the order they ran
    # A server process carries its own speed offset (two identical `ar` servers differ: see
    # docs/performance.md §6), so several sets of fresh processes average it out.
    for server_set in range(config.server_sets):
        with ExitStack() as stack:
            urls = _servers(config, stack)
            for method in methods:
                asyncio.run(warm_up(urls[method], prompts, config, _override(config, method)))
            for concurrency in config.concurrency:
                for repeat in range(config.repeats):
                    # ABBA: the second repeat runs the methods in reverse, so a drift of the machine
                    # over the level weighs on every method alike
                    for method in methods if repeat % 2 == 0 else methods[::-1]:
                        if progress is not None:
                            progress(
                                f"{method or 'default'} at concurrency {concurrency}"
                                + _repeat_text(repeat, server_set, config)
                            )
                        runs[concurrency][method].append(
                            asyncio.run(
                                run_level(
                                    urls[method], prompts, config, concurrency, _override(config, method)
                                )
                            )
                        )
    levels = [pooled(m or "default", c, runs[c][m]) for c in config.concurrency for m in methods]
    baseline = baseline_of(levels)
    sets = config.repeats if config.server_sets > 1 else None
    return {
        "config": {**asdict(config), "api_key": "(set)" if config.api_key else None},  # never the key
        "levels": [asdict(lv) for lv in levels],
        "baseline": baseline,
        "speedup": {
            m: {str(c): v for c, v in by_c.items()} for m, by_c in speedups(levels, baseline).items()
        },
        "speedup_per_repeat": repeat_speedups(levels, baseline),
        "speedup_interval": speedup_intervals(levels, baseline, sets),
        "failed": sum(lv.failed for lv in levels),
    }


def pooled(method: str, concurrency: int, runs: Sequence[tuple[list[RequestRecord], float]]) -> LevelResult:
    """One cell over all its runs (records and wall seconds of each): the requests pooled, and with
    several runs each run's throughput, tokens and seconds kept in order."""
    level = summarize(
        method, concurrency, [r for records, _ in runs for r in records], sum(w for _, w in runs)
    )
    if len(runs) > 1:
        each = [summarize(method, concurrency, records, wall) for records, wall in runs]
        level.repeat_throughputs = [r.throughput for r in each]
        level.repeat_tokens = [r.completion_tokens for r in each]
        level.repeat_seconds = [r.wall_seconds for r in each]
    return level


def _repeat_text(repeat: int, server_set: int, config: LoadtestConfig) -> str:
    parts = [f"repeat {repeat + 1}/{config.repeats}"] if config.repeats > 1 else []
    if config.server_sets > 1:
        parts.append(f"server set {server_set + 1}/{config.server_sets}")
    return f" ({', '.join(parts)})" if parts else ""


def repeat_speedups(levels: Sequence[LevelResult], baseline: str = "ar") -> dict[str, dict[str, list[float]]]:
    """Per method and concurrency, throughput / the baseline's in each repeat (the run-to-run
    spread that says what "within noise" means); empty without ``--repeats``."""
    base = {lv.concurrency: lv.repeat_throughputs for lv in levels if lv.method == baseline}
    out: dict[str, dict[str, list[float]]] = {}
    for lv in levels:
        ref = base.get(lv.concurrency)
        if lv.method == baseline or not ref or len(ref) != len(lv.repeat_throughputs):
            continue
        ratios = [x / r for x, r in zip(lv.repeat_throughputs, ref, strict=True) if r > 0]
        out.setdefault(lv.method, {})[str(lv.concurrency)] = ratios
    return out


def speedup_intervals(
    levels: Sequence[LevelResult], baseline: str = "ar", runs_per_set: int | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per method and concurrency, the speedup over ``baseline`` with its 95 % interval
    (:func:`~relaxspec.eval.intervals.speed_ratio`: total tokens over total seconds, jackknife of
    the log ratio over the paired runs of the cell). ``runs_per_set`` (the repeats of one server
    set, when there were several sets) leaves a whole set out at a time, so the interval covers
    the offset a set of server processes carries. Cells with fewer than two runs (or two sets)
    have none."""
    base = {lv.concurrency: lv for lv in levels if lv.method == baseline}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for lv in levels:
        ref = base.get(lv.concurrency)
        if lv.method == baseline or ref is None or len(ref.repeat_tokens) != len(lv.repeat_tokens):
            continue
        n = len(lv.repeat_tokens)
        clusters = [i // runs_per_set for i in range(n)] if runs_per_set else None
        try:
            iv = speed_ratio(
                lv.repeat_tokens, lv.repeat_seconds, ref.repeat_tokens, ref.repeat_seconds, clusters
            )
        except RelaxSpecError:  # no run of one side produced a token: no ratio to bound
            iv = None
        if iv is not None:
            out.setdefault(lv.method, {})[str(lv.concurrency)] = iv.to_dict()
    return out


def _override(config: LoadtestConfig, method: str | None) -> str | None:
    """The per-request method override (none when each method has its own spawned server)."""
    return None if config.spawn else method


def _servers(config: LoadtestConfig, stack: ExitStack) -> dict[str | None, str]:
    """The URL each method is measured at (spawning and registering servers for cleanup)."""
    if not config.spawn:
        return {m: config.url.rstrip("/") for m in [*config.methods, None]}
    log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="relaxspec-loadtest-")))
    servers = [SpawnedServer(m, config, log_dir) for m in config.methods]
    for server in servers:
        stack.callback(server.stop)
    for server in servers:
        server.wait_ready(config.startup_timeout)
    return {s.method: s.url for s in servers}


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def print_table(report: dict[str, Any]) -> None:
    """The report as a rich table (latencies in ms)."""
    from rich.console import Console
    from rich.table import Table

    baseline = report.get("baseline", "ar")
    legend = "[95 % interval] or (per-repeat range)"
    title = f"relaxspec load test (latencies in ms; speed-up vs {baseline} {legend})"
    table = Table(title=title)
    columns = ("method", "C", "req", "failed", "tok/s", "speedup", "τ")
    for col in (*columns, "lat p50", "lat p99", "TTFT p50", "TTFT p99"):
        table.add_column(col, justify="right", no_wrap=True)
    speedup, per_repeat = report["speedup"], report.get("speedup_per_repeat", {})
    intervals = report.get("speedup_interval", {})
    for lv in report["levels"]:
        ratio = speedup.get(lv["method"], {}).get(str(lv["concurrency"]))
        repeats = per_repeat.get(lv["method"], {}).get(str(lv["concurrency"]))
        iv = intervals.get(lv["method"], {}).get(str(lv["concurrency"]))
        spread = f" ({min(repeats):.2f}–{max(repeats):.2f})" if repeats else ""  # per-repeat range
        if iv is not None:
            spread = f" [{iv['low']:.2f}–{iv['high']:.2f}]"
        table.add_row(
            lv["method"],
            str(lv["concurrency"]),
            str(lv["requests"]),
            str(lv["failed"]),
            _fmt(lv["throughput"], digits=1),
            "-" if ratio is None else f"{ratio:.2f}x{spread}",
            _fmt(lv["tau"]),
            _fmt(lv["latency_p50"], 1000, 0),
            _fmt(lv["latency_p99"], 1000, 0),
            _fmt(lv["ttft_p50"], 1000, 0),
            _fmt(lv["ttft_p99"], 1000, 0),
        )
    console = Console()
    console.width = max(console.width, 120)  # not cut to 80 columns when piped
    console.print(table)


def write_report(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
