"""Acceptance rules and the batched verification step (docs/design.md §2), by the names the
engine, the vLLM plugin, :mod:`relaxspec.acceptance` and the tests import.

Every sampling-mode rule is an *acceptance function* ``h(x) ∈ [0, 1]``: draft token ``d_i`` is
accepted iff ``u_i < h_i(d_i)`` with ``u_i ~ U(0, 1)``; the first rejection ends the block and the
recovered token is drawn from ``norm((p_i − q_i·h_i)⁺)``; if all K drafts pass, a bonus token is
drawn from ``p_{K+1}``. Greedy-mode rules use ``h ∈ {0, 1}``; ``Gate`` (ProVe) is a deterministic
prefix gate emitting no next token.

The rooms: :mod:`~relaxspec.core.rules` (the rule classes and their ``h``),
:mod:`~relaxspec.core.verify` (:func:`verify`, :func:`verify_unchecked`, recovery and bonus),
:mod:`~relaxspec.core.relaxed_sets` (nucleus, top-k, typical and argmax masks) and
:mod:`~relaxspec.core.checks` (input validation).
"""

from __future__ import annotations

from relaxspec.core.checks import check_distribution
from relaxspec.core.relaxed_sets import argmax_mask, nucleus_mask
from relaxspec.core.rules import (
    NSD_DEFAULT_THETA,
    AcceptanceRule,
    Exact,
    Gate,
    Greedy,
    Lenience,
    Nucleus,
    Rule,
    TopK,
    Typical,
    nsd_rule,
    residual_distribution,
)
from relaxspec.core.verify import (
    NO_TOKEN,
    Verdict,
    check_verify_inputs,
    verify,
    verify_greedy,
    verify_unchecked,
)

__all__ = [
    "NO_TOKEN",
    "NSD_DEFAULT_THETA",
    "AcceptanceRule",
    "Exact",
    "Gate",
    "Greedy",
    "Lenience",
    "Nucleus",
    "Rule",
    "TopK",
    "Typical",
    "Verdict",
    "argmax_mask",
    "check_distribution",
    "check_verify_inputs",
    "nsd_rule",
    "nucleus_mask",
    "residual_distribution",
    "verify",
    "verify_greedy",
    "verify_unchecked",
]
