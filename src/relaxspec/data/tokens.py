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

SOURCES = {
    "code": "code_train",
    "math": "math_train",
    "code_eval": "code_eval",
    "math_eval": "math_eval",
    # synthetic code tasks and the broadened math generator (issue 15)
    "synthcode": "synthcode_train",
    "math_broad": "math_broad_train",
    "synthcode_eval": "synthcode_eval",
    "synthcode_families_eval": "synthcode_families_eval",
    "math_families_eval": "math_families_eval",
    # compositional code pipelines and math phrasing styles (held-out combinations / phrasings)
    "synthpipes": "synthpipes_train",
    "math_styles": "math_styles_train",
    "synthpipes_eval": "synthpipes_eval",
    "math_phrasing_eval": "math_phrasing_eval",
    # equivalent solution variants (issue 29): training and held-out by seed / combination or
    # scenario family / phrasing family
    "codevar": "codevar_train",
    "mathvar": "mathvar_train",
    "mathquote": "mathquote_train",  # mathvar rows whose steps quote their facts (data/mathquotes.py)
    "mathorder": "mathorder_train",  # the same walk through the facts without the quotes
    "codevar_eval": "codevar_eval",
    "codevar_combos_eval": "codevar_combos_eval",
    "codevar_phrasing_eval": "codevar_phrasing_eval",
    "mathvar_eval": "mathvar_eval",
    "mathvar_families_eval": "mathvar_families_eval",
    "mathvar_phrasing_eval": "mathvar_phrasing_eval",
}
# The sources a training mixture may draw from (``--mixture math=0.4,synthcode=0.3,...``); the
# others are held out.
TRAIN_SOURCES = (
    "math",
    "code",
    "synthcode",
    "math_broad",
    "synthpipes",
    "math_styles",
    "codevar",
    "mathvar",
    "mathquote",
    "mathorder",
)


def _tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    vocab = json.dumps(sorted(tokenizer.get_vocab().items())).encode()
    return hashlib.sha1(vocab).hexdigest()[:12]


def _encode_docs(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> np.ndarray:
    ids = tokenizer(texts, add_special_tokens=True)["input_ids"]  # each starts with <|endoftext|>
    return np.fromiter((t for doc in ids for t in doc), dtype=np.uint16)


def load_stream(corpus_dir: str | Path, source: str, tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """The packed token stream of one source of :data:`SOURCES` (``code``, ``math``, ``synthcode``, ...)."""
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
    """The training mixture over ``weights``' sources and fixed held-out windows (code and math,
    plus the synthetic held-out sets when their training sources are mixed in).

    Only :data:`TRAIN_SOURCES` may be mixed in: a held-out source is never trained on.
    """
    held_out = set(weights) - set(TRAIN_SOURCES)
    if held_out:
        raise RelaxSpecError(
            f"cannot train on {sorted(held_out)}: a mixture draws only from {', '.join(TRAIN_SOURCES)}"
        )
    mixture = TokenMixture({name: load_stream(corpus_dir, name, tokenizer) for name in weights}, weights)
    # a mixture with the synthetic sources also tracks their held-out seeds and families
    names = ["code_eval", "math_eval"]
    if "synthcode" in weights:
        names += ["synthcode_eval", "synthcode_families_eval"]
    if "math_broad" in weights:
        names += ["math_families_eval"]
    if "synthpipes" in weights:
        names += ["synthpipes_eval"]
    if "math_styles" in weights:
        names += ["math_phrasing_eval"]
    if "codevar" in weights:
        names += ["codevar_eval", "codevar_combos_eval", "codevar_phrasing_eval"]
    if "mathvar" in weights:
        names += ["mathvar_eval", "mathvar_families_eval", "mathvar_phrasing_eval"]
    heldout = {
        name: fixed_windows(load_stream(corpus_dir, name, tokenizer), heldout_windows, seq_len)
        for name in names
    }
    return mixture, heldout
