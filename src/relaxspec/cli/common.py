"""What the command groups share: the ``relaxspec`` Typer app and its ``data`` / ``train`` groups,
the option types several commands take, ``--method`` with its parameter flags
(:func:`with_method_options`), and the small parsers of flag values."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from relaxspec import params as params_mod
from relaxspec.errors import RelaxSpecError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Speculative decoding with relaxed verification (NSD, verifier skipping, ProVe).",
)


data_app = typer.Typer(no_args_is_help=True, help="Build the offline training corpus.")


train_app = typer.Typer(no_args_is_help=True, help="Train the tokenizer and the bundled models.")


app.add_typer(data_app, name="data")


app.add_typer(train_app, name="train")


TargetOpt = Annotated[
    Path | None, typer.Option(help="target model directory (default: bundled models/target)")
]


DraftOpt = Annotated[
    Path | None, typer.Option(help="draft model or EAGLE head directory (default: bundled models/draft)")
]


MaxMinutesOpt = Annotated[
    float | None, typer.Option(help="stop at a checkpoint after this long; rerun to resume")
]


TrainSetOpt = Annotated[list[str] | None, typer.Option("--set", help="training option override name=value")]


MixtureOpt = Annotated[
    str | None,
    typer.Option(
        help="source weights: math, code, synthcode, math_broad, synthpipes, math_styles, codevar, "
        "mathvar (data/tokens.py TRAIN_SOURCES; default math=0.7,code=0.3)"
    ),
]


HeadMixtureOpt = Annotated[
    str | None,
    typer.Option(
        "--mixture",
        help="source weights as in train ar (default: the mixture the target's training.json records, "
        "else math=0.7,code=0.3)",
    ),
]


def role_dir(path: Path | None, role: str) -> Path:
    from relaxspec.models import model_dir

    return model_dir(role, path)


EngineOpt = Annotated[
    str, typer.Option(help="relaxspec (our engine) or vllm (inside vLLM with the plugin; docs/vllm.md)")
]


KernelsOpt = Annotated[
    str,
    typer.Option(
        help="our engine's forwards: auto (fastest measured the model and CPU allow), hf "
        "(transformers' forward), packed (oneDNN-packed fp32 weights), packed-bf16, or packed-int8 "
        "(weight-only int8, opt-in: changes the numbers) (docs/performance.md)"
    ),
]


def given_flags(ctx: typer.Context, *names: str) -> list[str]:
    """Those of ``names`` (parameter names) the user set, on the command line or in the environment."""
    sources = {n: ctx.get_parameter_source(n) for n in names}
    return [n for n, source in sources.items() if source is not None and source.name != "DEFAULT"]


def check_engine(engine: str, kernels: str) -> None:
    if engine not in ("relaxspec", "vllm"):
        raise RelaxSpecError(f"--engine must be relaxspec or vllm, got {engine!r}")
    if engine == "vllm" and kernels != "auto":
        raise RelaxSpecError("--kernels applies to our engine; vLLM runs its own kernels (--engine vllm)")


ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        help="our engine's torch threads (default: the CPUs this process can really use: affinity, "
        "cgroup quota, minus CPUs other processes keep busy, followed while it runs; env RELAXSPEC_THREADS)"
    ),
]


def configure_engine_threads(threads: int | None, engine: str) -> None:
    """Our engine's thread count (vLLM sets its own workers' threads)."""
    from relaxspec.engine.threads import configure_threads, parse_threads

    if engine == "vllm":
        if threads is not None:
            parse_threads(threads, "--threads")
        return
    configure_threads(threads)


# Method parameters with a flag of their own on every command that builds engines (any other
# parameter of a preset: ``--set name=value``): the shared Params of relaxspec.params.
METHOD_FLAGS: dict[str, tuple[type, str]] = {p.name: (p.kind, p.help) for p in params_mod.METHOD_FLAGS}


MODEL_HELP = {
    "target": "target model directory",
    "draft": "draft model or EAGLE head directory (a causal LM is also ProVe's small verifier)",
    "eagle": "EAGLE head directory, the drafter of drafter=eagle rows",
    "block": "block proposer directory (mars, prove, prove-lossless)",
    "diffusion": "diffusion drafter directory (sdd*)",
    "survival": "survival predictor directory (sdd-skip signal=marginal|conditional)",
}


@dataclass
class MethodOptions:
    """What a command that builds engines was asked for: the method, the parameters the user
    actually set (validated; defaults stay the preset's), and a directory per model role
    (None: the bundled one)."""

    method: str
    params: dict[str, Any]
    paths: dict[str, Path | None]


def _option(name: str, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)


def with_method_options(default_method: str, method_help: str) -> Callable[[Callable], Callable]:
    """Give a command ``--method``, the :data:`METHOD_FLAGS`, ``--set`` and a directory flag per
    model role, and pass them to it as one validated :class:`MethodOptions` (``opts``)."""
    added = [
        inspect.Parameter(
            "method",
            inspect.Parameter.KEYWORD_ONLY,
            default=default_method,
            annotation=Annotated[str, typer.Option(help=method_help)],
        ),
        *(_option(n, Annotated[typ | None, typer.Option(help=h)]) for n, (typ, h) in METHOD_FLAGS.items()),
        _option(
            "set_",
            Annotated[
                list[str] | None,
                typer.Option("--set", help="other method parameter name=value, e.g. gamma=16 (repeatable)"),
            ],
        ),
        *(
            _option(r, Annotated[Path | None, typer.Option(help=f"{h} (default: bundled models/{r})")])
            for r, h in MODEL_HELP.items()
        ),
        _option("threads", ThreadsOpt),
    ]

    def decorate(command: Callable) -> Callable:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "opts"]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            flags = {n: kwargs.pop(n) for n in METHOD_FLAGS}
            threads = kwargs.pop("threads")
            params = {n: v for n, v in flags.items() if v is not None}
            params.update(training_overrides(kwargs.pop("set_")))
            opts = MethodOptions(kwargs.pop("method"), params, {r: kwargs.pop(r) for r in MODEL_HELP})
            # bad method or parameter: fail before loading models, by the rules of the engine that
            # runs it (vLLM rows have options of their own, e.g. prove-lossless's seam)
            if kwargs.get("engine") == "vllm":
                from relaxspec.integrations.vllm.runners import resolve as resolve_vllm

                resolve_vllm(opts.method, opts.params)
            else:
                from relaxspec.methods import resolve_params

                resolve_params(opts.method, opts.params)
            configure_engine_threads(threads, kwargs.get("engine", "relaxspec"))
            return command(opts=opts, **kwargs)

        parameters = own + added
        run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        return run

    return decorate


def parse_value(text: str) -> Any:
    """``--set`` values: JSON scalars (numbers, true/false) as such, anything else as a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_mixture(text: str) -> dict[str, float]:
    """``"math=0.5,code=0.5"`` -> ``{"math": 0.5, "code": 0.5}`` (sources of ``TRAIN_SOURCES``)."""
    from relaxspec.data.tokens import TRAIN_SOURCES

    weights: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or name.strip() not in TRAIN_SOURCES:
            raise RelaxSpecError(
                f"--mixture expects SOURCE=W with SOURCE in {', '.join(TRAIN_SOURCES)} "
                f"(non-negative weights), got {text!r}"
            )
    return weights


def int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RelaxSpecError(f"--{name} expects comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise RelaxSpecError(f"--{name} expects integers >= 1, got {text!r}")
    return values


def training_overrides(items: list[str] | None, **given: Any) -> dict[str, Any]:
    """``--set name=value`` items plus the explicitly given options (None = not given)."""
    overrides: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise RelaxSpecError(f"--set expects name=value, got {item!r}")
        name, value = item.split("=", 1)
        overrides[name] = parse_value(value)
    overrides.update({k: v for k, v in given.items() if v is not None})
    return overrides
