"""A reduced draft vocabulary for an EAGLE head (EAGLE-3 §3.2's "draft vocabulary").

An EAGLE head drafts through the target's LM head, whose rows are the largest product of a drafted
token after the head's own layer. EAGLE-3 keeps only the most frequent tokens of the training data
as the draft's vocabulary: the head's law ``q`` is the softmax over those rows and zero on every
other token. Every rule still verifies each draft against the ``q`` it was drawn from, so exact
rules stay exact (speculative sampling is exact for any ``q``); a target token outside the draft
vocabulary can only be reached through a rejection's residual or the bonus token.

A head directory may hold :data:`VOCAB_FILE`: ``token_ids``, every target token ranked by
training-data frequency (most frequent first), and ``default_size`` (0: draft over the full
vocabulary). It is JSON, not safetensors: vLLM loads every ``*.safetensors`` file of a head
directory as the head's weights. The top ``n`` of the ranking are the draft vocabulary of size ``n``
(``--set eagle_vocab=n``). ``relaxspec train eagle-vocab`` writes it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from transformers import PreTrainedModel

from relaxspec.core.sampling import check_finite
from relaxspec.engine.packed import packed_forward, packed_linear
from relaxspec.errors import RelaxSpecError

VOCAB_FILE = "draft_vocab.json"


def save_ranking(head_dir: str | Path, ranking: torch.Tensor, default_size: int) -> Path:
    """Write ``ranking int64[V]`` (a permutation of the target's token ids, most frequent first) and
    its default size into ``head_dir``, atomically (a killed write leaves the old file or none)."""
    check_ranking(ranking, int(ranking.numel()), str(head_dir))
    check_size(default_size, int(ranking.numel()))
    path = Path(head_dir) / VOCAB_FILE
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({"default_size": default_size, "token_ids": ranking.tolist()}))
    os.replace(partial, path)
    return path


def load_ranking(head_dir: str | Path, vocab_size: int) -> tuple[torch.Tensor, int] | None:
    """``(ranking int64[V], default size)`` from ``head_dir`` (None: the head has no ranking);
    one clear error for a file that is not a ranking of this vocabulary."""
    path = Path(head_dir) / VOCAB_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        ranking, default = torch.tensor(data["token_ids"]), data["default_size"]
    except Exception as err:
        message = f"cannot read the draft vocabulary {path}: {type(err).__name__}: {err}"
        raise RelaxSpecError(message) from None
    check_ranking(ranking, vocab_size, str(path))
    check_size(default, vocab_size)
    return ranking, default


def check_ranking(ranking: torch.Tensor, vocab_size: int, where: str) -> None:
    """``ranking`` must hold each of the ``vocab_size`` token ids exactly once."""
    ok = (
        ranking.dim() == 1
        and ranking.numel() == vocab_size
        and not ranking.is_floating_point()
        and torch.equal(torch.sort(ranking.long()).values, torch.arange(vocab_size))
    )
    if not ok:
        raise RelaxSpecError(
            f"{where}: a draft vocabulary ranking must list each of the target's {vocab_size} token ids "
            f"once (got shape {tuple(ranking.shape)}); rewrite it with `relaxspec train eagle-vocab`"
        )


def check_size(size: int, vocab_size: int) -> int:
    """A draft vocabulary size: 0 (the full vocabulary) .. ``vocab_size``."""
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= vocab_size:
        raise RelaxSpecError(f"eagle_vocab must be an integer from 0 (full) to {vocab_size}, got {size!r}")
    return size


def draft_vocabulary(
    ranking: torch.Tensor | None, size: int | None, default: int, where: str
) -> torch.Tensor | None:
    """The sorted token ids ``int64[n]`` of a draft vocabulary of ``size`` (None: the head's
    ``default``), or None for the full vocabulary (size 0, or the full size)."""
    n = default if size is None else size
    if n == 0:
        return None
    if ranking is None:
        raise RelaxSpecError(
            f"eagle_vocab={n}: the EAGLE head at {where} has no draft vocabulary ranking ({VOCAB_FILE}); "
            "write one with `relaxspec train eagle-vocab --head DIR`"
        )
    check_size(n, int(ranking.numel()))
    return None if n == ranking.numel() else torch.sort(ranking[:n].long()).values


class ReducedHead:
    """The target's LM head restricted to the draft vocabulary ``ids int64[n]``:
    ``hidden[..., H]`` -> float32 logits ``[..., V]``, ``-inf`` off the vocabulary (q = 0 there).

    Runs on the target's packed weights kind where its forwards are packed (the rows copied and
    packed once), else on the LM head's own dtype."""

    def __init__(self, target: PreTrainedModel, ids: torch.Tensor) -> None:
        weight = target.get_output_embeddings().weight.detach()
        self.ids, self.vocab = ids, int(weight.shape[0])
        rows = torch.nn.Linear(weight.shape[1], len(ids), bias=False)
        rows.weight.data = weight[ids].clone()
        packed = packed_forward(target)
        self.product = rows if packed is None else packed_linear([rows], packed.weights)
        self.dtype = weight.dtype if packed is None else None  # a packed product casts its input

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden if self.dtype is None else hidden.to(self.dtype)
        small = self.product(x).float()  # [..., n]
        check_finite(small, "the EAGLE head")
        full = small.new_full((*small.shape[:-1], self.vocab), -math.inf)
        return full.index_copy_(-1, self.ids, small)
