"""``relaxspec generate``: one prompt through a method, on our engine or inside vLLM."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from relaxspec.cli.common import (
    EngineOpt,
    KernelsOpt,
    MethodOptions,
    app,
    check_engine,
    with_method_options,
)


@app.command()
@with_method_options(
    "nsd",
    "ar, sd, nsd, topk, typical, lenience, topk-delta, threshold, fly, mars, prove, prove-lossless, sdd*",
)
def generate(
    prompt: Annotated[str, typer.Argument(help="prompt text")],
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = 0,
    max_new_tokens: int = 128,
    stop: Annotated[list[str] | None, typer.Option(help="stop string (repeatable)")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print one JSON object instead of streaming")
    ] = False,
    engine: EngineOpt = "relaxspec",
    kernels: KernelsOpt = "auto",
    *,
    opts: MethodOptions,
) -> None:
    """Generate a continuation of PROMPT, streaming text (or one JSON object with --json)."""
    from relaxspec.core.sampling import SamplingParams

    check_engine(engine, kernels)
    params = SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        max_new_tokens=max_new_tokens,
        stop=tuple(stop or ()),
    )
    if engine == "vllm":
        from relaxspec.integrations.vllm.runners import cli_generate

        cli_generate(opts.method, opts.params, opts.paths, prompt, params, as_json)
        return
    from relaxspec.methods import build_engine, load_models

    engine = build_engine(opts.method, load_models(opts.method, opts.paths, kernels), **opts.params)
    if as_json:
        result = engine.generate(prompt, params)
        print(json.dumps({"text": result.text, "tokens": result.tokens, "stats": result.stats.to_dict()}))
        return
    result = engine.generate(
        prompt, params, on_chunk=lambda text, _ids: (sys.stdout.write(text), sys.stdout.flush())
    )
    s = result.stats
    print(
        f"\n[{opts.method}] {s.new_tokens} tokens in {s.total_seconds:.2f}s "
        f"({s.new_tokens / max(s.total_seconds, 1e-9):.1f} tok/s), "
        f"tau={s.tau:.2f}, verifier calls={s.verifier_calls}, finish={s.finish_reason}",
        file=sys.stderr,
    )
