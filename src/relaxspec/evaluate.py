"""``relaxspec eval``: a model's math exact-match accuracy (greedy) and held-out code loss."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from relaxspec.datasets import math_examples
from relaxspec.errors import RelaxSpecError
from relaxspec.kv import CachedLM
from relaxspec.methods import build_engine
from relaxspec.models import load_model
from relaxspec.sampling import SamplingParams
from relaxspec.train.ar import heldout_losses
from relaxspec.train.tokens import fixed_windows, load_stream


def math_accuracy(
    model_dir: str | Path, limit: int, max_new_tokens: int = 160, progress: bool = True
) -> dict:
    """Greedy AR exact-match accuracy on the first ``limit`` held-out math problems."""
    target = load_model(model_dir)
    engine = build_engine("ar", target)
    correct, tokens, started = 0, 0, time.perf_counter()
    for ex in tqdm(math_examples(limit), desc="math", disable=not progress):
        result = engine.generate(
            ex.prompt, SamplingParams(temperature=0, max_new_tokens=max_new_tokens, stop=ex.stop)
        )
        correct += int(ex.score(result.text) or 0)
        tokens += len(result.tokens)
    return {
        "math_accuracy": correct / limit,
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
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=1))
    return report


def forward_latency(
    model_dirs: dict[str, str | Path], context: int = 64, decode_steps: int = 64, rounds: int = 5
) -> dict[str, dict[str, float]]:
    """Per-token decode latency with a KV cache, models interleaved in the same run.

    Each round, for each model: prefill ``context`` tokens, then time ``decode_steps`` one-token
    forwards (the cost a drafter pays per drafted token and AR pays per output token). Rounds
    alternate between models so machine drift hits them alike; the median over all timed steps
    is reported in milliseconds, with the ratio to the first model.
    """
    if not model_dirs:
        raise RelaxSpecError("forward_latency needs at least one model")
    if context < 1 or decode_steps < 1 or rounds < 1:
        raise RelaxSpecError("context, decode_steps and rounds must all be >= 1")
    lms = {name: CachedLM(load_model(path).model, name) for name, path in model_dirs.items()}
    for name, lm in lms.items():
        if context + decode_steps > lm.context_length:
            raise RelaxSpecError(f"context + decode_steps exceeds {name}'s context window")
    generator = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {name: [] for name in lms}
    for round_ in range(rounds + 1):  # round 0 warms up and is discarded
        for name, lm in lms.items():
            vocab = int(lm.model.config.vocab_size)
            lm.reset()
            lm.forward(torch.randint(vocab, (1, context), generator=generator), logits_to_keep=1)
            for _ in range(decode_steps):
                token = torch.randint(vocab, (1, 1), generator=generator)
                started = time.perf_counter()
                lm.forward(token, logits_to_keep=1)
                if round_ > 0:
                    times[name].append(time.perf_counter() - started)
    first = statistics.median(next(iter(times.values())))
    return {
        name: {
            "ms_per_token": 1e3 * statistics.median(t),
            "ratio_to_first": first / statistics.median(t),
            "parameters": sum(p.numel() for p in lms[name].model.parameters()),
        }
        for name, t in times.items()
    }
