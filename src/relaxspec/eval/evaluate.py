"""``relaxspec eval``: a model's math exact-match accuracy (greedy) and held-out code loss."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from relaxspec import atomic
from relaxspec.core.sampling import SamplingParams
from relaxspec.data.tokens import fixed_windows, load_stream
from relaxspec.engine.kv import CachedLM
from relaxspec.engine.packed import kernels_of
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.datasets import math_examples
from relaxspec.eval.intervals import wilson
from relaxspec.methods import build_engine, load_role
from relaxspec.models import load_model


def heldout_losses(
    model: torch.nn.Module, windows: dict[str, torch.Tensor], batch_size: int = 8
) -> dict[str, float]:
    """Per-token loss of ``model`` on fixed held-out windows, one figure per source."""
    out = {}
    for name, ids in windows.items():
        total, count = 0.0, 0
        for i in range(0, len(ids), batch_size):
            chunk = ids[i : i + batch_size].to(model.device)
            loss = model(input_ids=chunk, labels=chunk).loss
            total += loss.item() * chunk.numel()
            count += chunk.numel()
        out[f"{name}_loss"] = total / max(count, 1)
    return out


def math_accuracy(
    model_dir: str | Path, limit: int, max_new_tokens: int = 160, progress: bool = True
) -> dict:
    """Greedy AR exact-match accuracy on the first ``limit`` held-out math problems, with its
    Wilson 95 % interval (``math_accuracy_ci``: [low, high])."""
    target = load_model(model_dir)
    engine = build_engine("ar", target)
    correct, tokens, started = 0, 0, time.perf_counter()
    for ex in tqdm(math_examples(limit), desc="math", disable=not progress):
        result = engine.generate(
            ex.prompt, SamplingParams(temperature=0, max_new_tokens=max_new_tokens, stop=ex.stop)
        )
        correct += int(ex.score(result.text) or 0)
        tokens += len(result.tokens)
    ci = wilson(correct, limit)
    return {
        "math_accuracy": correct / limit,
        "math_accuracy_ci": [round(ci.low, 3), round(ci.high, 3)],
        "math_problems": limit,
        "math_new_tokens": tokens,
        "math_seconds": time.perf_counter() - started,
    }


def code_loss(model_dir: str | Path, corpus_dir: str | Path, windows: int = 64, seq_len: int = 256) -> dict:
    """Per-token cross-entropy on fixed windows of the held-out stdlib modules."""
    target = load_model(model_dir)
    stream = load_stream(corpus_dir, "code_eval", target.tokenizer)
    losses = heldout_losses(target.model, {"code_eval": fixed_windows(stream, windows, seq_len)})
    return {"code_eval_loss": losses["code_eval_loss"], "code_eval_tokens": windows * seq_len}


def evaluate_model(
    model_dir: str | Path, corpus_dir: str | Path, limit: int = 500, out: str | Path | None = None
) -> dict:
    report = {"model": str(model_dir), **math_accuracy(model_dir, limit), **code_loss(model_dir, corpus_dir)}
    if out is not None:
        write_report(out, report)
    return report


def write_report(out: str | Path, report: dict) -> None:
    """Write a measurement report as JSON, creating its directory; one clear error if it cannot."""
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(out, report)
    except OSError as err:
        raise RelaxSpecError(f"cannot write {out}: {err.strerror or err}") from None


def forward_latency(
    model_dirs: dict[str, str | Path],
    context: int = 64,
    decode_steps: int = 64,
    rounds: int = 5,
    widths: tuple[int, ...] = (1,),
    kernels: str = "auto",
) -> dict[str, dict]:
    """Forward latency with a KV cache, models interleaved in the same run.

    Each round, for each model: prefill ``context`` tokens, then time ``decode_steps`` forwards of
    ``T`` new tokens for every ``T`` in ``widths`` (the cache is cropped back after each, so the
    context stays fixed). ``T = 1`` is what AR pays per output token and a drafter per drafted
    token; ``T = K + 1`` is one verification of K drafts. Rounds alternate between models so
    machine drift hits them alike; round 0 warms up and is discarded. Reported: median
    milliseconds per call for each ``T`` (``ms_per_call``), ``ms_per_token`` (``T = 1``), and the
    first model's ``T = 1`` latency divided by this model's (``ratio_to_first``).
    """
    if not model_dirs:
        raise RelaxSpecError("forward_latency needs at least one model")
    if context < 1 or decode_steps < 1 or rounds < 1 or not widths or min(widths) < 1:
        raise RelaxSpecError("context, decode_steps, rounds and every width must be >= 1")
    widths = tuple(sorted(set(widths) | {1}))
    lms = {
        name: CachedLM(load_role("target", Path(path), kernels).model, name)
        for name, path in model_dirs.items()
    }
    for name, lm in lms.items():
        if context + max(widths) > lm.context_length:
            raise RelaxSpecError(f"context + width exceeds {name}'s context window")
    generator = torch.Generator().manual_seed(0)
    times: dict[str, dict[int, list[float]]] = {name: {t: [] for t in widths} for name in lms}
    for round_ in range(rounds + 1):
        for name, lm in lms.items():
            vocab = int(lm.model.config.vocab_size)
            lm.reset()
            lm.forward(torch.randint(vocab, (1, context), generator=generator), logits_to_keep=1)
            for width in widths:
                for _ in range(decode_steps):
                    tokens = torch.randint(vocab, (1, width), generator=generator)
                    started = time.perf_counter()
                    lm.forward(tokens, logits_to_keep=width)
                    if round_ > 0:
                        times[name][width].append(time.perf_counter() - started)
                    lm.rollback(context)
    first = statistics.median(next(iter(times.values()))[1])
    return {
        name: {
            "ms_per_token": 1e3 * statistics.median(t[1]),
            "kernels": kernels_of(lms[name].model),
            "ms_per_call": {w: 1e3 * statistics.median(t[w]) for w in widths},
            "ratio_to_first": first / statistics.median(t[1]),
            "parameters": sum(p.numel() for p in lms[name].model.parameters()),
        }
        for name, t in times.items()
    }
