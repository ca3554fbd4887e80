"""The relaxed rules of other serving engines, beside ours (issue 31; docs/design.md §9).

Each is an :class:`~relaxspec.core.acceptance.AcceptanceRule` with the contract of the others:
accept ``d_i`` iff ``u_i < h_i(d_i)`` (greedy: ``h ∈ {0, 1}``), cut at the first rejection, emit the
recovered token from ``norm((p − q·h)⁺)`` there (greedy: ``argmax p``) or the bonus from ``p_{K+1}``.

- :class:`TopKDelta` — TensorRT-LLM's relaxed acceptance (``relaxed_topk``, ``relaxed_delta``):
  accept outright a token among the target's top-N with ``p ≥ p_top1 − δ``.
- :class:`Threshold` — SGLang's accept thresholds: ``h = 1`` where ``p ≥ single``, else
  ``min(1, p/(acc·q))``.
- :class:`FLy` — loosely speculative decoding (Li et al. 2025, arXiv 2511.22972): a native
  rejection at a high-entropy position is kept when the next ``window`` drafts are accepted
  natively. Its window reads later positions of the same block only (no state across calls), so
  it has no element-wise ``h``: :func:`relaxspec.core.theory.fly_block_law` enumerates its law.

Shapes: ``B`` rows, ``K`` draft positions, ``V`` vocabulary.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from relaxspec.core.checks import check_unit_interval, is_real
from relaxspec.core.relaxed_sets import top_k_mask
from relaxspec.core.rules import AcceptanceRule
from relaxspec.errors import require

__all__ = ["FLY_DEFAULT_WINDOW", "FLy", "Threshold", "TopKDelta", "fly_entropy"]

# FLy's window where none is given: min(this, K − 1) (vLLM's ``fly_window_size`` default).
FLY_DEFAULT_WINDOW = 6


def _check_int(x: object, name: str, lowest: int) -> None:
    require(
        isinstance(x, numbers.Integral) and not isinstance(x, bool) and int(x) >= lowest,
        f"{name} must be an integer ≥ {lowest}, got {x!r}",
    )


def _check_greedy(greedy: object) -> None:
    require(isinstance(greedy, bool), f"greedy must be a bool, got {greedy!r}")


@dataclass(frozen=True)
class TopKDelta(AcceptanceRule):
    """TensorRT-LLM relaxed acceptance: accept outright ``x`` with ``rank_p(x) < top_n`` and
    ``p(x) ≥ max p − δ`` (and ``p(x) > 0``), else the base rule (TensorRT-LLM's ``relaxed_topk``,
    ``relaxed_delta``, used with DeepSeek-R1 MTP).

    Ties: ``rank_p(x) = #{y: p(y) > p(x)}``, so tokens tied with the N-th largest value are all
    members, and ``p ≥ max p − δ`` includes equality. ``δ = 0`` keeps the tokens tied with the mode:
    in greedy mode that is :class:`Greedy` wherever the mode is unique (a tied mode lets every tied
    draft pass, Greedy only the lowest id). ``top_n`` integer ≥ 1, ``δ ∈ [0, 1]``. The set is the
    issue's definition on probabilities; TensorRT-LLM's kernel was not read for its scale.
    """

    top_n: int
    delta: float
    greedy: bool = False

    def __post_init__(self) -> None:
        _check_int(self.top_n, "top_n", 1)
        require(
            is_real(self.delta) and 0.0 <= float(self.delta) <= 1.0,
            f"delta must be a number in [0, 1], got {self.delta!r}",
        )
        _check_greedy(self.greedy)

    def relaxed_set(self, p: Tensor) -> Tensor:
        near_top = p >= p.amax(dim=-1, keepdim=True) - float(self.delta)
        return top_k_mask(p, int(self.top_n)) & near_top


@dataclass(frozen=True)
class Threshold(AcceptanceRule):
    """SGLang accept thresholds: ``h(x) = 1`` where ``p(x) ≥ single``, else ``min(1, p/(acc·q))``
    (SGLang's ``speculative_accept_threshold_single`` / ``speculative_accept_threshold_acc``).

    ``single, acc ∈ (0, 1]``; ``single = acc = 1`` is :class:`Exact` (``p ≥ 1`` only for a one-hot
    target, where Exact accepts too). Greedy mode: accept ``argmax p`` or ``p ≥ single`` (``acc``
    has no effect), so ``single = 1`` is :class:`Greedy`. SGLang's target-only kernel compares
    its coin with the target mass alone, which is this rule with a one-hot ``q`` at the draft (what
    the vLLM plugin passes when a drafter gives no probabilities).
    """

    single: float = 1.0
    acc: float = 1.0
    greedy: bool = False

    def __post_init__(self) -> None:
        check_unit_interval(self.single, "single")
        check_unit_interval(self.acc, "acc")
        _check_greedy(self.greedy)

    def _leniency(self) -> float:
        return float(self.acc)

    def relaxed_set(self, p: Tensor) -> Tensor:
        return (p >= float(self.single)) & (p > 0)


def fly_entropy(p: Tensor, top_k: int) -> Tensor:
    """FLy's entropy gate statistic: ``−Σ_{x ∈ top-k(p)} p(x)·ln p(x)`` over the ``top_k`` largest
    processed probabilities (not renormalised; ``0·ln 0 = 0``; ``top_k`` capped at V).

    p: [..., V] -> [...].
    """
    top = p.topk(min(int(top_k), p.shape[-1]), dim=-1).values
    return torch.special.entr(top).sum(dim=-1)


@dataclass(frozen=True)
class FLy(AcceptanceRule):
    """FLy: defer a native rejection at a high-entropy position and keep the draft if the next
    ``window`` drafts are accepted natively (vLLM's ``rejection_sample_method="fly"`` with
    ``fly_window_size``, ``fly_entropy_threshold``, ``fly_entropy_top_k``).

    Native acceptance is :class:`Exact`'s (greedy: argmax match), on the same uniforms. A natively
    rejected ``d_i`` (position ``i``, 0-based) is accepted iff all of:

    - ``p_i(d_i) > 0`` — FLy never keeps a token the processed target forbids;
    - ``fly_entropy(p_i, entropy_top_k) ≥ entropy_threshold`` (``≥``: a tie opens the gate);
    - ``i + window < K`` — the whole window lies inside this draft block;
    - drafts ``i+1 .. i+window`` are all accepted natively (their own decisions, not deferred ones).

    Recovery at the first position left rejected is Exact's residual ``norm((p − q)⁺)`` (greedy:
    ``argmax p``). ``window`` integer ≥ 1 (a window ≥ K defers nothing: FLy is then Exact), or
    None for vLLM's default ``min(6, K − 1)`` with K the call's draft length; ``entropy_threshold
    ≥ 0`` (``math.inf``: never defer, i.e. Exact / Greedy); ``entropy_top_k`` integer ≥ 1. The
    window is state within one verify call (module docstring).
    """

    window: int | None = None
    entropy_threshold: float = 0.3
    entropy_top_k: int = 3
    greedy: bool = False

    def __post_init__(self) -> None:
        if self.window is not None:
            _check_int(self.window, "window", 1)
        t = self.entropy_threshold
        is_number = isinstance(t, numbers.Real) and not isinstance(t, bool) and not math.isnan(float(t))
        require(
            is_number and float(t) >= 0,
            f"entropy_threshold must be a number ≥ 0 (inf: never defer), got {t!r}",
        )
        _check_int(self.entropy_top_k, "entropy_top_k", 1)
        _check_greedy(self.greedy)

    def window_for(self, K: int) -> int:
        """The window for a block of K drafts: ``window``, or ``min(6, K − 1)`` where it is None."""
        return min(FLY_DEFAULT_WINDOW, K - 1) if self.window is None else int(self.window)

    def defer(self, native: Tensor, p_draft: Tensor, p_tok: Tensor) -> Tensor:
        """The accept mask after FLy's deferrals (see the class docstring).

        native: [B, K] bool native decisions; p_draft: [B, K, V] target laws at the drafts;
        p_tok: [B, K] = p_i(d_i). Returns [B, K] bool ⊇ native.
        """
        K = native.shape[1]
        W = self.window_for(K)
        if W < 1 or W >= K or math.isinf(float(self.entropy_threshold)):
            return native
        # ok[i] = drafts i+1..i+W all natively accepted: counts over that window from a cumsum.
        counts = native.long().cumsum(-1)
        run = torch.cat([torch.zeros_like(counts[:, :1]), counts], dim=-1)  # run[j] = Σ_{i<j} native
        ok = native.new_zeros(native.shape)
        ok[:, : K - W] = (run[:, W + 1 :] - run[:, 1 : K - W + 1]) == W
        gate = fly_entropy(p_draft, self.entropy_top_k) >= float(self.entropy_threshold)
        return native | (ok & gate & (p_tok > 0))
