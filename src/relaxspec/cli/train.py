"""``relaxspec train``: the tokenizer, the bundled models (AR, diffusion, block, EAGLE, survival
signals), distillation data and model cards. Each command is a thin layer over
:mod:`relaxspec.train`."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from relaxspec.cli.common import (
    DraftOpt,
    HeadMixtureOpt,
    MaxMinutesOpt,
    MixtureOpt,
    TargetOpt,
    TrainSetOpt,
    int_list,
    parse_mixture,
    parse_value,
    role_dir,
    train_app,
    training_overrides,
)
from relaxspec.errors import RelaxSpecError


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
        overrides[name] = parse_value(value)
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
        mixture=parse_mixture(mixture) if mixture is not None else None,
        init=init,
    )
    print(f"step {state.step}, {state.tokens_seen} tokens, {state.elapsed_seconds / 60:.1f} min")


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

    overrides = training_overrides(
        set_, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, max_minutes=max_minutes
    )
    recipe = DiffusionRecipe(
        gamma=gamma,
        ar_weight=ar_weight,
        init=init,
        layers=layers,
        target=str(target) if target is not None else None,
        draft=str(draft) if draft is not None else None,
        mixture=parse_mixture(mixture) if mixture is not None else None,
    )
    _, state = train_diffusion(
        recipe, corpus, tokenizer, run_dir, export, overrides, export_partial=export_partial
    )
    print(f"step {state.step}, {state.tokens_seen} tokens, {state.elapsed_seconds / 60:.1f} min")


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

    drafter_dir = role_dir(diffusion, "diffusion")
    result = sweep_operating_points(
        load_model(role_dir(target, "target")),
        load_diffusion(drafter_dir),
        int_list(gammas, "gammas"),
        int_list(steps, "steps"),
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
        role_dir(target, "target"), role_dir(diffusion, "diffusion"), corpus, out, run_dir, run
    )
    keys = ("bce", "bce_position_only", "auroc", "auroc_raw")
    summary = {kind: {m: v[m] for m in keys} for kind, v in metrics.items()}
    print(json.dumps(summary, indent=1))


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

    overrides = training_overrides(
        set_, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, max_minutes=max_minutes
    )
    _, state = train_block(
        role_dir(base, "target"),
        corpus,
        run_dir,
        export,
        block_size=block_size,
        overrides=overrides,
        mixture=parse_mixture(mixture) if mixture is not None else None,
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
    mixture: HeadMixtureOpt = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="training option name=value (also noise, cls_weight, unroll of the objective; "
            "draft_vocab: the export's default draft vocabulary size, 0 = all tokens)",
        ),
    ] = None,
    init: Annotated[
        Path | None, typer.Option(help="start from this EAGLE head's weights (fine-tune; same target)")
    ] = None,
) -> None:
    """Train (or resume) an EAGLE-style head on the target's hidden states; export it with a model card."""
    from relaxspec.train.eagle import train_eagle

    overrides = training_overrides(
        set_, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, max_minutes=max_minutes
    )
    _, state = train_eagle(
        role_dir(target, "target"),
        corpus,
        run_dir,
        export,
        overrides=overrides,
        mixture=parse_mixture(mixture) if mixture is not None else None,
        init=init,
    )
    print(f"step {state.step}, {state.tokens_seen} tokens, {state.elapsed_seconds / 60:.1f} min")


@train_app.command("eagle-vocab")
def train_eagle_vocab_cmd(
    head: Annotated[Path, typer.Option(help="the EAGLE head directory to give a draft vocabulary")] = Path(
        "models/eagle"
    ),
    target: TargetOpt = None,
    corpus: Path = Path("data/corpus"),
    size: Annotated[
        int, typer.Option(help="default draft vocabulary size: the n most frequent tokens (0: all)")
    ] = 1024,
    mixture: MixtureOpt = None,
) -> None:
    """Rank the target's tokens by training-data frequency and store the ranking in an EAGLE head
    directory: the head then drafts over its ``size`` most frequent tokens (EAGLE-3's draft
    vocabulary; ``--set eagle_vocab=n`` chooses another size at run time)."""
    from relaxspec.engine.proposers.draft_vocab import VOCAB_FILE
    from relaxspec.train.draft_vocab import write_eagle_vocab
    from relaxspec.train.eagle import write_eagle_card

    shares = write_eagle_vocab(
        head,
        role_dir(target, "target"),
        corpus,
        size,
        mixture=parse_mixture(mixture) if mixture is not None else None,
    )
    if (head / "training.json").is_file():
        write_eagle_card(head)  # the card names the default size
    covered = ", ".join(f"{name} {share:.4f}" for name, share in shares.items())
    print(f"wrote {head / VOCAB_FILE}: default size {size}; tokens covered: {covered}")


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
    from relaxspec.train.distill import TeacherDecoding, TeacherPrompts, build_distill_data

    want = TeacherPrompts(n_code, n_math, n_synthcode, n_math_styles, n_codevar, n_mathvar)
    how = TeacherDecoding(max_new_tokens, max_prompt_tokens, batch_size, temperature, top_p)
    path = build_distill_data(role_dir(teacher, "target"), corpus, out, want, how)
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

    overrides = training_overrides(set_, steps=steps, batch_size=batch_size, lr=lr, max_minutes=max_minutes)
    _, state = train_distill(
        role_dir(student, "draft"),
        role_dir(teacher, "target"),
        data,
        corpus,
        run_dir,
        export,
        DistillRecipe(
            corpus_weight=corpus_weight,
            temperature=temperature,
            corpus_mixture=parse_mixture(corpus_mixture),
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
    values.update(training_overrides(set_))
    print(f"wrote {rewrite_card(model, values, measured_with)}")
