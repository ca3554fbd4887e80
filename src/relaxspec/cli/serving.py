"""Serving: ``relaxspec serve`` (our OpenAI-compatible server, or vLLM's with the plugin) and
``relaxspec loadtest`` (docs/design.md §7, docs/server.md)."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from relaxspec import params as params_mod
from relaxspec.cli.common import (
    DraftOpt,
    EngineOpt,
    KernelsOpt,
    MethodOptions,
    TargetOpt,
    app,
    check_engine,
    given_flags,
    int_list,
    with_method_options,
)
from relaxspec.errors import RelaxSpecError
from relaxspec.serve import API_KEY_ENV, DEFAULT_MAX_BODY_BYTES


@app.command("serve")
@with_method_options("nsd", "default method of requests that do not override it")
def serve_cmd(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: int = 8000,
    max_concurrency: Annotated[int, typer.Option(help="sequences decoded at once")] = 8,
    max_queue: Annotated[int, typer.Option(help="requests waiting for a slot; more get 429")] = 64,
    batching: Annotated[
        bool, typer.Option(help="batch the forwards of concurrent requests (off: each decodes alone)")
    ] = True,
    adaptive_k: Annotated[
        bool,
        typer.Option(
            help="draft-model methods pick each cycle's draft length in 0..k for tokens per second, "
            "from the running requests and measured acceptance (off: always k)"
        ),
    ] = True,
    max_tokens_cap: Annotated[
        int | None, typer.Option(help="largest max_tokens a request may ask for (default: the context)")
    ] = None,
    default_max_tokens: Annotated[int, typer.Option(help="max_tokens of completions that omit it")] = 16,
    model_name: Annotated[str, typer.Option(help="the model id clients pass as 'model'")] = "relaxspec",
    extra_models: Annotated[
        bool, typer.Option(help="also load the other bundled models so requests can switch methods")
    ] = True,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar=API_KEY_ENV,
            show_envvar=True,
            help="require 'Authorization: Bearer <key>' on every endpoint but /health",
        ),
    ] = None,
    max_body_bytes: Annotated[
        int, typer.Option(help="largest request body in bytes; larger ones get 413")
    ] = DEFAULT_MAX_BODY_BYTES,
    engine: EngineOpt = "relaxspec",
    kernels: KernelsOpt = "auto",
    k_schedule: Annotated[
        str | None,
        typer.Option(
            help="--engine vllm: draft length per number of running requests, e.g. 1-4:8,5-8:4,9-1024:0 "
            "(vLLM's num_speculative_tokens_per_batch_size; our engine adapts K itself: --adaptive-k)"
        ),
    ] = None,
    *,
    opts: MethodOptions,
) -> None:
    """OpenAI-compatible server: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

    --engine vllm: vLLM's OpenAI server with the plugin; --method and its flags set the default
    rule, requests pick theirs with vllm_xargs (docs/vllm.md).
    """
    check_engine(engine, kernels)
    if not 1 <= port <= 65535:
        raise RelaxSpecError(f"--port must be in 1..65535, got {port}")
    if max_body_bytes < 1024:
        raise RelaxSpecError(f"--max-body-bytes must be >= 1024, got {max_body_bytes}")
    if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {host} without --api-key: anyone who can reach it can use it",
              file=sys.stderr)  # fmt: skip
    if k_schedule is not None and engine != "vllm":
        raise RelaxSpecError("--k-schedule is for --engine vllm (our engine picks K per step: --adaptive-k)")
    if engine == "vllm":
        for name in given_flags(ctx, "max_queue", "batching", "adaptive_k", "extra_models"):
            flag = "--" + name.replace("_", "-")
            raise RelaxSpecError(f"{flag} is our engine's and has no equivalent in vLLM (--engine vllm)")
    http = HttpOptions(
        host, port, model_name, api_key, max_body_bytes, max_tokens_cap, default_max_tokens, log_level
    )
    if engine == "vllm":
        concurrency = max_concurrency if given_flags(ctx, "max_concurrency") else None  # else vLLM's
        _serve_on_vllm(opts, http, k_schedule, concurrency)
    else:
        pool = ServingSettings(max_concurrency, max_queue, batching, adaptive_k, extra_models, kernels)
        _serve_on_ours(opts, http, pool)


@dataclass(frozen=True)
class HttpOptions:
    """What both engines' servers take from ``serve``'s flags: address, name, guard, log level."""

    host: str
    port: int
    model_name: str
    api_key: str | None
    max_body_bytes: int
    max_tokens_cap: int | None
    default_max_tokens: int
    log_level: str


@dataclass(frozen=True)
class ServingSettings:
    """Our engine's serving flags (``--max-concurrency`` … ``--kernels``)."""

    max_concurrency: int
    max_queue: int
    batching: bool
    adaptive_k: bool
    extra_models: bool
    kernels: str


def _serve_on_vllm(
    opts: MethodOptions, http: HttpOptions, k_schedule: str | None, concurrency: int | None
) -> None:
    """``serve --engine vllm``: vLLM's OpenAI server with the plugin, the method as its default rule."""
    from relaxspec.integrations.vllm.serve import ServerSettings, ServingOptions, parse_k_schedule
    from relaxspec.integrations.vllm.serve import serve as vllm_serve

    params = {n: v for n, v in opts.params.items() if n != "k"}
    server = ServerSettings(
        target=opts.paths.get("target"),
        draft=opts.paths.get("draft"),
        k=opts.params.get("k", params_mod.DEFAULT_K),
        paths=opts.paths,
        k_schedule=parse_k_schedule(k_schedule) if k_schedule is not None else None,
        host=http.host,
        port=http.port,
        served_model_name=http.model_name,
    )
    options = ServingOptions(
        api_key=http.api_key,
        max_body_bytes=http.max_body_bytes,
        max_tokens_cap=http.max_tokens_cap,
        default_max_tokens=http.default_max_tokens,
        max_concurrency=concurrency,
        log_level=http.log_level,
    )
    vllm_serve(opts.method, params, server, options)


def _serve_on_ours(opts: MethodOptions, http: HttpOptions, settings: ServingSettings) -> None:
    """``serve`` on our engine: the pool of :mod:`relaxspec.serve` behind uvicorn."""
    import uvicorn

    from relaxspec.serve.pool import ServingPool
    from relaxspec.serve.server import create_app, load_serving_models, serving_tokenizer_and_context

    models = load_serving_models(
        opts.method, opts.paths, extra_roles=settings.extra_models, kernels=settings.kernels
    )
    pool = ServingPool(
        models,
        opts.method,
        opts.params,
        max_concurrency=settings.max_concurrency,
        max_queue=settings.max_queue,
        batching=settings.batching,
        adaptive_k=settings.adaptive_k,
    )
    tokenizer, context = serving_tokenizer_and_context(models, opts.method)
    app = create_app(
        pool,
        http.model_name,
        tokenizer,
        context,
        max_tokens_cap=http.max_tokens_cap,
        default_max_tokens=http.default_max_tokens,
        max_body_bytes=http.max_body_bytes,
        api_key=http.api_key,
    )
    uvicorn.run(app, host=http.host, port=http.port, log_level=http.log_level)


@app.command("loadtest")
def loadtest_cmd(
    url: Annotated[str, typer.Option(help="server to load (ignored with --spawn)")] = "http://127.0.0.1:8000",
    concurrency: Annotated[str, typer.Option(help="comma-separated concurrency levels")] = "1,2,4,8,16,32",
    requests: Annotated[int, typer.Option(help="requests per level and method")] = 64,
    repeats: Annotated[
        int, typer.Option(help="measure each level this many times per method (ABBA order), pooled")
    ] = 1,
    server_sets: Annotated[
        int,
        typer.Option(
            help="--spawn: run every level on this many fresh sets of server processes, pooled "
            "(a process carries its own few-% offset)"
        ),
    ] = 1,
    max_tokens: int = 64,
    method: Annotated[
        str | None, typer.Option(help="comma-separated methods, e.g. ar,nsd (default: the server's)")
    ] = None,
    dataset: Annotated[str, typer.Option(help="math, code, humaneval or a .jsonl prompt file")] = "math",
    limit: Annotated[int, typer.Option(help="distinct prompts (requests cycle through them)")] = 64,
    temperature: float = 0.0,
    seed: Annotated[int | None, typer.Option(help="seed sent with every request")] = 0,
    fixed_length: Annotated[
        bool, typer.Option(help="ignore EOS and stop strings: every request generates max_tokens")
    ] = False,
    warmup: Annotated[int, typer.Option(help="unrecorded requests per method first")] = 8,
    timeout: Annotated[float, typer.Option(help="seconds per request")] = 600.0,
    spawn: Annotated[
        bool, typer.Option(help="start one `relaxspec serve` per method on a free port")
    ] = False,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    model: Annotated[
        list[str] | None, typer.Option(help="spawned servers: model of another role, role=DIR")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="spawned servers: method parameter name=value")
    ] = None,
    serve_args: Annotated[
        str | None, typer.Option(help="spawned servers: more `relaxspec serve` options, e.g. '--no-batching'")
    ] = None,
    method_args: Annotated[
        list[str] | None,
        typer.Option(
            help="one method's spawned server only: METHOD='options' (repeatable), "
            "e.g. prove-lossless='--seam own-cache --k-schedule 1-4:8,5-1024:0'"
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="JSON report")] = Path("results/loadtest.json"),
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar=API_KEY_ENV,
            show_envvar=True,
            help="sent as 'Authorization: Bearer <key>'; spawned servers require it",
        ),
    ] = None,
    engine: Annotated[
        str, typer.Option(help="spawned servers: relaxspec or vllm (methods ar, sd, nsd, ..., vllm-sd)")
    ] = "relaxspec",
) -> None:
    """Throughput, p50/p99 latency and time to first token per concurrency level (and speedup vs ar)."""
    from relaxspec.serve.loadtest import LoadtestConfig, load_prompts, print_table, run_loadtest, write_report

    spawn_args: list[str] = []
    for flag, path in (("--target", target), ("--draft", draft)):
        if path is not None:
            spawn_args += [flag, str(path)]
    for item in model or []:
        role, sep, path = item.partition("=")
        if not sep or not role or not path:
            raise RelaxSpecError(f"--model expects role=DIR, got {item!r}")
        spawn_args += [f"--{role}", path]
    for item in set_ or []:
        spawn_args += ["--set", item]
    spawn_args += shlex.split(serve_args or "")
    per_method: dict[str, list[str]] = {}
    for item in method_args or []:
        name, sep, options = item.partition("=")
        if not sep or not name.strip():
            raise RelaxSpecError(f"--method-args expects METHOD='options', got {item!r}")
        per_method.setdefault(name.strip(), []).extend(shlex.split(options))
    config = LoadtestConfig(
        url=url,
        concurrency=int_list(concurrency, "concurrency"),
        requests=requests,
        max_tokens=max_tokens,
        methods=[m.strip() for m in method.split(",") if m.strip()] if method else [],
        dataset=dataset,
        temperature=temperature,
        seed=seed,
        fixed_length=fixed_length,
        warmup=warmup,
        timeout=timeout,
        spawn=spawn,
        spawn_args=spawn_args,
        method_args=per_method,
        api_key=api_key,
        engine=engine,
        repeats=repeats,
        server_sets=server_sets,
    )
    prompts = load_prompts(dataset, limit)
    report = run_loadtest(config, prompts, progress=lambda text: print(f"measuring {text}", file=sys.stderr))
    print_table(report)
    write_report(report, out)
    print(f"wrote {out}", file=sys.stderr)
    if report["failed"]:
        raise RelaxSpecError(f"{report['failed']} requests failed (see 'errors' in {out})")
