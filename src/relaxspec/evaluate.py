"""``relaxspec eval``: a model's math exact-match accuracy (greedy) and held-out code loss."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tqdm.auto import tqdm

from relaxspec.datasets import math_examples
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
