"""Speculative diffusion decoding (VS paper; docs/design.md §4): ``sdd``, ``sdd-skip``, ``sdd-periodic``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relaxspec.core.acceptance import Rule
from relaxspec.core.named_rules import RULES, theta_with_default
from relaxspec.engine import Engine
from relaxspec.engine.proposers.diffusion import REVEAL_ORDERS, DiffusionProposer
from relaxspec.engine.schedulers import ConfidenceSkip, Periodic, RawConfidence, Scheduler, Signal, Strict
from relaxspec.engine.survival import ConditionalSurvival, MarginalSurvival, SurvivalPredictor
from relaxspec.errors import RelaxSpecError, check_choice, check_int
from relaxspec.methods.registry import MethodSpec, ModelSet, VllmRow, register
from relaxspec.models import check_compatible, check_same_tokenizer
from relaxspec.params import (
    ACCEPT_K,
    MAX_COUNT,
    MAX_DRAFT_TOKENS,
    MAX_DRAFT_WORK,
    TAU,
    Param,
    Params,
    declare,
)

# --- Speculative diffusion decoding (VS paper; docs/design.md §4): sdd, sdd-skip, sdd-periodic -------------
#
# All three draft with a DiffusionProposer (γ-token blocks in S denoising steps) and verify with
# the target. ``accept`` picks the rule of ``sdd``: exact (lossless; greedy = argmax match),
# lenience (ℓ), topk (accept_k) or nucleus (θ) — the VS paper's lenience and top-k baselines.
# ``sdd-skip`` adds ConfidenceSkip: commit the longest prefix passing the local gate
# min_{j≤k} conf_j ≥ τ and the signal's prefix gate (raw, marginal or conditional survival), only
# with ≥ k_min tokens and an unverified run < s_max (paper defaults γ = 32, k_min = 6, s_max = 64).
# ``sdd-periodic`` attempts a skip_k-token skip every period rounds (baseline). ``shadow=True``
# audits skipped rounds with the target (excluded from timing and call counts). γ and S default
# to the drafter's bundled operating point (``relaxspec train diffusion-sweep``).

# sdd's ``accept`` -> the rule it names (one table, for our engine and vLLM)
SDD_ACCEPT = {"exact": "sd", "lenience": "lenience", "topk": "topk", "nucleus": "nsd"}
ACCEPT_RULES = tuple(SDD_ACCEPT)
SIGNALS = ("raw", "marginal", "conditional")

BASE_PARAMS = declare(
    Param(
        "gamma",
        int,
        None,
        "diffusion block length γ (None: the drafter's)",
        lo=1,
        hi=MAX_DRAFT_TOKENS,
        optional=True,
    ),
    Param(
        "steps",
        int,
        None,
        "denoising steps S, at most gamma (None: the drafter's)",
        lo=1,
        hi=MAX_DRAFT_TOKENS,
        optional=True,
    ),
    Param("reveal", str, "auto", "reveal order of the denoising steps", choices=REVEAL_ORDERS),
    Param("accept", str, "exact", "sdd's acceptance rule", choices=ACCEPT_RULES),
    *RULES["lenience"].params.values(),
    ACCEPT_K,
    theta_with_default(0.95),
    Param("shadow", bool, False, "audit skipped rounds with the target (untimed)"),
)
SKIP_PARAMS = declare(
    Param("signal", str, "raw", "prefix-gate signal", choices=SIGNALS),
    TAU,
    Param("signal_tau", float, None, "the signal's threshold (None: tau)", lo=0, hi=1, optional=True),
    Param("k_min", int, 6, "fewest tokens a skip commits", lo=0, hi=MAX_DRAFT_TOKENS),
    Param("s_max", int, 64, "longest unverified run", lo=0, hi=MAX_COUNT),
)
PERIODIC_PARAMS = declare(
    Param("period", int, 4, "rounds between skips", lo=1, hi=MAX_COUNT),
    Param("skip_k", int, 6, "tokens a periodic skip commits", lo=1, hi=MAX_DRAFT_TOKENS),
)


def sdd_rules(p: Mapping[str, Any]) -> tuple[Rule, Rule]:
    """(sampling rule, greedy rule) for ``accept``; constructing them validates ℓ, k, θ."""
    accept = check_choice("accept", p["accept"], ACCEPT_RULES)
    return RULES[SDD_ACCEPT[accept]].pair(p)


def _validate_base(p: Params) -> None:
    if p.steps is not None:
        check_int("steps", p.steps, 1, p.gamma or MAX_DRAFT_TOKENS, "denoising steps, at most gamma")
    if p.gamma is not None and p.steps is not None:
        check_draft_work(p.gamma, p.steps)
    sdd_rules(p)


def check_draft_work(gamma: int, steps: int) -> None:
    """A diffusion draft computes gamma positions at each of its steps; bound the product."""
    if gamma * steps > MAX_DRAFT_WORK:
        raise RelaxSpecError(
            f"gamma x steps = {gamma} x {steps} = {gamma * steps} drafter positions per cycle exceeds "
            f"the limit of {MAX_DRAFT_WORK}; use fewer denoising steps or a shorter block"
        )


def _check_k_min(k_min: int, gamma: int | None) -> None:
    if gamma is not None and k_min > gamma:
        raise RelaxSpecError(f"k_min ({k_min}) cannot exceed gamma ({gamma}): no skip could ever qualify")


def _validate_skip(p: Params) -> None:
    _validate_base(p)
    _check_k_min(p.k_min, p.gamma)
    ConfidenceSkip(p.tau, k_min=p.k_min, s_max=p.s_max, signal_tau=p.signal_tau)


def _validate_periodic(p: Params) -> None:
    _validate_base(p)
    if p.gamma is not None and p.skip_k > p.gamma:
        raise RelaxSpecError(f"skip_k ({p.skip_k}) cannot exceed gamma ({p.gamma})")
    Periodic(p.period, p.skip_k)


def make_signal(name: str, survival: SurvivalPredictor | None, method: str = "sdd-skip") -> Signal:
    """The prefix-gate signal ``name``; learned signals need a trained survival predictor."""
    if name == "raw":
        return RawConfidence()
    if survival is None:
        raise RelaxSpecError(
            f"signal {name!r} of method {method!r} needs a trained survival predictor: run "
            "`relaxspec train survival` or pass --survival DIR"
        )
    return MarginalSurvival(survival) if name == "marginal" else ConditionalSurvival(survival)


def build_sdd(models: ModelSet, p: Params, scheduler: Scheduler, method: str = "sdd") -> Engine:
    """An SDD engine: diffusion proposer, target verifier, ``accept`` rules, ``scheduler``."""
    target, diffusion = models.require("target", method), models.require("diffusion", method)
    check_compatible(target.model, diffusion.model, "diffusion drafter")
    check_same_tokenizer(target.tokenizer, diffusion.tokenizer, "diffusion drafter")
    proposer = DiffusionProposer(diffusion.model, p.gamma, p.steps, p.reveal)
    check_draft_work(proposer.gamma, proposer.steps)  # also for the drafter's default operating point
    rule, greedy_rule = sdd_rules(p)
    return Engine(
        target.model,
        target.tokenizer,
        proposer=proposer,
        rule=rule,
        greedy_rule=greedy_rule,
        scheduler=scheduler,
        k=proposer.gamma,
        shadow=target.model if p.shadow else None,
    )


def _build_skip(models: ModelSet, p: Params) -> Engine:
    signal = make_signal(p.signal, models.survival)
    scheduler = ConfidenceSkip(p.tau, k_min=p.k_min, s_max=p.s_max, signal=signal, signal_tau=p.signal_tau)
    engine = build_sdd(models, p, scheduler, "sdd-skip")
    _check_k_min(p.k_min, engine.proposer.gamma)
    if p.signal != "raw":
        hidden = engine.proposer.lm.model.config.hidden_size
        if models.survival.config.hidden_size != hidden:
            raise RelaxSpecError(
                f"the survival predictor was trained on drafter hidden states of size "
                f"{models.survival.config.hidden_size}, this drafter has {hidden}"
            )
    return engine


def _build_periodic(models: ModelSet, p: Params) -> Engine:
    engine = build_sdd(models, p, Periodic(p.period, p.skip_k), "sdd-periodic")
    if p.skip_k > engine.proposer.gamma:
        raise RelaxSpecError(f"skip_k ({p.skip_k}) cannot exceed gamma ({engine.proposer.gamma})")
    return engine


register(
    MethodSpec(
        "sdd",
        "Strict speculative diffusion decoding: diffusion-drafted blocks, every block verified",
        ("target", "diffusion"),
        BASE_PARAMS,
        lambda models, p: build_sdd(models, p, Strict()),
        _validate_base,
        vllm=VllmRow("diffusion", drops=("shadow",)),  # verified every block: vLLM can run it
    )
)
register(
    MethodSpec(
        "sdd-skip",
        "SDD with confidence-guided verifier skipping (signal raw | marginal | conditional)",
        ("target", "diffusion"),
        declare(*BASE_PARAMS.values(), *SKIP_PARAMS.values()),
        _build_skip,
        _validate_skip,
        optional=("survival",),
    )
)
register(
    MethodSpec(
        "sdd-periodic",
        "SDD that commits skip_k draft tokens unverified every period rounds (baseline)",
        ("target", "diffusion"),
        declare(*BASE_PARAMS.values(), *PERIODIC_PARAMS.values()),
        _build_periodic,
        _validate_periodic,
    )
)
