"""``relaxspec train block``: fine-tune a causal LM into a MARS block proposer (ProVe §2).

A block proposer is an ordinary decoder-only LM that has also learned to predict the next B tokens
in one forward over ``[last real token, B−1 placeholders]`` (docs/design.md §4/§5). Training feeds
every window ``x[0..L)`` twice, as one sequence of length 2L with duplicated position ids
``[noisy copy x̃_0..x̃_{L−1} | clean copy x_0..x_{L−1}]``: in the noisy copy each block of B keeps
its first token and masks the rest with ``<|mask|>`` (:func:`make_noisy`); clean tokens are causal,
a noisy token sees its own block up to itself and the clean tokens of earlier blocks
(:func:`block_attention_mask`). So noisy block b reproduces what the proposer sees at decoding
time after ``x[0..bB+1)``; its B outputs predict the next B tokens, the first being the ordinary AR
prediction. Loss ``CE(noisy) + CE(clean)`` (:func:`block_loss`): the clean term keeps next-token
quality; with B = 1 it is twice the causal-LM loss. The 4D additive mask goes to SDPA unchanged
with explicit ``position_ids`` (no model fork; tests/test_block.py). Models: docs/models.md.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate.utils import extract_model_from_parallel
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from relaxspec.data.tokens import training_data
from relaxspec.engine.proposers.block import BLOCK_SIZE_ATTR, MASK_ID_ATTR, mask_token_id_of
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.evaluate import heldout_losses
from relaxspec.models import load_model
from relaxspec.train.ar import MIXTURE, export_model
from relaxspec.train.cards import write_card
from relaxspec.train.loop import (
    TrainConfig,
    TrainState,
    check_seq_len,
    make_config,
    train,
    window_batches,
    write_run_record,
)

# Fine-tuning recipe (TrainConfig overrides): a lower peak LR than pretraining, short warmup.
# 800 steps x 8 windows x 256 tokens (1.6M window tokens, each fed twice) is sized for roughly
# 40-60 minutes of a 2-core CPU on the bundled ~19M target; --max-minutes caps it (resumable).
DEFAULT_RECIPE: dict[str, Any] = {
    "steps": 800,
    "batch_size": 8,
    "seq_len": 256,
    "lr": 3e-4,
    "min_lr_ratio": 0.1,
    "warmup": 40,
    "weight_decay": 0.0,
    "eval_every": 200,
    "ckpt_every": 50,
}


# ---------------------------------------------------------------------------------------------
# The objective: pure tensor functions
# ---------------------------------------------------------------------------------------------


def block_attention_mask(L: int, B: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive attention mask of one ``[noisy | clean]`` sequence: ``FloatTensor[2L, 2L]``.

    Rows are queries, columns keys; 0 = attend, −inf = masked. Indices ``0..L−1`` are the noisy
    copy, ``L..2L−1`` the clean copy; ``block(i) = i // B``.

    - clean i → clean j  iff j ≤ i
    - noisy i → noisy j  iff block(j) = block(i) and j ≤ i
    - noisy i → clean j  iff block(j) < block(i)
    - clean → noisy      never

    Every row attends at least to itself, so no softmax row is empty.
    """
    if L < 1 or B < 1:
        raise RelaxSpecError(f"block_attention_mask needs L >= 1 and B >= 1, got L={L}, B={B}")
    i = torch.arange(L)
    causal = i[None, :] <= i[:, None]  # [L, L]: key j <= query i
    block = i // B
    same_block = block[None, :] == block[:, None]
    earlier_block = block[None, :] < block[:, None]
    allowed = torch.zeros(2 * L, 2 * L, dtype=torch.bool)
    allowed[:L, :L] = causal & same_block  # noisy -> noisy
    allowed[:L, L:] = earlier_block  # noisy -> clean
    allowed[L:, L:] = causal  # clean -> clean
    mask = torch.zeros(2 * L, 2 * L, dtype=dtype)
    return mask.masked_fill(~allowed, float("-inf"))


def make_noisy(input_ids: torch.Tensor, block_size: int, mask_token_id: int) -> torch.Tensor:
    """The noisy copy: in each block of ``block_size`` positions keep the first token, mask the rest.

    input_ids: ``LongTensor[batch, L]`` → ``LongTensor[batch, L]``. With ``block_size = 1`` the
    result equals the input.
    """
    if block_size < 1:
        raise RelaxSpecError(f"block_size must be >= 1, got {block_size}")
    keep = torch.arange(input_ids.shape[-1], device=input_ids.device) % block_size == 0
    return torch.where(keep, input_ids, torch.full_like(input_ids, mask_token_id))


def block_inputs(
    input_ids: torch.Tensor, block_size: int, mask_token_id: int, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Model inputs of a batch of windows ``input_ids[batch, L]`` in the ``[noisy | clean]`` layout.

    Returns ``input_ids [batch, 2L]``, ``position_ids [batch, 2L]`` (``0..L−1`` twice) and
    ``attention_mask [batch, 1, 2L, 2L]`` (:func:`block_attention_mask`, broadcast over the batch).
    """
    batch, L = input_ids.shape
    device = input_ids.device
    noisy = make_noisy(input_ids, block_size, mask_token_id)
    positions = torch.arange(L, device=device).repeat(2)
    mask = block_attention_mask(L, block_size, dtype).to(device)
    return {
        "input_ids": torch.cat([noisy, input_ids], dim=1),
        "position_ids": positions.expand(batch, 2 * L),
        "attention_mask": mask.expand(batch, 1, 2 * L, 2 * L),
    }


def block_logits(
    model: PreTrainedModel, input_ids: torch.Tensor, block_size: int, mask_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of the ``[noisy | clean]`` layout → ``(noisy, clean)`` logits, each ``[batch, L, V]``.

    ``noisy[:, i]`` is the proposer's prediction of ``x_{i+1}`` at block depth ``i % B + 1``
    (depth 1 = the AR prediction from the kept first token); ``clean[:, i]`` the AR prediction.
    """
    L = input_ids.shape[1]
    inputs = block_inputs(input_ids, block_size, mask_token_id, dtype=model.dtype)
    logits = model(**inputs).logits
    return logits[:, :L], logits[:, L:]


def _shifted_ce(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Mean CE of ``logits[:, i]`` against ``input_ids[:, i+1]`` (the usual right shift)."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), input_ids[:, 1:].flatten())


def block_loss(
    model: PreTrainedModel, batch: dict[str, torch.Tensor], block_size: int, mask_token_id: int
) -> torch.Tensor:
    """``CE(noisy) + CE(clean)`` on a batch ``{"input_ids": LongTensor[batch, L]}`` (MARS/ProVe §2)."""
    ids = batch["input_ids"]
    noisy, clean = block_logits(model, ids, block_size, mask_token_id)
    return _shifted_ce(noisy, ids) + _shifted_ce(clean, ids)


@torch.no_grad()
def block_metrics(
    model: PreTrainedModel, windows: torch.Tensor, block_size: int, mask_token_id: int, batch_size: int = 8
) -> dict[str, float]:
    """Held-out teacher-forced metrics of the block objective on ``windows[n, L]``.

    ``block_loss`` / ``clean_loss``: mean CE of the noisy / clean copy; ``block_acc@d``: argmax
    accuracy of the noisy predictions at block depth d (1 = AR position); ``block_prefix``: mean
    number of leading depths all correct per block (a teacher-forced AR-matching prefix proxy).
    """
    noisy_ce, clean_ce, n_rows = 0.0, 0.0, 0
    correct = torch.zeros(block_size)
    counted = torch.zeros(block_size)
    prefix_sum, n_blocks = 0.0, 0
    for start in range(0, len(windows), batch_size):
        ids = windows[start : start + batch_size].to(model.device)
        noisy, clean = block_logits(model, ids, block_size, mask_token_id)
        rows = ids.shape[0]
        noisy_ce += _shifted_ce(noisy, ids).item() * rows
        clean_ce += _shifted_ce(clean, ids).item() * rows
        n_rows += rows
        hit = (noisy[:, :-1].argmax(-1) == ids[:, 1:]).float().cpu()  # [rows, L-1]
        depth = torch.arange(hit.shape[1]) % block_size
        correct.index_add_(0, depth, hit.sum(0))
        counted.index_add_(0, depth, torch.full((hit.shape[1],), float(rows)))
        whole = (hit.shape[1] // block_size) * block_size  # complete blocks only
        blocks = hit[:, :whole].reshape(rows, -1, block_size)
        prefix_sum += blocks.cumprod(-1).sum(-1).sum().item()
        n_blocks += blocks.shape[0] * blocks.shape[1]
    out = {"block_loss": noisy_ce / max(n_rows, 1), "clean_loss": clean_ce / max(n_rows, 1)}
    for d in sorted({1, 2, 4, 8, block_size}):
        if d <= block_size and counted[d - 1] > 0:
            out[f"block_acc@{d}"] = float(correct[d - 1] / counted[d - 1])
    out["block_prefix"] = prefix_sum / max(n_blocks, 1)
    return out


# ---------------------------------------------------------------------------------------------
# Preparing a base model and exporting the proposer
# ---------------------------------------------------------------------------------------------


def prepare_base_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, block_size: int) -> int:
    """Make ``model`` ready for block training in place; return the placeholder id.

    Resizes the embeddings if the tokenizer's placeholder is outside the model's vocabulary and
    records the block size and placeholder id in the config (saved with the model).
    """
    if not isinstance(block_size, int) or block_size < 1:
        raise RelaxSpecError(f"block_size must be an integer >= 1, got {block_size!r}")
    mask_id = mask_token_id_of(tokenizer)
    if mask_id >= model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    setattr(model.config, BLOCK_SIZE_ATTR, block_size)
    setattr(model.config, MASK_ID_ATTR, mask_id)
    return mask_id


BLOCK_CARD_SUMMARY = (
    "Causal LM fine-tuned to propose a block of B tokens in one forward pass over `[last token, "
    "B−1 <|mask|> placeholders]` (ProVe §2; MARS). Used by the `mars`, `prove` and `prove-lossless` "
    "methods. Config attributes: `mars_block_size` (the trained B), `mars_mask_token_id`."
)
BLOCK_CARD_OBJECTIVE = [
    "`CE(noisy) + CE(clean)` on `[noisy | clean]` copies of each window with duplicated position ids "
    "and the block attention mask: clean tokens are causal; a noisy token sees the earlier noisy tokens "
    "of its own block and the clean tokens of strictly earlier blocks; logits shifted by one. The noisy "
    "copy keeps each block's first token and replaces the other B−1 with the placeholder, so a training "
    "block looks exactly like decoding (see `relaxspec.train.block`).",
]


def write_model_card(model_dir: str | Path, metrics: dict[str, Any] | None = None) -> Path:
    """(Re)write ``README.md`` of a block proposer from its ``training.json``, merging ``metrics``."""
    model_dir = Path(model_dir)
    record_path = model_dir / "training.json"
    if not record_path.is_file():
        raise RelaxSpecError(f"{model_dir} has no training.json; is it a block proposer export?")
    record = json.loads(record_path.read_text())
    title = f"block — MARS block proposer (B = {record.get('block_size', '?')})"
    return write_card(model_dir, title, BLOCK_CARD_SUMMARY, [("Objective", BLOCK_CARD_OBJECTIVE)], metrics)


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


def train_block(
    base_dir: str | Path,
    corpus_dir: str | Path,
    run_dir: str | Path,
    export_dir: str | Path | None = None,
    block_size: int = 16,
    overrides: dict[str, Any] | None = None,
    progress: bool = True,
    command: str | None = None,
    mixture: dict[str, float] | None = None,
) -> tuple[PreTrainedModel, TrainState]:
    """Fine-tune the causal LM at ``base_dir`` into a block proposer; export when complete.

    ``mixture``: corpus source weights (default :data:`relaxspec.train.ar.MIXTURE`); a base that
    was fine-tuned on the synthetic sources should keep seeing them.

    Resumes from the newest checkpoint in ``run_dir``. ``overrides`` are :class:`TrainConfig`
    fields on top of :data:`DEFAULT_RECIPE`. The export (bf16 safetensors + tokenizer +
    ``training.json`` + ``README.md`` model card) happens only once all steps are done.
    """
    base = load_model(base_dir)
    model, tokenizer = base.model, base.tokenizer
    mask_id = prepare_base_model(model, tokenizer, block_size)
    config = make_config(run_dir, DEFAULT_RECIPE, overrides)
    _check_window(config, base.context_length, block_size)

    weights = mixture or MIXTURE
    data, heldout = training_data(corpus_dir, tokenizer, weights, config.seq_len, heldout_windows=16)
    record: dict[str, Any] = {
        "kind": "block-proposer",
        "base_model": str(base_dir),
        "block_size": block_size,
        "mask_token_id": mask_id,
        "mixture": weights,
        "command": command or shlex.join(["relaxspec", *sys.argv[1:]]),
    }
    write_run_record(run_dir, record)

    model.train()
    started = time.perf_counter()
    model, state = train(
        model,
        config,
        batch_fn=window_batches(data, config),
        loss_fn=lambda m, batch: block_loss(m, batch, block_size, mask_id),
        eval_fn=lambda m: (
            heldout_losses(m, heldout) | block_metrics(m, heldout["math_eval"], block_size, mask_id)
        ),
        progress=progress,
    )
    model = extract_model_from_parallel(model, keep_fp32_wrapper=False)  # drop the autocast wrapper
    if export_dir is not None and state.step >= config.steps:
        record.update(_finished(model, config, state, time.perf_counter() - started))
        model.eval()
        export_model(model, tokenizer, export_dir, extra=record)
        write_model_card(export_dir)
    return model, state


def _check_window(config: TrainConfig, context: int, block_size: int) -> None:
    """A training window fits the model's context and holds at least one block."""
    check_seq_len(config, context)
    if block_size > config.seq_len:
        raise RelaxSpecError(f"block_size {block_size} exceeds the training window seq_len {config.seq_len}")


def _finished(model: PreTrainedModel, config: TrainConfig, state: TrainState, session_seconds: float) -> dict:
    """What the export's ``training.json`` adds about the finished run."""
    return {
        "train_config": asdict(config),
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps_done": state.step,
        "tokens_seen": state.tokens_seen,
        "wall_seconds": state.elapsed_seconds,
        "session_seconds": session_seconds,
        "history": state.history,
    }
