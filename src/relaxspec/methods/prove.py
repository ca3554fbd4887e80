"""The ProVe family (ProVe paper; docs/design.md §4): a MARS block proposer with three ways to commit
(``mars``: no verifier; ``prove``: a small verifier's gate; ``prove-lossless``: the block model
verifies itself).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from relaxspec.core.acceptance import Exact, Greedy
from relaxspec.core.named_rules import RULES
from relaxspec.engine import Engine
from relaxspec.engine.proposers.block import (
    DEFAULT_MIN_CONFIDENCE,
    BlockProposer,
    FusedBlockProposer,
    check_fused_block_size,
    check_min_confidence,
    mask_token_id_of,
    trained_block_size,
)
from relaxspec.engine.proposers.eagle import LoadedEagle
from relaxspec.engine.schedulers import ConfidenceSkip
from relaxspec.errors import RelaxSpecError
from relaxspec.methods.registry import MethodSpec, ModelSet, VllmRow, register
from relaxspec.models import LoadedModel, check_compatible, check_same_tokenizer
from relaxspec.params import (
    BLOCK_SIZE,
    DEFAULT_BLOCK_SIZE,
    TAU,
    Param,
    Params,
    declare,
)

# --- ProVe family (ProVe paper; docs/design.md §4): a MARS block proposer with three ways to commit ---------

# vLLM-only: how the block proposer reaches vLLM (.integrations.vllm.proposers): vLLM's parallel
# drafting, our proposer class with its own context cache, or inside the verifier's own forward
SEAMS = ("parallel", "own-cache", "fused")


def _seam(default: str) -> Param:
    return Param("seam", str, default, "vLLM block proposer seam", choices=SEAMS)


def block_size_of(p: Mapping[str, Any], trained: int | None = None) -> int:
    """The block size: ``block_size``, else :data:`DEFAULT_BLOCK_SIZE` (capped at ``trained``)."""
    if p["block_size"] is not None:
        return p["block_size"]
    return DEFAULT_BLOCK_SIZE if trained is None else min(DEFAULT_BLOCK_SIZE, trained)


def _block_size(models: ModelSet, method: str, p: Params) -> tuple[LoadedModel, int]:
    """The block model and the block size (:func:`block_size_of` at its trained size)."""
    block = models.require("block", method)
    return block, block_size_of(p, trained_block_size(block.model))


def _block_proposer(models: ModelSet, method: str, p: Params) -> tuple[LoadedModel, BlockProposer]:
    """The block model and its proposer (:func:`_block_size`)."""
    block, size = _block_size(models, method, p)
    return block, BlockProposer.from_pretrained(block.model, block.tokenizer, size)


def _on_the_block_model(
    block: LoadedModel, proposer: BlockProposer | FusedBlockProposer, scheduler: ConfidenceSkip | None = None
) -> Engine:
    """An engine whose verifier is the block model itself, with the exact rules (lossless)."""
    return Engine(
        block.model,
        block.tokenizer,
        proposer=proposer,
        rule=Exact(),
        greedy_rule=Greedy(),
        scheduler=scheduler,
        k=proposer.block_size,
    )


def _build_mars(models: ModelSet, p: Params) -> Engine:
    block, proposer = _block_proposer(models, "mars", p)
    # No verifier: the commit-first scheduler commits >= 1 token every cycle, so the rules are
    # never consulted (the engine only verifies the last token of a length budget).
    return _on_the_block_model(block, proposer, ConfidenceSkip(p.tau, commit_first=True))


def _validate_mars(p: Params) -> None:
    ConfidenceSkip(p.tau, commit_first=True)


def _build_prove(models: ModelSet, p: Params) -> Engine:
    verifier = models.require("draft", "prove")
    if isinstance(verifier, LoadedEagle):
        raise RelaxSpecError(
            f"prove verifies with a small causal LM (--draft), but {verifier.path} is an EAGLE head; "
            "pass a causal LM directory"
        )
    block, proposer = _block_proposer(models, "prove", p)
    check_compatible(verifier.model, block.model, "block proposer")
    check_same_tokenizer(verifier.tokenizer, block.tokenizer, "block proposer")
    gate, _ = RULES["gate"].pair(p)
    return Engine(
        verifier.model, block.tokenizer, proposer=proposer, rule=gate, greedy_rule=gate, k=proposer.block_size
    )


def _validate_prove_lossless(p: Params) -> None:
    check_min_confidence(p.min_confidence)
    if p.fused and p.block_size is not None:
        check_fused_block_size(p.block_size)


def _build_prove_lossless(models: ModelSet, p: Params) -> Engine:
    proposer: BlockProposer | FusedBlockProposer
    if p.fused:  # the block model drafts inside its own verification forward
        block, size = _block_size(models, "prove-lossless", p)
        mask_id = mask_token_id_of(block.tokenizer, "the block proposer's tokenizer")
        proposer = FusedBlockProposer(block.model, size, mask_id, p.min_confidence)
    else:
        block, proposer = _block_proposer(models, "prove-lossless", p)
    return _on_the_block_model(block, proposer)


MIN_CONFIDENCE = Param(
    "min_confidence", float, DEFAULT_MIN_CONFIDENCE, "fused block cut: a number in [0, 1)", optional=True
)
register(
    MethodSpec(
        "mars",
        "MARS: block proposer, commit the first token then left to right while confidence ≥ tau; no verifier",
        ("block",),
        declare(BLOCK_SIZE, TAU),
        _build_mars,
        _validate_mars,
    )
)
register(
    MethodSpec(
        "prove",
        "ProVe: block proposal read by a small verifier (draft); commit while conf·p_V ≥ theta",
        ("block", "draft"),
        declare(BLOCK_SIZE, *RULES["gate"].params.values()),
        _build_prove,
        rule=RULES["gate"],
        vllm=VllmRow("block", declare(_seam("parallel"))),
    )
)
register(
    MethodSpec(
        "prove-lossless",
        "ProVe-lossless: the block proposer verifies itself in AR mode (greedy = AR; sampling exact); "
        "fused: it drafts the next block inside that verification forward",
        ("block",),
        declare(
            BLOCK_SIZE, Param("fused", bool, True, "draft inside the verification forward"), MIN_CONFIDENCE
        ),
        _build_prove_lossless,
        _validate_prove_lossless,
        rule=RULES["sd"],
        # on vLLM ``fused`` is the seam; min_confidence None there: the drafter's default cut
        vllm=VllmRow(
            "block",
            declare(_seam("fused"), dataclasses.replace(MIN_CONFIDENCE, default=None)),
            ("fused", "min_confidence"),
        ),
    )
)
