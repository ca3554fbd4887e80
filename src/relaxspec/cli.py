"""The ``relaxspec`` command line: generate, theory, bench, data, train, eval, serve, loadtest.

Every command validates its input through the library (one :class:`RelaxSpecError` per problem),
prints ``error: <message>`` on one line and exits with status 2 on bad input.
"""

from __future__ import annotations

import functools
import inspect
import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from relaxspec import params as params_mod
from relaxspec.errors import RelaxSpecError
from relaxspec.serve import API_KEY_ENV, DEFAULT_MAX_BODY_BYTES

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
        help="source weights: math, code, synthcode, math_broad, synthpipes, math_styles "
        "(data/tokens.py TRAIN_SOURCES; default math=0.7,code=0.3)"
    ),
]


def _model_dir(path: Path | None, role: str) -> Path:
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


def _given_flags(ctx: typer.Context, *names: str) -> list[str]:
    """Those of ``names`` (parameter names) the user set, on the command line or in the environment."""
    sources = {n: ctx.get_parameter_source(n) for n in names}
    return [n for n, source in sources.items() if source is not None and source.name != "DEFAULT"]


def _check_engine(engine: str, kernels: str) -> None:
    if engine not in ("relaxspec", "vllm"):
        raise RelaxSpecError(f"--engine must be relaxspec or vllm, got {engine!r}")
    if engine == "vllm" and kernels != "auto":
        raise RelaxSpecError("--kernels applies to our engine; vLLM runs its own kernels (--engine vllm)")


ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        help="our engine's torch threads (default: the CPUs this process can really use: affinity, "
        "cgroup quota, minus CPUs other processes keep busy; env RELAXSPEC_THREADS)"
    ),
]


def _configure_threads(threads: int | None, engine: str) -> None:
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
            params.update(_training_overrides(kwargs.pop("set_")))
            opts = MethodOptions(kwargs.pop("method"), params, {r: kwargs.pop(r) for r in MODEL_HELP})
            # bad method or parameter: fail before loading models, by the rules of the engine that
            # runs it (vLLM rows have options of their own, e.g. prove-lossless's seam)
            if kwargs.get("engine") == "vllm":
                from relaxspec.integrations.vllm.runners import resolve as resolve_vllm

                resolve_vllm(opts.method, opts.params)
            else:
                from relaxspec.methods import resolve_params

                resolve_params(opts.method, opts.params)
            _configure_threads(threads, kwargs.get("engine", "relaxspec"))
            return command(opts=opts, **kwargs)

        parameters = own + added
        run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        return run

    return decorate


def _parse_value(text: str) -> Any:
    """``--set`` values: JSON scalars (numbers, true/false) as such, anything else as a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


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
    _check_engine(engine, kernels)
    if engine == "vllm":
        from relaxspec.integrations.vllm.runners import cli_generate

        cli_generate(opts.method, opts.params, opts.paths, prompt, temperature, top_k, top_p, seed,
                     max_new_tokens, stop, as_json)  # fmt: skip
        return
    from relaxspec.core.sampling import SamplingParams
    from relaxspec.methods import build_engine, load_models

    params = SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        max_new_tokens=max_new_tokens,
        stop=tuple(stop or ()),
    )
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


@app.command()
def theory(
    p: Annotated[str | None, typer.Option(help="target distribution, comma-separated")] = None,
    q: Annotated[str | None, typer.Option(help="proposal distribution, comma-separated")] = None,
    theta: float = 0.95,
    prompt: Annotated[
        str | None, typer.Option(help="with a model pair: analyse a generation of this prompt")
    ] = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    eps: Annotated[float | None, typer.Option(help="per-step TV bound ε for the certified horizon")] = None,
    delta_horizon: Annotated[float, typer.Option("--delta", help="coupling failure probability δ")] = 0.05,
) -> None:
    """NSD theory (docs/design.md §3): R, ES, TV, acceptance for p and q, or along a model-pair generation."""
    from relaxspec.eval.theory_report import theory_for_distributions, theory_for_models

    if prompt is not None:
        report = theory_for_models(
            _model_dir(target, "target"),
            _model_dir(draft, "draft"),
            prompt,
            theta,
            max_new_tokens,
            temperature,
            delta_horizon,
        )
    elif p is not None and q is not None:
        report = theory_for_distributions(p, q, theta, eps, delta_horizon)
    else:
        raise RelaxSpecError("give --p and --q (distributions), or --prompt (with a model pair)")
    print(json.dumps(report, indent=1))


@data_app.command("build")
def data_build(
    out: Annotated[Path, typer.Option(help="corpus directory")] = Path("data/corpus"),
    n_math_train: int = 200_000,
    n_math_eval: int = 1_000,
    n_synthcode_train: Annotated[
        int | None, typer.Option(help="synthetic code tasks for training (default n_math_train / 2)")
    ] = None,
    n_math_broad_train: Annotated[
        int | None, typer.Option(help="broadened math problems for training (default n_math_train / 2)")
    ] = None,
) -> None:
    """Build the offline corpus (stdlib Python + synthetic math and code tasks) deterministically."""
    from relaxspec.data.corpus import CorpusConfig, build_corpus

    config = CorpusConfig(
        n_math_train=n_math_train,
        n_math_eval=n_math_eval,
        n_synthcode_train=n_synthcode_train,
        n_math_broad_train=n_math_broad_train,
    )
    manifest = build_corpus(out, config)
    print(json.dumps({k: v for k, v in manifest.items() if k != "heldout_modules"}, indent=1))


@train_app.command("tokenizer")
def train_tokenizer_cmd(
    corpus: Path = Path("data/corpus"),
    out: Path = Path("models/tokenizer"),
    vocab_size: int = 4096,
) -> None:
    """Train the byte-level BPE tokenizer (digits split, EOS/PAD/MASK reserved)."""
    from relaxspec.train.tokenizer import train_tokenizer

    tok = train_tokenizer(corpus, out, vocab_size)
    print(f"tokenizer with {len(tok)} tokens saved to {out}")


@train_app.command("ar")
def train_ar_cmd(
    config: Annotated[str, typer.Option(help="model preset: target, draft, tiny")] = "target",
    corpus: Path = Path("data/corpus"),
    tokenizer: Path = Path("models/tokenizer"),
    run_dir: Annotated[Path | None, typer.Option(help="checkpoints (default runs/<config>)")] = None,
    export: Annotated[Path | None, typer.Option(help="final model dir (default models/<config>)")] = None,
    steps: int | None = None,
    max_minutes: float | None = None,
    mixture: MixtureOpt = None,
    init: Annotated[
        Path | None, typer.Option(help="start from this model's weights (fine-tune; same preset)")
    ] = None,
    set_: TrainSetOpt = None,
) -> None:
    """Train (or resume) a Llama-style causal LM preset with the shared loop."""
    from relaxspec.train.ar import train_ar

    overrides: dict[str, Any] = {}
    for item in set_ or []:
        if "=" not in item:
            raise RelaxSpecError(f"--set expects name=value, got {item!r}")
        name, value = item.split("=", 1)
        overrides[name] = _parse_value(value)
    if steps is not None:
        overrides["steps"] = steps
    if max_minutes is not None:
        overrides["max_minutes"] = max_minutes
    _, state = train_ar(
        config,
        corpus,
        tokenizer,
        run_dir or Path("runs") / config,
        export_dir=export or Path("models") / config,
        overrides=overrides,
        command=shlex.join(["relaxspec", *sys.argv[1:]]),
        mixture=_parse_mixture(mixture) if mixture is not None else None,
        init=init,
    )
    print(f"step {state.step}, {state.tokens_seen} tokens, {state.elapsed_seconds / 60:.1f} min")


def _parse_mixture(text: str) -> dict[str, float]:
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


@train_app.command("export")
def train_export_cmd(
    config: Annotated[str, typer.Option(help="model preset of the run")] = "target",
    run_dir: Annotated[Path | None, typer.Option(help="run directory (default runs/<config>)")] = None,
    tokenizer: Path = Path("models/tokenizer"),
    out: Annotated[Path | None, typer.Option(help="model dir (default models/<config>)")] = None,
) -> None:
    """Export the newest checkpoint of a (possibly unfinished) run as a bf16 model directory."""
    from relaxspec.train.ar import export_checkpoint

    path = export_checkpoint(
        run_dir or Path("runs") / config, config, tokenizer, out or Path("models") / config
    )
    print(f"exported to {path}")


@train_app.command("diffusion")
def train_diffusion_cmd(
    init: Annotated[
        str, typer.Option(help="initial weights: target (first --layers), draft, scratch")
    ] = "target",
    layers: Annotated[int, typer.Option(help="decoder layers copied from the target (init=target)")] = 2,
    gamma: Annotated[int, typer.Option(help="training block length γ")] = 16,
    ar_weight: Annotated[float, typer.Option(help="weight of the next-token term")] = 1.0,
    corpus: Path = Path("data/corpus"),
    tokenizer: Path = Path("models/tokenizer"),
    target: TargetOpt = None,
    draft: DraftOpt = None,
    run_dir: Annotated[Path, typer.Option(help="checkpoints (resumed if present)")] = Path("runs/diffusion"),
    export: Annotated[Path, typer.Option(help="final model directory")] = Path("models/diffusion"),
    steps: int | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    lr: float | None = None,
    max_minutes: MaxMinutesOpt = None,
    mixture: MixtureOpt = None,
    set_: TrainSetOpt = None,
    export_partial: Annotated[
        bool, typer.Option(help="export even if --max-minutes stopped the run early")
    ] = False,
) -> None:
    """Train (or resume) the masked-diffusion drafter (LLaDA/MDLM loss) and export it with a card."""
    from relaxspec.train.diffusion import DiffusionRecipe, train_diffusion

    overrides = _training_overrides(
        set_, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, max_minutes=max_minutes
    )
    recipe = DiffusionRecipe(gamma=gamma, ar_weight=ar_weight, init=init, layers=layers)
    _, state = train_diffusion(
        recipe,
        corpus,
        tokenizer,
        run_dir,
        export,
        overrides,
        target_dir=target,
        draft_dir=draft,
        export_partial=export_partial,
        mixture=_parse_mixture(mixture) if mixture is not None else None,
    )
    print(f"step {state.step}, {state.tokens_seen} tokens, {state.elapsed_seconds / 60:.1f} min")


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RelaxSpecError(f"--{name} expects comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise RelaxSpecError(f"--{name} expects integers >= 1, got {text!r}")
    return values


@train_app.command("diffusion-sweep")
def train_diffusion_sweep_cmd(
    gammas: Annotated[str, typer.Option(help="block lengths γ to try")] = "8,16,32",
    steps: Annotated[str, typer.Option(help="denoising steps S to try (S <= γ)")] = "1,2,4,8",
    n_math: Annotated[int, typer.Option(help="math training prompts")] = 16,
    n_code: Annotated[int, typer.Option(help="code training prompts")] = 4,
    max_new_tokens: int = 96,
    corpus: Path = Path("data/corpus"),
    target: TargetOpt = None,
    diffusion: Annotated[
        Path | None, typer.Option(help="drafter (default: bundled models/diffusion)")
    ] = None,
    write: Annotated[
        bool, typer.Option(help="record the chosen (γ, S) in the drafter's config and card")
    ] = True,
) -> None:
    """Strict-SDD (γ, S) sweep on training prompts vs AR in the same run; pick the operating point."""
    from relaxspec.engine.proposers.diffusion import load_diffusion
    from relaxspec.eval.sdd_sweep import sweep_operating_points, training_prompts
    from relaxspec.models import load_model

    drafter_dir = _model_dir(diffusion, "diffusion")
    result = sweep_operating_points(
        load_model(_model_dir(target, "target")),
        load_diffusion(drafter_dir),
        _int_list(gammas, "gammas"),
        _int_list(steps, "steps"),
        training_prompts(corpus, n_math, n_code),
        max_new_tokens=max_new_tokens,
    )
    if write:
        from relaxspec.train.diffusion import record_sweep

        record_sweep(drafter_dir, result)
    print(json.dumps(result["chosen"]))


@train_app.command("survival")
def train_survival_cmd(
    target: TargetOpt = None,
    diffusion: Annotated[
        Path | None, typer.Option(help="drafter (default: bundled models/diffusion)")
    ] = None,
    corpus: Path = Path("data/corpus"),
    out: Annotated[Path, typer.Option(help="survival model directory")] = Path("models/survival"),
    run_dir: Annotated[Path, typer.Option(help="trajectory cache, fit checkpoints")] = Path("runs/survival"),
    n_math: Annotated[int, typer.Option(help="math training prompts for trajectories")] = 240,
    n_code: Annotated[int, typer.Option(help="code training prompts for trajectories")] = 60,
    max_new_tokens: int = 128,
    gamma: Annotated[int | None, typer.Option(help="block length (default: drafter's)")] = None,
    steps: Annotated[int | None, typer.Option(help="denoising steps (default: drafter's)")] = None,
    epochs: float = 15.0,
    val_fraction: float = 0.2,
) -> None:
    """Collect Strict-SDD trajectories on training prompts; train marginal + conditional survival MLPs."""
    from relaxspec.train.survival import FitConfig, SurvivalRun, train_survival

    run = SurvivalRun(
        n_math=n_math,
        n_code=n_code,
        max_new_tokens=max_new_tokens,
        gamma=gamma,
        steps=steps,
        val_fraction=val_fraction,
        fit=FitConfig(epochs=epochs),
    )
    metrics = train_survival(
        _model_dir(target, "target"), _model_dir(diffusion, "diffusion"), corpus, out, run_dir, run
    )
    keys = ("bce", "bce_position_only", "auroc", "auroc_raw")
    summary = {kind: {m: v[m] for m in keys} for kind, v in metrics.items()}
    print(json.dumps(summary, indent=1))


def _training_overrides(items: list[str] | None, **given: Any) -> dict[str, Any]:
    """``--set name=value`` items plus the explicitly given options (None = not given)."""
    overrides: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise RelaxSpecError(f"--set expects name=value, got {item!r}")
        name, value = item.split("=", 1)
        overrides[name] = _parse_value(value)
    overrides.update({k: v for k, v in given.items() if v is not None})
    return overrides


@train_app.command("block")
def train_block_cmd(
    base: Annotated[
        Path | None, typer.Option(help="causal LM to fine-tune (default: bundled models/target)")
    ] = None,
    corpus: Path = Path("data/corpus"),
    block_size: Annotated[int, typer.Option(help="block size B the proposer learns")] = 16,
    run_dir: Annotated[Path, typer.Option(help="checkpoints (resumed if present)")] = Path("runs/block"),
    export: Annotated[Path, typer.Option(help="final model directory")] = Path("models/block"),
    steps: int | None = None,
    batch_size: int | None = None,
    seq_len: Annotated[int | None, typer.Option(help="window length L (fed as 2L)")] = None,
    lr: float | None = None,
    max_minutes: MaxMinutesOpt = None,
    mixture: MixtureOpt = None,
    set_: TrainSetOpt = None,
) -> None:
    """Fine-tune a causal LM into a MARS block proposer (ProVe §2) and export it with a model card."""
    from relaxspec.train.block import train_block

    overrides = _training_overrides(
        set_, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, max_minutes=max_minutes
    )
    _, state = train_block(
        _model_dir(base, "target"),
        corpus,
        run_dir,
        export,
        block_size=block_size,
        overrides=overrides,
        mixture=_parse_mixture(mixture) if mixture is not None else None,
    )
    print(f"step {state.step}, {state.tokens_seen} tokens, {state.elapsed_seconds / 60:.1f} min")


@train_app.command("eagle")
def train_eagle_cmd(
    target: TargetOpt = None,
    corpus: Path = Path("data/corpus"),
    run_dir: Annotated[Path, typer.Option(help="checkpoints (resumed if present)")] = Path("runs/eagle"),
    export: Annotated[Path, typer.Option(help="head directory (usable as --draft)")] = Path("models/eagle"),
    steps: int | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    lr: float | None = None,
    max_minutes: MaxMinutesOpt = None,
    mixture: MixtureOpt = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="training option name=value (also noise, cls_weight of the objective)"),
    ] = None,
) -> None:
    """Train (or resume) an EAGLE-style head on the target's hidden states; export it with a model card."""
    from relaxspec.train.eagle import train_eagle

    overrides = _training_overrides(
        set_, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, max_minutes=max_minutes
    )
    _, state = train_eagle(
        _model_dir(target, "target"),
        corpus,
        run_dir,
        export,
        overrides=overrides,
        mixture=_parse_mixture(mixture) if mixture is not None else None,
    )
    print(f"step {state.step}, {state.tokens_seen} tokens, {state.elapsed_seconds / 60:.1f} min")


@train_app.command("distill-data")
def train_distill_data_cmd(
    teacher: TargetOpt = None,
    corpus: Path = Path("data/corpus"),
    out: Annotated[Path, typer.Option(help="JSONL of teacher rows (appended; resumed)")] = Path(
        "runs/distill/rows.jsonl"
    ),
    n_code: Annotated[
        int, typer.Option(help="function-signature prompts from the stdlib training split")
    ] = 3400,
    n_math: Annotated[int, typer.Option(help="math training questions")] = 800,
    n_synthcode: Annotated[
        int, typer.Option(help="synthetic code task prompts (training seeds; half pipelines)")
    ] = 0,
    n_math_styles: Annotated[
        int, typer.Option(help="math questions in training phrasing styles (data/mathgen.py)")
    ] = 0,
    n_codevar: Annotated[int, typer.Option(help="variant-family code tasks (training split)")] = 0,
    n_mathvar: Annotated[int, typer.Option(help="variant-family math problems (training split)")] = 0,
    temperature: Annotated[
        float, typer.Option(help="teacher sampling temperature (0: greedy continuations)")
    ] = 0.0,
    top_p: Annotated[float, typer.Option(help="teacher top-p when sampling")] = 1.0,
    max_new_tokens: int = 96,
    max_prompt_tokens: int = 160,
    batch_size: int = 48,
) -> None:
    """Continue training-split prompts with the teacher (greedy or sampled): `train distill`'s data."""
    from relaxspec.train.distill import build_distill_data

    path = build_distill_data(
        _model_dir(teacher, "target"),
        corpus,
        out,
        n_code=n_code,
        n_math=n_math,
        n_synthcode=n_synthcode,
        n_math_styles=n_math_styles,
        n_codevar=n_codevar,
        n_mathvar=n_mathvar,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        max_prompt_tokens=max_prompt_tokens,
        batch_size=batch_size,
    )
    print(f"teacher rows in {path}")


@train_app.command("distill")
def train_distill_cmd(
    student: Annotated[
        Path | None, typer.Option(help="drafter to start from (default: bundled draft)")
    ] = None,
    teacher: TargetOpt = None,
    data: Annotated[Path, typer.Option(help="rows from `train distill-data`")] = Path(
        "runs/distill/rows.jsonl"
    ),
    corpus: Path = Path("data/corpus"),
    run_dir: Annotated[Path, typer.Option(help="checkpoints (resumed if present)")] = Path(
        "runs/distill/run"
    ),
    export: Annotated[Path, typer.Option(help="final model directory")] = Path("runs/distill/model"),
    corpus_weight: Annotated[float, typer.Option(help="share of plain corpus windows per batch")] = 0.25,
    temperature: Annotated[float, typer.Option(help="KL temperature")] = 1.0,
    corpus_mixture: Annotated[
        str, typer.Option(help="sources of the plain corpus windows, SOURCE=W,...")
    ] = "math=0.5,code=0.5",
    steps: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    max_minutes: MaxMinutesOpt = None,
    set_: TrainSetOpt = None,
) -> None:
    """Distil the target into a drafter (forward KL on the teacher's own continuations, DistillSpec)."""
    from relaxspec.train.distill import DistillRecipe, train_distill

    overrides = _training_overrides(set_, steps=steps, batch_size=batch_size, lr=lr, max_minutes=max_minutes)
    _, state = train_distill(
        _model_dir(student, "draft"),
        _model_dir(teacher, "target"),
        data,
        corpus,
        run_dir,
        export,
        DistillRecipe(
            corpus_weight=corpus_weight,
            temperature=temperature,
            corpus_mixture=_parse_mixture(corpus_mixture),
        ),
        overrides,
        command=shlex.join(["relaxspec", *sys.argv[1:]]),
    )
    print(f"step {state.step}, {state.tokens_seen} tokens, {state.elapsed_seconds / 60:.1f} min")


@train_app.command("card")
def train_card_cmd(
    model: Annotated[Path, typer.Option(help="exported model directory (AR, block or diffusion)")],
    metrics: Annotated[
        list[Path] | None, typer.Option(help="JSON file of metrics to record (repeatable)")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="metric name=value")] = None,
    measured_with: Annotated[
        list[str] | None, typer.Option(help="command that measured the metrics (repeatable)")
    ] = None,
) -> None:
    """Record metrics measured after training (eval, bench) and rewrite the model's card."""
    from relaxspec.train.recard import rewrite_card

    values: dict[str, Any] = {}
    for path in metrics or []:
        try:
            loaded = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise RelaxSpecError(f"cannot read metrics from {path}: {err}") from None
        if not isinstance(loaded, dict):
            raise RelaxSpecError(f"{path} must hold a JSON object of metrics")
        values.update(loaded)
    values.update(_training_overrides(set_))
    print(f"wrote {rewrite_card(model, values, measured_with)}")


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
    temperature: float = 0.0,
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
    from relaxspec.eval.bench import (
        BenchConfig,
        parse_models,
        parse_peers,
        parse_seeds,
        run_bench,
        split_list,
    )

    config = BenchConfig(
        methods=split_list(methods),
        datasets=[str(prompts)] if prompts is not None else split_list(dataset),
        limit=limit,
        temperature=temperature,
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
        _configure_threads(threads, engine)  # after the neighbours start: they are not ours
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
    top_p: Annotated[float, typer.Option(help="top-p of the plain top-p AR baseline (T > 0)")] = 0.95,
    max_new_tokens: int = 128,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    out: Annotated[Path, typer.Option(help="results directory (re-running resumes it)")] = Path(
        "results/tournament"
    ),
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Every relaxed rule over a grid of its parameter beside greedy AR, top-p AR and exact SD on
    the same models, prompts and seeds: table, speed–quality frontier plot, JSON and a verdict per
    dataset and temperature (docs/relaxed-rules.md)."""
    from relaxspec.eval.bench import parse_models, parse_seeds, split_list
    from relaxspec.eval.tournament import TournamentConfig, run_tournament

    try:
        temps = [float(t) for t in split_list(temperatures)]
    except ValueError:
        raise RelaxSpecError(
            f"--temperatures expects comma-separated numbers, got {temperatures!r}"
        ) from None
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

    report = evaluate_model(_model_dir(model, "target"), corpus, limit=limit, out=out)
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

    dirs = model or [_model_dir(None, "target"), _model_dir(None, "draft")]
    width_list = _int_list(widths, "widths")
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
    _check_engine(engine, kernels)
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
        from relaxspec.integrations.vllm.serve import parse_k_schedule
        from relaxspec.integrations.vllm.serve import serve as vllm_serve

        for name in _given_flags(ctx, "max_queue", "batching", "adaptive_k", "extra_models"):
            flag = "--" + name.replace("_", "-")
            raise RelaxSpecError(f"{flag} is our engine's and has no equivalent in vLLM (--engine vllm)")
        concurrency = max_concurrency if _given_flags(ctx, "max_concurrency") else None  # else vLLM's
        schedule = parse_k_schedule(k_schedule) if k_schedule is not None else None
        params = {n: v for n, v in opts.params.items() if n != "k"}
        k = opts.params.get("k", params_mod.DEFAULT_K)
        vllm_serve(opts.method, params, k=k, target=opts.paths.get("target"),
                   draft=opts.paths.get("draft"), host=host, port=port, api_key=api_key,
                   served_model_name=model_name, k_schedule=schedule, max_body_bytes=max_body_bytes,
                   max_tokens_cap=max_tokens_cap, default_max_tokens=default_max_tokens, log_level=log_level,
                   max_concurrency=concurrency)  # fmt: skip
        return
    import uvicorn

    from relaxspec.serve.pool import ServingPool
    from relaxspec.serve.server import create_app, load_serving_models, serving_tokenizer_and_context

    models = load_serving_models(opts.method, opts.paths, extra_roles=extra_models, kernels=kernels)
    pool = ServingPool(
        models,
        opts.method,
        opts.params,
        max_concurrency=max_concurrency,
        max_queue=max_queue,
        batching=batching,
        adaptive_k=adaptive_k,
    )
    tokenizer, context = serving_tokenizer_and_context(models, opts.method)
    app = create_app(
        pool,
        model_name,
        tokenizer,
        context,
        max_tokens_cap=max_tokens_cap,
        default_max_tokens=default_max_tokens,
        max_body_bytes=max_body_bytes,
        api_key=api_key,
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level)


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
        concurrency=_int_list(concurrency, "concurrency"),
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


def main() -> None:
    try:
        app()
    except RelaxSpecError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
