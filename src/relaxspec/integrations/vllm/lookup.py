"""vLLM's model-free proposers under relaxspec's rules: ``ngram`` and ``suffix`` (docs/vllm-proposers.md).

- ``ngram`` (prompt lookup): the last ``n`` tokens of the context (``prompt_lookup_min`` ≤ n ≤
  ``prompt_lookup_max``, longest first) are looked up earlier in the same request; the ``k``
  tokens that followed the match are the drafts. No match: no drafts this step.
- ``suffix`` (suffix decoding, Arctic Inference): the drafts are the likeliest continuation of
  the context's suffix in a tree over the request's prompt and earlier responses, up to ``k``
  tokens. vLLM imports it from the ``arctic-inference`` package.

Neither drafts from a probability law: each draft is a deterministic function of the context
(and, for ``suffix``, of the responses before it), so its proposal law is the point mass at the
draft. vLLM hands the acceptance step ``draft_probs=None`` for them and the plugin verifies with
``q`` one-hot at the draft (:func:`.rejection.relaxed_rejection_sample`) — the rules themselves are
:mod:`relaxspec.core.acceptance`'s, unchanged. This module only builds and checks vLLM's
``speculative_config``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from relaxspec.errors import RelaxSpecError, check_int
from relaxspec.methods import LOOKUP_PROPOSERS, PROMPT_LOOKUP_MAX, PROMPT_LOOKUP_MIN

SUFFIX_MODULE = "arctic_inference.suffix_decoding"  # what vLLM imports for suffix decoding
SUFFIX_PIN = "arctic-inference==0.1.1"  # what vLLM 0.32's own message asks for


def check_prompt_lookup(
    proposer: str, prompt_lookup_min: int | None, prompt_lookup_max: int | None
) -> tuple[int | None, int | None]:
    """The n-gram window of the ``ngram`` proposer, checked (None: vLLM's default, 5, or the other
    bound where only one is given). Raises ``RelaxSpecError`` for a bad value, for min > max, and
    for a window given to any other proposer."""
    window = ((PROMPT_LOOKUP_MIN, prompt_lookup_min), (PROMPT_LOOKUP_MAX, prompt_lookup_max))
    given = [(param, value) for param, value in window if value is not None]
    if proposer != "ngram" and given:
        raise RelaxSpecError(f"{given[0][0].name} is an option of proposer=ngram (got proposer={proposer!r})")
    for param, value in given:
        param.check(value)
    if (
        prompt_lookup_min is not None
        and prompt_lookup_max is not None
        and prompt_lookup_min > prompt_lookup_max
    ):
        raise RelaxSpecError(
            f"prompt_lookup_min ({prompt_lookup_min}) must be at most prompt_lookup_max ({prompt_lookup_max})"
        )
    return prompt_lookup_min, prompt_lookup_max


def has_suffix_decoding() -> bool:
    """True where arctic-inference's suffix tree can be imported (its wheels before 0.1 have none)."""
    try:
        return importlib.util.find_spec(SUFFIX_MODULE) is not None
    except ImportError:  # no arctic_inference package at all
        return False


def require_suffix() -> None:
    """A clear error where vLLM's suffix decoding cannot load (vLLM's own is an ImportError deep in
    its config validation)."""
    if not has_suffix_decoding():
        raise RelaxSpecError(
            f"proposer=suffix is vLLM's suffix decoding, which needs the arctic-inference package with "
            f"its suffix tree (pip install {SUFFIX_PIN}; docs/vllm-proposers.md): not installed"
        )


def lookup_speculative_config(
    proposer: str, k: int, prompt_lookup_min: int | None = None, prompt_lookup_max: int | None = None
) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for its ``ngram`` or ``suffix`` proposer with at most ``k``
    drafts per step (checked as :func:`check_prompt_lookup`; ``suffix`` needs arctic-inference)."""
    if proposer not in LOOKUP_PROPOSERS:
        raise RelaxSpecError(
            f"no model-free vLLM proposer {proposer!r}; choose {', '.join(LOOKUP_PROPOSERS)}"
        )
    check_int("k", k, 1, what="draft length")
    lo, hi = check_prompt_lookup(proposer, prompt_lookup_min, prompt_lookup_max)
    spec: dict[str, Any] = {"method": proposer, "num_speculative_tokens": k}
    if proposer == "suffix":
        require_suffix()
        return spec
    if lo is not None:
        spec["prompt_lookup_min"] = lo
    if hi is not None:
        spec["prompt_lookup_max"] = hi
    return spec
