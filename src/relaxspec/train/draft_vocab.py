"""``relaxspec train eagle-vocab``: an EAGLE head's draft vocabulary from its training data.

EAGLE-3 §3.2 drafts over the most frequent tokens of the training data only: the LM head's rows
for the others are never read while drafting. :func:`token_ranking` ranks every token of the
target's vocabulary by its frequency in a corpus mixture (each source's share weighted as the
mixture samples it, so ranking and training see the same data); the head directory keeps the whole
ranking and a default size, and any size can be chosen at run time (``--set eagle_vocab=n``;
engine/proposers/draft_vocab.py). No model is run: the ranking costs one pass over the token
streams.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from relaxspec.data.tokens import TRAIN_SOURCES, TokenMixture, load_stream
from relaxspec.engine.proposers.draft_vocab import check_size, save_ranking
from relaxspec.engine.proposers.eagle import check_fits, recorded_target
from relaxspec.errors import RelaxSpecError
from relaxspec.models import load_model
from relaxspec.train.ar import MIXTURE


def token_ranking(data: TokenMixture, vocab_size: int, first: Sequence[int] = ()) -> torch.Tensor:
    """Every token id ``0 .. vocab_size−1`` by mixture-weighted frequency, most frequent first:
    ``int64[vocab_size]``. A source's counts are divided by its length and weighted by its mixture
    share; ``first`` (e.g. the end-of-sequence token) is ranked ahead of all; ties and unseen
    tokens keep id order."""
    total = sum(data.weights.values())
    freq = np.zeros(vocab_size, dtype=np.float64)
    for name, weight in data.weights.items():
        stream = np.asarray(data.streams[name], dtype=np.int64)
        if stream.size and int(stream.max()) >= vocab_size:
            raise RelaxSpecError(f"source {name!r} holds token ids beyond the target's {vocab_size}")
        counts = np.bincount(stream, minlength=vocab_size)
        freq += weight / total * counts / max(int(counts.sum()), 1)
    for token in first:
        freq[token] = np.inf
    return torch.from_numpy(np.argsort(-freq, kind="stable").astype(np.int64))


def eos_first(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """The tokens every draft vocabulary holds: the end-of-sequence token (a chain can end)."""
    return () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)


def write_eagle_vocab(
    head_dir: str | Path,
    target_dir: str | Path,
    corpus_dir: str | Path,
    size: int,
    mixture: dict[str, float] | None = None,
) -> dict[str, float]:
    """Rank the target's tokens over ``mixture`` (default: the one the head was trained on) and
    write the ranking with default size ``size`` into ``head_dir`` (``draft_vocab.json``).

    Returns the share of the mixture's tokens the draft vocabulary of ``size`` covers, per source.
    """
    loaded = load_model(target_dir)
    check_fits(recorded_target(head_dir), loaded.model, where=f"the EAGLE head {head_dir}")
    vocab_size = int(loaded.model.get_output_embeddings().weight.shape[0])
    check_size(size, vocab_size)
    weights = mixture or _trained_mixture(Path(head_dir))
    streams = {name: load_stream(corpus_dir, name, loaded.tokenizer) for name in weights}
    data = TokenMixture(streams, weights)
    ranking = token_ranking(data, vocab_size, first=eos_first(loaded.tokenizer))
    save_ranking(head_dir, ranking, size)
    kept = np.zeros(vocab_size, dtype=bool)
    kept[ranking[: size or vocab_size].numpy()] = True
    return {name: float(kept[np.asarray(s, dtype=np.int64)].mean()) for name, s in streams.items()}


def recorded_mixture(model_dir: str | Path) -> dict[str, float] | None:
    """The training mixture a model's or head's ``training.json`` records, if it names only
    training sources with positive weights (None otherwise)."""
    try:
        recorded = json.loads((Path(model_dir) / "training.json").read_text()).get("mixture")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(recorded, dict) or not recorded or not set(recorded) <= set(TRAIN_SOURCES):
        return None
    if not all(isinstance(w, int | float) and not isinstance(w, bool) and w > 0 for w in recorded.values()):
        return None
    return {name: float(w) for name, w in recorded.items()}


def _trained_mixture(head_dir: Path) -> dict[str, float]:
    """The mixture a head's ``training.json`` records (the default mixture if it records none)."""
    return recorded_mixture(head_dir) or dict(MIXTURE)
