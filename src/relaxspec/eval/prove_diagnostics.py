"""ProVe diagnostics (ProVe §3.1, App. C; docs/design.md §6): how good are block proposals and gates?

Pure functions on tensors, plus two offline helpers that run a reference AR model (no cache, not
timed) and :func:`analyze_cycles`, which turns the engine's :class:`~relaxspec.engine.loop.CycleRecord`
list of one generation into the paper's figures:

- **AR-matching prefix** of a proposal: how many leading draft tokens equal what greedy AR decoding
  of the reference model would produce from the same committed prefix (ProVe §3.1: 6.6 of 16 on
  GSM8K).
- **non-matching-token rate**: share of committed tokens that are not the reference model's argmax
  given the committed prefix (ProVe §4.1; exact methods: 0 up to float ties).
- **AUC** of proposer confidence ``q_i(d_i)``, verifier probability ``p_i(d_i)`` and their product
  for predicting AR-match, on the population a sequential gate sees: the positions up to and
  including the first mismatch of each block (ProVe Fig. 4 / App. C: 0.910 / 0.960 / 0.964).

Shapes: K draft positions, T tokens, N scored positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from relaxspec.engine import CycleRecord
from relaxspec.errors import RelaxSpecError


def match_flags(draft: torch.Tensor, ar_tokens: torch.Tensor) -> torch.Tensor:
    """``BoolTensor[K]``: ``draft[i] == ar_tokens[i]`` (both ``LongTensor[K]``)."""
    if draft.shape != ar_tokens.shape:
        raise RelaxSpecError(f"draft {list(draft.shape)} and AR tokens {list(ar_tokens.shape)} differ")
    return draft == ar_tokens


def ar_matching_prefix(draft: torch.Tensor, ar_tokens: torch.Tensor) -> int:
    """Number of leading positions where the draft equals the greedy AR tokens."""
    return int(match_flags(draft, ar_tokens).long().cumprod(0).sum())


def sequential_population(match: torch.Tensor) -> torch.Tensor:
    """``BoolTensor[K]``: positions a left-to-right gate sees (up to and incl. the first mismatch)."""
    before = torch.cat([torch.ones(1, dtype=torch.long), match.long().cumprod(0)[:-1]])
    return before.bool()


def non_matching_rate(tokens: torch.Tensor, ar_argmax: torch.Tensor) -> float:
    """Share of ``tokens[T]`` that differ from the reference argmax ``ar_argmax[T]`` (0 if T = 0)."""
    if tokens.shape != ar_argmax.shape:
        raise RelaxSpecError("tokens and ar_argmax must have the same shape")
    return float((tokens != ar_argmax).float().mean()) if tokens.numel() else 0.0


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores[N]`` for binary ``labels[N]`` (rank-based, ties = ½).

    Mann–Whitney: ``(Σ ranks of positives − P(P+1)/2) / (P·N)`` with average ranks for ties.
    NaN when one class is absent.
    """
    scores = scores.double().flatten()
    labels = labels.bool().flatten()
    if scores.shape != labels.shape:
        raise RelaxSpecError("scores and labels must have the same number of elements")
    n_pos = int(labels.sum())
    n_neg = labels.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = torch.unique(scores, return_inverse=True, return_counts=True)
    # average rank (1-based) of each distinct value: ranks before it + (count + 1) / 2
    first = torch.cumsum(counts, 0) - counts
    avg_rank = first.double() + (counts.double() + 1) / 2
    ranks = avg_rank[inverse]
    u = ranks[labels].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def gate_aucs(confidence: torch.Tensor, verifier_prob: torch.Tensor, match: torch.Tensor) -> dict[str, float]:
    """AUC of proposer confidence, verifier probability and their product for AR-match (all ``[N]``)."""
    return {
        "auc_confidence": auroc(confidence, match),
        "auc_verifier": auroc(verifier_prob, match),
        "auc_product": auroc(confidence * verifier_prob, match),
    }


@torch.inference_mode()
def teacher_forced_probs(model: PreTrainedModel, ids: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """Softmax laws of positions ``n .. n+K`` given ``[ids | draft]``: ``FloatTensor[K+1, V]``.

    ids ``LongTensor[1, n]``, draft ``LongTensor[1, K]``. Row i is the law of the token after
    ``ids`` and ``draft[:, :i]``; its argmax is the greedy AR token at draft position i+1.
    """
    seq = torch.cat([ids, draft], dim=1).to(model.device)
    logits = model(input_ids=seq, logits_to_keep=draft.shape[1] + 1).logits[0]
    return torch.softmax(logits.float(), dim=-1)


@torch.inference_mode()
def ar_argmax_along(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    """``LongTensor[n−1]``: the model's argmax prediction of ``ids[0, 1:]`` given each prefix."""
    return model(input_ids=ids.to(model.device)).logits[0, :-1].argmax(-1).cpu()


def _count_depths(match: torch.Tensor, hits: list[int], seen: list[int]) -> None:
    """Add one proposal's AR-match flags (``BoolTensor[K]``) to the per-depth tallies."""
    for i, hit in enumerate(match.tolist()):
        if i >= len(seen):
            seen.append(0)
            hits.append(0)
        seen[i] += 1
        hits[i] += int(hit)


def _verifier_probs(
    rec: CycleRecord, verifier_model: PreTrainedModel | None, prefix: torch.Tensor, draft: torch.Tensor
) -> torch.Tensor | None:
    """``FloatTensor[K, V]``: the verifier's distributions at the draft positions — the cycle's own
    ``target_probs``, else recomputed with ``verifier_model`` (None: neither)."""
    if rec.target_probs is not None:
        return rec.target_probs[0, :-1].cpu()
    if verifier_model is not None:
        return teacher_forced_probs(verifier_model, prefix, draft)[:-1]
    return None


def analyze_cycles(
    records: Sequence[CycleRecord],
    ids: torch.Tensor,
    n_prompt: int,
    ar_model: PreTrainedModel,
    verifier_model: PreTrainedModel | None = None,
) -> dict[str, Any]:
    """The ProVe figures of one generation, offline.

    records: the engine's ``on_cycle`` records; ids: ``LongTensor[1, T]`` prompt + generated
    tokens; n_prompt: prompt length; ar_model: the reference for AR-match (for ProVe: the
    proposer in AR mode). Verifier probabilities come from each verified cycle's
    ``target_probs``; skipped cycles (``mars``) are scored by ``verifier_model`` if given.

    Returns committed tokens per cycle, mean AR-matching prefix of the proposals, the
    non-matching-token rate of the output, per-depth AR-match rates and the three AUCs with the
    number of scored positions.
    """
    prefixes: list[int] = []
    confs, vprobs, matches = [], [], []
    depth_hits: list[int] = []
    depth_seen: list[int] = []
    proposals = 0
    for rec in records:
        if rec.proposal is None:
            continue
        n = rec.position
        if n > ids.shape[1]:
            break  # a cycle past the returned tokens (cannot happen unless ids was cut)
        draft = rec.proposal.tokens.cpu()
        ar = teacher_forced_probs(ar_model, ids[:, :n], draft)[:-1].argmax(-1)  # [K]
        match = match_flags(draft[0], ar)
        prefixes.append(ar_matching_prefix(draft[0], ar))
        proposals += 1
        _count_depths(match, depth_hits, depth_seen)
        p = _verifier_probs(rec, verifier_model, ids[:, :n], draft)
        if p is None:
            continue
        seen = sequential_population(match)
        confs.append(rec.proposal.confidence[0].cpu()[seen])
        vprobs.append(p.gather(-1, draft[0, :, None]).squeeze(-1)[seen])
        matches.append(match[seen])
    generated = ids[0, n_prompt:]
    ar_all = ar_argmax_along(ar_model, ids)[n_prompt - 1 :]
    committed = ids.shape[1] - (records[0].position if records else n_prompt)
    out: dict[str, Any] = {
        "cycles": len(records),
        "committed_per_cycle": committed / max(len(records), 1),
        "proposals": proposals,
        "mean_ar_prefix": sum(prefixes) / max(len(prefixes), 1),
        "non_matching_rate": non_matching_rate(generated, ar_all),
        "ar_match_by_depth": [h / s for h, s in zip(depth_hits, depth_seen, strict=True)],
    }
    if matches:
        out.update(gate_aucs(torch.cat(confs), torch.cat(vprobs), torch.cat(matches)))
        out["auc_positions"] = int(sum(m.numel() for m in matches))
    return out
