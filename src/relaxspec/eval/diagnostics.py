"""Diagnostics from the papers, computed from the engine's per-cycle records (docs/design.md §6).

A :class:`Diagnostic` turns the :class:`~relaxspec.engine.loop.CycleRecord` list of one generation
into *counters* (a JSON-able dict whose numbers add and whose lists concatenate), so counters of
many generations and resumed sessions merge with :func:`merge_counters`; its ``finalize`` turns
merged counters into the reported summary. All pure functions; the analysis runs outside timing.

Built in (registered at the end of this module, each documented at its ``*_counters`` function):
``rejections`` (NSD §1, §4.4: where strict rejections and extra acceptances lie in ``p``),
``gate_auc`` (ProVe §3.1 Fig. 4, VS App. A.2: AUC of proposer confidence, verifier probability and
their product), ``prove`` (ProVe §3.1, §4.1, App. D; :mod:`relaxspec.eval.prove_diagnostics`) and
``vs_permutation`` (VS §5; :mod:`relaxspec.engine.survival`). Others register with
:func:`register_diagnostic`; the benchmark runs every diagnostic that ``applies`` to a method.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from relaxspec.core.acceptance import nsd_rule, nucleus_mask
from relaxspec.engine import CycleRecord
from relaxspec.errors import RelaxSpecError
from relaxspec.eval import intervals
from relaxspec.eval.prove_diagnostics import (
    ar_argmax_along,
    ar_matching_prefix,
    gate_aucs,
    match_flags,
    sequential_population,
    teacher_forced_probs,
)

Counters = dict[str, Any]
TOP_RANKS = 10  # rank histogram: 0..9 and "10+"
# Target entropy histogram (nats): lower edges of the bins, each bin up to the next edge.
ENTROPY_EDGES = (0.0, 0.1, 0.5, 1.0, 2.0)
UNCERTAIN_NATS = 0.5  # a position whose target entropy is at least this counts as uncertain


@dataclass
class Generation:
    """What a diagnostic sees of one generation: the cycle records and their context.

    ``prompt_ids``: ``LongTensor[1, n]`` as the engine encoded the prompt; ``tokens``: the
    generated ids; ``models``: the run's :class:`~relaxspec.methods.ModelSet` (for diagnostics that
    need a reference model, e.g. ProVe's AR-match against the proposer in AR mode).
    """

    method: str
    params: dict[str, Any]
    records: Sequence[CycleRecord]
    prompt_ids: torch.Tensor | None = None
    tokens: Sequence[int] = ()
    models: Any = None
    greedy: bool = True  # the decoding regime (temperature 0)


@dataclass(frozen=True)
class Diagnostic:
    """``collect(generation) -> counters`` per generation; ``finalize(counters) -> summary``.

    ``applies(method)`` says whether the diagnostic is meaningful for a method preset.
    """

    name: str
    collect: Callable[[Generation], Counters]
    finalize: Callable[[Counters], dict[str, Any]]
    applies: Callable[[str], bool] = lambda method: method != "ar"


DIAGNOSTICS: dict[str, Diagnostic] = {}


def register_diagnostic(diagnostic: Diagnostic) -> Diagnostic:
    DIAGNOSTICS[diagnostic.name] = diagnostic
    return diagnostic


def diagnostics_for(method: str) -> list[Diagnostic]:
    return [d for d in DIAGNOSTICS.values() if d.applies(method)]


def merge_counters(a: Counters, b: Counters) -> Counters:
    """Numbers add, lists concatenate, dicts merge recursively (keys of either side kept)."""
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict):
            out[key] = merge_counters(out[key], value)
        else:
            out[key] = out[key] + value
    return out


# ---------------------------------------------------------------------------------------------
# Pure helpers


def rank_of(p: torch.Tensor, token: int) -> int:
    """``rank_p(x) = #{y : p(y) > p(x)}`` (ties share a rank; the top token has rank 0)."""
    return int((p > p[token]).sum())


def entropy(p: torch.Tensor) -> float:
    """Shannon entropy in nats of a distribution ``p[V]``."""
    p = p.double()
    nz = p[p > 0]
    return float(-(nz * nz.log()).sum())


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _bin(rank: int) -> str:
    return str(rank) if rank < TOP_RANKS else f"{TOP_RANKS}+"


def _entropy_bin(h: float) -> str:
    """The :data:`ENTROPY_EDGES` bin of an entropy in nats: ``"0-0.1"`` … ``"2+"``."""
    i = max(j for j, edge in enumerate(ENTROPY_EDGES) if h >= edge)
    upper = ENTROPY_EDGES[i + 1] if i + 1 < len(ENTROPY_EDGES) else None
    return f"{ENTROPY_EDGES[i]:g}-{upper:g}" if upper is not None else f"{ENTROPY_EDGES[i]:g}+"


def _entropy_histogram() -> dict[str, int]:
    return {_entropy_bin(edge): 0 for edge in ENTROPY_EDGES}


def _histogram() -> dict[str, int]:
    """Counts by rank: ``"0"`` … ``"9"`` and ``"10+"`` (a dict, so merging adds element-wise)."""
    return {_bin(r): 0 for r in range(TOP_RANKS + 1)}


def _verified(records: Sequence[CycleRecord]):
    """(record, proposal tokens list, strict prefix, accepted prefix) of verified draft cycles."""
    for r in records:
        if r.proposal is None or r.verdict is None or r.target_probs is None:
            continue
        accepted = int(r.verdict.accepted[0])
        strict = r.verdict.exact_accepted
        strict = accepted if strict is None else int(strict[0])
        yield r, r.proposal.tokens[0].tolist(), strict, accepted


# ---------------------------------------------------------------------------------------------
# NSD: rejected-token analysis and extra acceptances


def rejection_counters(
    records: Sequence[CycleRecord], theta: float = 0.95, core_theta: float = 0.5
) -> Counters:
    """Counters of the NSD rejected-token analysis for one generation (NSD §1, §4.4).

    Where the tokens the strict rule rejects lie in the target distribution: share inside the
    target nucleus ``N_θ(p)`` and in its top 10; and the tokens a relaxed rule accepted beyond the
    strict prefix ("extra acceptances"): their rank under ``p``, the share in the nucleus *core*
    ``N_{core_theta}(p)`` (our reading of the paper's term: the tokens covering the first half of
    the target's mass), and draft vs target entropy. ``theta`` is the nucleus the rejected tokens
    are tested against (the method's own θ where it has one, else the paper's 0.95). The target's
    entropy ``H(p)`` is binned (:data:`ENTROPY_EDGES`) at every position the cycle emitted a token
    at and at each strict rejection: where the target hesitates, and whether rejections sit there.
    """
    c: Counters = {
        "strict_rejected": 0,
        "rejected_in_nucleus": 0,
        "rejected_in_top10": 0,
        "rejected_rank": _histogram(),
        "extra_accepted": 0,
        "extra_in_nucleus_core": 0,
        "extra_rank": _histogram(),
        "extra_with_q": 0,
        "extra_entropy_draft": 0.0,
        "extra_entropy_target": 0.0,
        "extra_target_entropy_higher": 0,
        "entropy_emitted": _entropy_histogram(),
        "entropy_rejected": _entropy_histogram(),
    }
    for r, tokens, strict, accepted in _verified(records):
        p = r.target_probs[0]
        q = r.proposal.probs[0] if r.proposal.probs is not None else None
        h_p = [entropy(p[j]) for j in range(min(accepted + 1, p.shape[0]))]  # at every emitted position
        for h in h_p:
            c["entropy_emitted"][_entropy_bin(h)] += 1
        if strict < len(tokens):
            # the token the strict rule rejects (a relaxed rule may still have accepted it)
            x = tokens[strict]
            rank = rank_of(p[strict], x)
            c["strict_rejected"] += 1
            c["entropy_rejected"][_entropy_bin(h_p[strict])] += 1
            c["rejected_in_nucleus"] += int(nucleus_mask(p[strict], theta)[x])
            c["rejected_in_top10"] += int(rank < 10)
            c["rejected_rank"][_bin(rank)] += 1
        for j in range(strict, accepted):
            x = tokens[j]
            c["extra_accepted"] += 1
            c["extra_in_nucleus_core"] += int(nucleus_mask(p[j], core_theta)[x])
            c["extra_rank"][_bin(rank_of(p[j], x))] += 1
            if q is not None:
                h_q = entropy(q[j])
                c["extra_with_q"] += 1
                c["extra_entropy_draft"] += h_q
                c["extra_entropy_target"] += h_p[j]
                c["extra_target_entropy_higher"] += int(h_p[j] > h_q)
    return c


def nucleus_theta(method: str, params: dict[str, Any], greedy: bool, default: float = 0.95) -> float:
    """θ of the nucleus the analysis tests against: the method's own where its rule is the
    nucleus (``nsd`` — its regime's default θ where none was given —, ``accept=nucleus``), else
    the paper's 0.95."""
    if method == "nsd" or params.get("accept") == "nucleus":
        return nsd_rule(params.get("theta"), greedy).theta
    return default


def rejection_summary(c: Counters) -> dict[str, Any]:
    """Shares from merged :func:`rejection_counters` (None where there is nothing to count)."""
    n_rej, n_extra, n_q = c["strict_rejected"], c["extra_accepted"], c["extra_with_q"]
    return {
        "strict_rejected": n_rej,
        "rejected_in_nucleus": _ratio(c["rejected_in_nucleus"], n_rej),
        "rejected_in_top10": _ratio(c["rejected_in_top10"], n_rej),
        "extra_accepted": n_extra,
        "extra_in_nucleus_core": _ratio(c["extra_in_nucleus_core"], n_extra),
        "extra_in_top5": _ratio(sum(c["extra_rank"].get(_bin(r), 0) for r in range(5)), n_extra),
        "extra_by_rank": {b: _ratio(n, n_extra) for b, n in c["extra_rank"].items()} if n_extra else {},
        "rejected_by_rank": {b: _ratio(n, n_rej) for b, n in c["rejected_rank"].items()} if n_rej else {},
        "extra_entropy_draft": _ratio(c["extra_entropy_draft"], n_q),
        "extra_entropy_target": _ratio(c["extra_entropy_target"], n_q),
        "extra_target_entropy_higher": _ratio(c["extra_target_entropy_higher"], n_q),
        **_entropy_shares(c),
    }


def _entropy_shares(c: Counters) -> dict[str, Any]:
    """Shares of the target-entropy histograms, and the share of each at an uncertain position
    (``H(p) ≥`` :data:`UNCERTAIN_NATS`); counters of runs before the histograms existed: none."""
    uncertain = [_entropy_bin(e) for e in ENTROPY_EDGES if e >= UNCERTAIN_NATS]
    out: dict[str, Any] = {}
    for key in ("entropy_emitted", "entropy_rejected"):
        bins = c.get(key) or {}
        total = sum(bins.values())
        out[f"{key}_by_bin"] = {b: n / total for b, n in bins.items()} if total else {}
        out[f"{key}_uncertain"] = sum(bins[b] for b in uncertain) / total if total else None
    return out


def nucleus_share_interval(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """95 % interval of the share of strictly rejected drafts inside the target's nucleus over a
    row's bench records (each with its generation's ``rejections`` counters): every rejection is
    a 0/1 outcome and the rejections of one prompt a cluster (they share a context, so they are
    correlated), :func:`intervals.wilson_clustered`. None where nothing was rejected."""
    values: list[float] = []
    clusters: list[str] = []
    for r in records:
        rej = (r.get("diagnostics") or {}).get("rejections") or {}
        n, k = int(rej.get("strict_rejected", 0)), int(rej.get("rejected_in_nucleus", 0))
        values += [1.0] * k + [0.0] * (n - k)
        clusters += [str(r["example"])] * n
    return intervals.wilson_clustered(values, clusters).to_dict() if values else None


# ---------------------------------------------------------------------------------------------
# ProVe / VS: AUC of gate scores


def gate_counters(records: Sequence[CycleRecord]) -> Counters:
    """Per-position (confidence, verifier probability, matches verifier argmax) of one generation.

    For the AUC of proposer confidence, verifier probability and their product at telling a draft
    token that matches the verifier's argmax from one that does not (ProVe §3.1, Fig. 4; VS App.
    A.2), for draft-model and diffusion methods. Only positions up to and including the first
    mismatch of each block: those a sequential gate decides on. Scores are rounded to 5 decimals
    to keep stored records small.
    """
    conf: list[float] = []
    prob: list[float] = []
    match: list[int] = []
    for r, tokens, _strict, _accepted in _verified(records):
        p = r.target_probs[0]
        confidence = r.proposal.confidence[0].tolist()
        for j, x in enumerate(tokens):
            hit = int(int(p[j].argmax()) == x)
            conf.append(round(float(confidence[j]), 5))
            prob.append(round(float(p[j, x]), 5))
            match.append(hit)
            if not hit:
                break
    return {"confidence": conf, "verifier_prob": prob, "match": match}


def gate_summary(c: Counters) -> dict[str, Any]:
    """Match rate and the three AUCs (ProVe Fig. 4) of merged :func:`gate_counters`."""
    conf, prob, match = (
        torch.tensor(c[k], dtype=torch.float64) for k in ("confidence", "verifier_prob", "match")
    )
    aucs = gate_aucs(conf, prob, match.bool())
    return {
        "positions": len(c["match"]),
        "match_rate": _ratio(sum(c["match"]), len(c["match"])),
        **{k: None if math.isnan(v) else v for k, v in aucs.items()},
    }


def prove_counters(g: Generation) -> Counters:
    """ProVe §3.1 / §4.1 / App. D counters of one generation of a block-proposer method.

    Mean AR-matching prefix of the proposals, AR-match rate by depth, non-matching-token rate of
    the output and the same three AUCs as ``gate_auc`` with AR-match as the label (pure functions
    of :mod:`relaxspec.eval.prove_diagnostics`).

    AR-match is judged against the block model in plain AR mode (the proposer's own greedy
    decoding, ProVe's reference); verifier probabilities come from the verified cycles (for
    ``mars``, which verifies nothing, from the draft model as ProVe's small verifier, if loaded).
    Runs the reference model teacher-forced, outside the timed loop.
    """
    ar_model = g.models.block.model
    small = g.models.draft.model if g.models.draft is not None else None
    ids = torch.cat([g.prompt_ids, torch.tensor([list(g.tokens)], dtype=torch.long)], dim=1)
    n_prompt = g.prompt_ids.shape[1]
    c: Counters = {
        "proposals": 0,
        "ar_prefix": 0,
        "depth_seen": {},
        "depth_match": {},
        "confidence": [],
        "verifier_prob": [],
        "match": [],
    }
    for rec in g.records:
        if rec.proposal is None:
            continue
        if rec.position > ids.shape[1]:
            break
        prefix, draft = ids[:, : rec.position], rec.proposal.tokens.cpu()
        ar = teacher_forced_probs(ar_model, prefix, draft)[:-1].argmax(-1)
        match = match_flags(draft[0], ar)
        c["proposals"] += 1
        c["ar_prefix"] += ar_matching_prefix(draft[0], ar)
        for i, hit in enumerate(match.tolist()):
            c["depth_seen"][str(i)] = c["depth_seen"].get(str(i), 0) + 1
            c["depth_match"][str(i)] = c["depth_match"].get(str(i), 0) + int(hit)
        if rec.target_probs is not None:
            p = rec.target_probs[0, :-1].cpu()
        elif small is not None:
            p = teacher_forced_probs(small, prefix, draft)[:-1]
        else:
            continue
        seen = sequential_population(match)
        c["confidence"] += [round(float(x), 5) for x in rec.proposal.confidence[0].cpu()[seen]]
        c["verifier_prob"] += [round(float(x), 5) for x in p.gather(-1, draft[0, :, None]).squeeze(-1)[seen]]
        c["match"] += [int(x) for x in match[seen]]
    generated = ids[0, n_prompt:]
    ar_all = ar_argmax_along(ar_model, ids)[n_prompt - 1 :]
    c["tokens"] = int(generated.numel())
    c["non_matching"] = int((generated != ar_all).sum())
    return c


def prove_summary(c: Counters) -> dict[str, Any]:
    depths = sorted(c["depth_seen"], key=int)
    return {
        "proposals": c["proposals"],
        "mean_ar_prefix": _ratio(c["ar_prefix"], c["proposals"]),
        "non_matching_rate": _ratio(c["non_matching"], c["tokens"]),
        "ar_match_by_depth": [c["depth_match"][d] / c["depth_seen"][d] for d in depths],
        **gate_summary(c),
    }


# ---------------------------------------------------------------------------------------------
# VS: permutation diagnostic (prefix structure of raw confidence)


def block_counters(records: Sequence[CycleRecord]) -> Counters:
    """Raw confidences and strict accepted lengths L of the verified draft blocks of a generation."""
    scores: list[list[float]] = []
    lengths: list[int] = []
    for r, _tokens, strict, _accepted in _verified(records):
        scores.append([round(float(x), 5) for x in r.proposal.confidence[0]])
        lengths.append(strict)
    return {"scores": scores, "lengths": lengths}


def permutation_summary(c: Counters, tau: float = 0.9) -> dict[str, Any]:
    """VS §5: feasible prefix length of raw confidence before and after the per-column shuffle.

    Mean feasible prefix length of raw confidence under ``tau`` on the verified blocks, before and
    after shuffling each position's (score, label) pairs across blocks, and per-position AUROC
    (pure functions of :mod:`relaxspec.engine.survival`).
    Uses the blocks of the most common length (full blocks; budget-cut ones are shorter).
    """
    from relaxspec.engine.survival import permutation_test, survival_labels

    if not c["scores"]:
        return {"blocks": 0}
    k = max(set(map(len, c["scores"])), key=[len(x) for x in c["scores"]].count)
    rows = [(sc, n) for sc, n in zip(c["scores"], c["lengths"], strict=True) if len(sc) == k]
    scores = torch.tensor([sc for sc, _ in rows], dtype=torch.float64)
    n = torch.tensor([n for _, n in rows])
    labels = survival_labels(n, torch.full_like(n, k), k)["label"]
    out = permutation_test(scores, labels, tau, generator=torch.Generator().manual_seed(0))
    return {key: _finite(v) for key, v in out.items()}


def _finite(v: Any) -> Any:
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return None if isinstance(v, float) and math.isnan(v) else v


def _needs(method: str) -> tuple[str, ...]:
    from relaxspec.methods import get_method

    try:
        return get_method(method).needs
    except RelaxSpecError:
        return ()


register_diagnostic(
    Diagnostic(
        "rejections",
        lambda g: rejection_counters(g.records, nucleus_theta(g.method, g.params, g.greedy)),
        rejection_summary,
    )
)
register_diagnostic(
    Diagnostic(
        "gate_auc",
        lambda g: gate_counters(g.records),
        gate_summary,
        applies=lambda method: method != "ar" and "block" not in _needs(method),
    )
)
register_diagnostic(
    Diagnostic("prove", prove_counters, prove_summary, applies=lambda method: "block" in _needs(method))
)
register_diagnostic(
    Diagnostic(
        "vs_permutation",
        lambda g: block_counters(g.records),
        permutation_summary,
        applies=lambda method: "diffusion" in _needs(method),
    )
)


def collect(generation: Generation) -> dict[str, Counters]:
    """Counters of every diagnostic that applies to the generation's method.

    A diagnostic that fails is left out of this generation (with a warning) so that the
    generation's timing record is never lost to an analysis bug.
    """
    out = {}
    for d in diagnostics_for(generation.method):
        try:
            out[d.name] = d.collect(generation)
        except Exception as err:  # an analysis bug must not lose the measurement
            warnings.warn(f"diagnostic {d.name!r} failed on {generation.method}: {err}", stacklevel=2)
    return out


def summarize(counters: dict[str, Counters]) -> dict[str, dict[str, Any]]:
    """Summaries of merged counters; a diagnostic that fails reports its error instead.

    Diagnostics no longer registered are skipped.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, c in counters.items():
        if name in DIAGNOSTICS:
            try:
                out[name] = DIAGNOSTICS[name].finalize(c)
            except Exception as err:  # a broken diagnostic must not lose the benchmark's rows
                out[name] = {"error": f"{type(err).__name__}: {err}"}
    return out
