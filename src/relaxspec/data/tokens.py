"""Tokenised corpus streams and the deterministic batch sampler every training reuses.

Each corpus source becomes one packed ``uint16`` stream (documents joined, each starting with
``<|endoftext|>``), cached next to the corpus under ``tokens-<tokenizer hash>/``. A training step's
batch is a pure function of ``(seed, step)``: each row picks a source with the mixing weights and
a random window of that source. So a run resumed from a checkpoint sees exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from relaxspec.data.corpus import read_jsonl
from relaxspec.errors import RelaxSpecError

SOURCES = {"code": "code_train", "math": "math_train", "code_eval": "code_eval", "math_eval": "math_eval"}


def _tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    vocab = json.dumps(sorted(tokenizer.get_vocab().items())).encode()
    return hashlib.sha1(vocab).hexdigest()[:12]


def _encode_docs(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> np.ndarray:
    ids = tokenizer(texts, add_special_tokens=True)["input_ids"]  # each starts with <|endoftext|>
    return np.fromiter((t for doc in ids for t in doc), dtype=np.uint16)


def load_stream(corpus_dir: str | Path, source: str, tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """The packed token stream of one source (``code``, ``math``, ``code_eval``, ``math_eval``)."""
    if source not in SOURCES:
        raise RelaxSpecError(f"unknown corpus source {source!r}; choose from {sorted(SOURCES)}")
    if len(tokenizer) > 65_536:
        raise RelaxSpecError("token streams are uint16: the tokenizer must have at most 65536 tokens")
    corpus = Path(corpus_dir)
    cache = corpus / f"tokens-{_tokenizer_hash(tokenizer)}" / f"{source}.npy"
    if cache.is_file():
        return np.load(cache, mmap_mode="r")
    rows = read_jsonl(corpus / f"{SOURCES[source]}.jsonl")
    if source == "math_eval":
        texts = [f"{r['prompt']}\n{r['solution']}" for r in rows]
    else:
        texts = [r["text"] for r in rows]
    stream = _encode_docs(tokenizer, texts)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp.npy")
    np.save(tmp, stream)
    tmp.replace(cache)
    return stream


@dataclass
class TokenMixture:
    """Token streams with sampling weights; ``batch(seed, step, ...)`` is deterministic."""

    streams: dict[str, np.ndarray]
    weights: dict[str, float]

    def __post_init__(self) -> None:
        if set(self.weights) - set(self.streams):
            raise RelaxSpecError(
                f"mixing weights name unknown sources: {set(self.weights) - set(self.streams)}"
            )
        if any(w < 0 for w in self.weights.values()) or sum(self.weights.values()) <= 0:
            raise RelaxSpecError("mixing weights must be non-negative and not all zero")

    def batch(self, seed: int, step: int, batch_size: int, seq_len: int) -> torch.Tensor:
        """``LongTensor[batch_size, seq_len]`` of windows for training step ``step``."""
        rng = np.random.default_rng([seed, step])
        names = list(self.weights)
        probs = np.array([self.weights[n] for n in names], dtype=np.float64)
        choice = rng.choice(len(names), size=batch_size, p=probs / probs.sum())
        rows = []
        for idx in choice:
            stream = self.streams[names[idx]]
            if len(stream) <= seq_len:
                raise RelaxSpecError(f"source {names[idx]!r} has fewer than {seq_len + 1} tokens")
            start = int(rng.integers(0, len(stream) - seq_len))
            rows.append(np.asarray(stream[start : start + seq_len], dtype=np.int64))
        return torch.from_numpy(np.stack(rows))


def fixed_windows(stream: np.ndarray, n: int, seq_len: int) -> torch.Tensor:
    """``n`` evenly spaced, non-overlapping windows (for a stable evaluation loss)."""
    n = max(1, min(n, len(stream) // seq_len))
    starts = np.linspace(0, len(stream) - seq_len, n).astype(np.int64)
    return torch.from_numpy(np.stack([np.asarray(stream[s : s + seq_len], dtype=np.int64) for s in starts]))


def training_data(
    corpus_dir: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    weights: dict[str, float],
    seq_len: int,
    heldout_windows: int,
) -> tuple[TokenMixture, dict[str, torch.Tensor]]:
    """The training mixture over ``weights``' sources and fixed held-out windows (code and math)."""
    mixture = TokenMixture({name: load_stream(corpus_dir, name, tokenizer) for name in weights}, weights)
    heldout = {
        name: fixed_windows(load_stream(corpus_dir, name, tokenizer), heldout_windows, seq_len)
        for name in ("code_eval", "math_eval")
    }
    return mixture, heldout
