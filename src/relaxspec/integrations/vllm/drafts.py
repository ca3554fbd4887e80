"""vLLM's proposer for a ``--draft`` directory: ``draft_model`` for a causal LM, ``eagle`` for an
EAGLE head (docs/vllm-proposers.md, "EAGLE heads").

A relaxspec EAGLE head is stored as vLLM's EAGLE-1 checkpoint (:mod:`relaxspec.engine.proposers.eagle`:
``fc.weight`` and ``layers.0.*``, a one-layer Llama config that vLLM maps to
``EagleLlamaForCausalLM``), without the embedding and LM head, which vLLM then shares with the
target. vLLM's ``eagle`` proposer feeds it the target's last (normed) hidden states, the features
it was trained on, and drafts with ``draft_sample_method`` as the draft-model proposer does, so
every rule of the plugin verifies its drafts with their ``q``. vLLM does not know which target a
head was trained for; :func:`draft_speculative_config` checks the fingerprint the head records
against the target's stored embedding and LM head, so a head for another model is one clear
error here too, as in our engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relaxspec.engine.proposers.eagle import check_fits, is_eagle_dir, recorded_target, stored_fingerprint


def draft_speculative_config(draft: Path, target: Path, k: int, sample_method: str) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for drafting ``k`` tokens with the model at ``draft`` for the
    target at ``target``; ``sample_method``: ``greedy`` (q one-hot) or ``probabilistic``."""
    if is_eagle_dir(draft):
        check_fits(recorded_target(draft), stored_fingerprint(target), f"the EAGLE head {draft}")
        method = "eagle"
    else:
        method = "draft_model"
    return {
        "method": method,
        "model": str(draft),
        "num_speculative_tokens": k,
        "draft_sample_method": sample_method,
    }
