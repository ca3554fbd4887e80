"""One training loop for every model of the family (AR, block proposer, diffusion drafter).

Built on Hugging Face Accelerate, so the same command trains on one CPU here (bf16 autocast) and on
several GPUs or machines (``accelerate launch`` with DDP/FSDP) for users training proposers for real
models. The loop owns what every training needs — AdamW, warmup + cosine schedule, gradient
accumulation and clipping, periodic evaluation, atomic checkpoints with resume, a progress bar with
tokens/s and loss — and takes the model-specific parts as two callables:

- ``batch_fn(step, micro) -> dict`` — the global micro-batch of a step; a pure function of its
  arguments, so a resumed run sees the same data as an uninterrupted one;
- ``loss_fn(model, batch) -> Tensor`` — the scalar training loss.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from relaxspec.data.tokens import TokenMixture
from relaxspec.errors import RelaxSpecError

Batch = dict[str, torch.Tensor]


@dataclass
class TrainConfig:
    out_dir: str
    steps: int
    batch_size: int = 16  # rows per micro-batch (global, split across processes)
    grad_accum: int = 1
    seq_len: int = 256
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 250
    ckpt_every: int = 250
    keep_checkpoints: int = 2
    seed: int = 0
    mixed_precision: str = "bf16"  # "bf16" autocast (CPU or GPU) or "no"
    max_minutes: float | None = None  # stop at a checkpoint after this much wall time; resume later

    def validate(self) -> None:
        checks = [
            (self.steps >= 1, "steps must be >= 1"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.grad_accum >= 1, "grad_accum must be >= 1"),
            (self.seq_len >= 2, "seq_len must be >= 2"),
            (self.lr > 0, "lr must be > 0"),
            (0 <= self.min_lr_ratio <= 1, "min_lr_ratio must be in [0, 1]"),
            (self.warmup >= 0, "warmup must be >= 0"),
            (self.ckpt_every >= 1 and self.eval_every >= 1, "ckpt_every and eval_every must be >= 1"),
            (self.mixed_precision in ("bf16", "no"), "mixed_precision must be 'bf16' or 'no'"),
        ]
        for ok, message in checks:
            if not ok:
                raise RelaxSpecError(f"invalid training config: {message}")


def make_config(out_dir: str | Path, defaults: dict, overrides: dict | None = None) -> TrainConfig:
    """A validated :class:`TrainConfig` from a recipe's defaults and the user's overrides."""
    fields = {**defaults, **(overrides or {})}
    unknown = set(fields) - set(TrainConfig.__dataclass_fields__) - {"out_dir"}
    if unknown:
        raise RelaxSpecError(f"unknown training option(s): {sorted(unknown)}")
    config = TrainConfig(out_dir=str(out_dir), **fields)
    config.validate()
    return config


@dataclass
class TrainState:
    step: int = 0
    tokens_seen: int = 0
    elapsed_seconds: float = 0.0
    last_loss: float = math.nan
    history: list[dict] = field(default_factory=list)  # evaluation records


def finished_run_record(model: torch.nn.Module, config: TrainConfig, state: TrainState) -> dict:
    """What an export's ``training.json`` says about the run that produced it (cards read it)."""
    return {
        "train_config": asdict(config),
        "parameters": sum(p.numel() for p in model.parameters()),
        "checkpoint_step": state.step,
        "complete": state.step >= config.steps,
        "tokens_seen": state.tokens_seen,
        "wall_seconds": state.elapsed_seconds,
        "history": state.history,
    }


def write_run_record(run_dir: str | Path, record: dict) -> None:
    """``run_dir/run.json``: what a run was started with (command, inputs, settings)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "run.json").write_text(json.dumps(record, indent=1))


def check_seq_len(config: TrainConfig, context: int) -> None:
    """Training windows must fit the model's context window."""
    if config.seq_len > context:
        raise RelaxSpecError(f"seq_len {config.seq_len} exceeds the model's context {context}")


def window_batches(data: TokenMixture, config: TrainConfig) -> Callable[[int, int], Batch]:
    """``batch_fn`` for :func:`train`: micro-batch ``micro`` of ``step`` as ``input_ids`` windows of
    ``data`` (a pure function of the seed and the index: a resumed run sees the same batches)."""

    def batch(step: int, micro: int) -> Batch:
        index = step * config.grad_accum + micro
        return {"input_ids": data.batch(config.seed, index, config.batch_size, config.seq_len)}

    return batch


def lr_lambda(config: TrainConfig) -> Callable[[int], float]:
    """Linear warmup then cosine decay to ``min_lr_ratio`` at ``steps``."""

    def factor(step: int) -> float:
        if step < config.warmup:
            return (step + 1) / (config.warmup + 1)
        progress = min(1.0, (step - config.warmup) / max(1, config.steps - config.warmup))
        return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def _checkpoints(out_dir: Path) -> list[Path]:
    ckpt_root = out_dir / "checkpoints"
    if not ckpt_root.is_dir():
        return []
    done = [p for p in ckpt_root.glob("step-*") if (p / "trainer_state.json").is_file()]
    return sorted(done, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    ckpts = _checkpoints(Path(out_dir))
    return ckpts[-1] if ckpts else None


def _save_checkpoint(accelerator: Accelerator, out_dir: Path, state: TrainState, config: TrainConfig) -> Path:
    """Write a checkpoint atomically (to a temp dir, then rename) and prune old ones."""
    final = out_dir / "checkpoints" / f"step-{state.step}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        (tmp / "trainer_state.json").write_text(json.dumps(asdict(state), indent=1))
        (tmp / "train_config.json").write_text(json.dumps(asdict(config), indent=1))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in _checkpoints(out_dir)[: -config.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _load_checkpoint(accelerator: Accelerator, ckpt: Path) -> TrainState:
    try:
        accelerator.load_state(str(ckpt))
        state = TrainState(**json.loads((ckpt / "trainer_state.json").read_text()))
    except Exception as err:  # truncated tensors, bad json, wrong model shape
        raise RelaxSpecError(
            f"corrupt or incompatible checkpoint {ckpt}: {err}. Delete it to resume from an earlier one."
        ) from None
    return state


@dataclass
class _Parts:
    """What Accelerate prepared for one run: the wrapped model, optimizer and LR schedule."""

    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler


def train(
    model: torch.nn.Module,
    config: TrainConfig,
    batch_fn: Callable[[int, int], Batch],
    loss_fn: Callable[[torch.nn.Module, Batch], torch.Tensor],
    eval_fn: Callable[[torch.nn.Module], dict[str, float]] | None = None,
    resume: bool = True,
    progress: bool = True,
) -> tuple[torch.nn.Module, TrainState]:
    """Train ``model`` for ``config.steps`` optimizer steps; resume from the last checkpoint.

    Returns the unwrapped model and the final state. A checkpoint is written every
    ``ckpt_every`` steps, at the end and when ``max_minutes`` is reached, so an interrupted run
    (Ctrl-C, a killed process) loses at most the steps since its last checkpoint.
    """
    config.validate()
    out_dir = Path(config.out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RelaxSpecError(f"cannot create output directory {out_dir}: {err.strerror}") from None
    set_seed(config.seed)
    run = _prepare(model, config)
    accelerator = run.accelerator
    state = TrainState()
    ckpt = latest_checkpoint(out_dir) if resume else None
    if ckpt is not None:
        state = _load_checkpoint(accelerator, ckpt)
        accelerator.print(f"resumed from {ckpt} (step {state.step})")
    started = time.perf_counter()
    elapsed_before = state.elapsed_seconds
    show = progress and accelerator.is_main_process
    bar = tqdm(total=config.steps, initial=state.step, disable=not show, desc="train", dynamic_ncols=True)
    try:
        while state.step < config.steps:
            step_loss, step_tokens = _optimizer_step(run, config, batch_fn, loss_fn, state.step)
            state.step += 1
            state.tokens_seen += step_tokens
            state.last_loss = step_loss
            state.elapsed_seconds = elapsed_before + time.perf_counter() - started
            _show_progress(bar, state, run.scheduler.get_last_lr()[0])
            if eval_fn is not None and (state.step % config.eval_every == 0 or state.step == config.steps):
                _evaluate(run, eval_fn, state, step_loss)
            out_of_time = (
                config.max_minutes is not None and time.perf_counter() - started > 60 * config.max_minutes
            )
            if state.step % config.ckpt_every == 0 or state.step == config.steps or out_of_time:
                _save_checkpoint(accelerator, out_dir, state, config)
            if out_of_time:
                accelerator.print(
                    f"stopping after {config.max_minutes} minutes at step {state.step}; "
                    "run the same command again to resume"
                )
                break
    except KeyboardInterrupt:
        bar.close()
        raise _interrupted(out_dir, state) from None
    bar.close()
    return accelerator.unwrap_model(run.model, keep_fp32_wrapper=False), state


def _interrupted(out_dir: Path, state: TrainState) -> RelaxSpecError:
    """The error for Ctrl-C: the step in flight may have half-updated the weights, so the run
    resumes from the last clean checkpoint."""
    last = latest_checkpoint(out_dir)
    return RelaxSpecError(
        f"training interrupted at step {state.step}; rerun the same command to resume from "
        f"{last or 'the start (no checkpoint yet)'}"
    )


def _show_progress(bar: tqdm, state: TrainState, lr: float) -> None:
    bar.update(1)
    bar.set_postfix(
        loss=f"{state.last_loss:.3f}",
        tok_s=f"{state.tokens_seen / max(state.elapsed_seconds, 1e-9):.0f}",
        lr=f"{lr:.2e}",
    )


def _release_other_precision(mixed_precision: str) -> None:
    """Accelerate keeps one process-wide state and refuses a second ``Accelerator`` with another
    precision; a later run in the same process (the EAGLE head trains in fp32 after a bf16 run in
    a test session or a notebook) resets that state instead. The distributed part is kept."""
    if AcceleratorState._shared_state and AcceleratorState().mixed_precision != mixed_precision:
        AcceleratorState._reset_state()


def _prepare(model: torch.nn.Module, config: TrainConfig) -> _Parts:
    """AdamW (no weight decay on biases and norms) and the LR schedule, prepared by Accelerate."""
    _release_other_precision(config.mixed_precision)
    accelerator = Accelerator(
        mixed_precision=config.mixed_precision, gradient_accumulation_steps=config.grad_accum
    )
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.95),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config))
    return _Parts(accelerator, *accelerator.prepare(model, optimizer, scheduler))


def _optimizer_step(
    run: _Parts,
    config: TrainConfig,
    batch_fn: Callable[[int, int], Batch],
    loss_fn: Callable[[torch.nn.Module, Batch], torch.Tensor],
    step: int,
) -> tuple[float, int]:
    """One optimizer step over ``grad_accum`` micro-batches (this process's share of each):
    ``(mean loss, tokens seen by all processes)``."""
    accelerator, model = run.accelerator, run.model
    rank, world = accelerator.process_index, accelerator.num_processes
    model.train()
    step_tokens, step_loss = 0, 0.0
    for micro in range(config.grad_accum):
        batch = {k: v[rank::world].to(accelerator.device) for k, v in batch_fn(step, micro).items()}
        with accelerator.accumulate(model), accelerator.autocast():
            loss = loss_fn(model, batch)
            accelerator.backward(loss)
            if accelerator.sync_gradients and config.grad_clip > 0:
                accelerator.clip_grad_norm_(model.parameters(), config.grad_clip)
            run.optimizer.step()
            run.scheduler.step()
            run.optimizer.zero_grad(set_to_none=True)
        step_loss += loss.item() / config.grad_accum
        step_tokens += next(iter(batch.values())).numel() * world
    return step_loss, step_tokens


def _evaluate(
    run: _Parts, eval_fn: Callable[[torch.nn.Module], dict[str, float]], state: TrainState, train_loss: float
) -> None:
    """Run ``eval_fn`` on the unwrapped model; its metrics join ``state.history`` and the log."""
    run.model.eval()
    with torch.no_grad(), run.accelerator.autocast():
        metrics = eval_fn(run.accelerator.unwrap_model(run.model))
    state.history.append(
        {"step": state.step, "tokens": state.tokens_seen, "train_loss": train_loss, **metrics}
    )
    run.accelerator.print(f"step {state.step}: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
