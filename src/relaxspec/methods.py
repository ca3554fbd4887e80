"""Named method presets (docs/design.md §4): a method is a (proposer, verifier, rule, scheduler) combination.

``build_engine("nsd", target, draft, theta=0.9, k=4)`` returns a ready :class:`Engine`. Each
preset (:class:`MethodSpec`) declares the models it needs, its typed parameters
(:class:`~relaxspec.params.Param`), the rule it verifies with (:data:`RULES`) and its row inside
vLLM (:class:`VllmRow`). Parameters are resolved once into a frozen
:class:`~relaxspec.params.Params`; the CLI's flags, the server's ``relaxspec.params``, vLLM's
``extra_args`` and the bench grid all read these declarations. Users who want another
combination build an :class:`Engine` from the parts directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relaxspec.core.acceptance import Exact, Greedy, Rule
from relaxspec.core.named_rules import RULES, RuleSpec, theta_with_default
from relaxspec.engine import Engine
from relaxspec.engine.packed import KERNELS
from relaxspec.engine.packed import attach as attach_kernels
from relaxspec.engine.proposers.block import (
    DEFAULT_MIN_CONFIDENCE,
    BlockProposer,
    FusedBlockProposer,
    check_fused_block_size,
    check_min_confidence,
    mask_token_id_of,
    trained_block_size,
)
from relaxspec.engine.proposers.diffusion import REVEAL_ORDERS, DiffusionProposer, load_diffusion
from relaxspec.engine.proposers.draft_model import DraftModel
from relaxspec.engine.proposers.eagle import EagleProposer, LoadedEagle, is_eagle_dir, load_eagle
from relaxspec.engine.schedulers import ConfidenceSkip, Periodic, RawConfidence, Scheduler, Signal, Strict
from relaxspec.engine.survival import ConditionalSurvival, MarginalSurvival, SurvivalPredictor
from relaxspec.errors import RelaxSpecError, check_choice, check_int, is_int
from relaxspec.models import LoadedModel, check_compatible, check_same_tokenizer, load_model, model_dir
from relaxspec.params import (
    ACCEPT_K,
    BLOCK_SIZE,
    DEFAULT_BLOCK_SIZE,
    MAX_COUNT,
    MAX_DRAFT_TOKENS,
    MAX_DRAFT_WORK,
    TAU,
    K,
    Param,
    Params,
    declare,
    defaults,
    resolve,
)

MODEL_ROLES = ("target", "draft", "block", "diffusion", "survival")


@dataclass
class ModelSet:
    """The models a method may use, by role; ``require`` gives a clear error for a missing one."""

    target: LoadedModel | None = None
    draft: LoadedModel | None = None
    block: LoadedModel | None = None
    diffusion: Any = None
    survival: Any = None

    def require(self, role: str, method: str) -> Any:
        model = getattr(self, role)
        if model is None:
            raise RelaxSpecError(f"method {method!r} needs a {role} model")
        return model


# --- Methods: presets that own their parameters, build engines and declare their vLLM row ----------


@dataclass(frozen=True)
class VllmRow:
    """How a method runs inside vLLM (read by :mod:`relaxspec.integrations.vllm.runners`).

    ``proposer``: ``ar`` (no drafts), ``draft`` (vLLM's draft-model proposer; ``proposer=block``
    swaps in a MARS drafter, ``proposer=ngram`` / ``suffix`` vLLM's model-free proposers),
    ``block`` (a block proposer: ``seam`` picks how), ``diffusion``.
    ``extras``: parameters only the vLLM row has; ``drops``: engine parameters it does not take.
    """

    proposer: str
    extras: Mapping[str, Param] = field(default_factory=declare)
    drops: tuple[str, ...] = ()


def _no_check(p: Params) -> None:
    """No checks beyond each parameter's own."""


@dataclass(frozen=True)
class MethodSpec:
    """A preset: the models it needs, its typed parameters, its builder and its vLLM row.

    ``rule``: the rule it verifies with (None: it picks one from its parameters, or none).
    ``validate``: checks across parameters, run once after each parameter's own check.
    ``optional`` roles are loaded when a path is given or a bundled model exists, and left None
    otherwise (the builder raises a clear error if the chosen parameters need them).
    ``vllm``: its row inside vLLM, or None where it skips the verifier (vLLM cannot).
    """

    name: str
    summary: str
    needs: tuple[str, ...]
    params: Mapping[str, Param]
    build: Callable[[ModelSet, Params], Engine]
    validate: Callable[[Params], None] = _no_check
    optional: tuple[str, ...] = ()
    rule: RuleSpec | None = None
    vllm: VllmRow | None = None

    @property
    def defaults(self) -> dict[str, Any]:
        return defaults(self.params)

    def resolve(self, given: Mapping[str, Any]) -> Params:
        """``given`` over the defaults, each value checked, then the checks across values."""
        p = resolve(f"method {self.name!r}", self.params, given)
        self.validate(p)
        if self.rule is not None:
            self.rule.pair(p)  # constructing the rules validates θ, ℓ, ε, δ, ...
        return p


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add a preset to the registry (users may register their own combinations too)."""
    METHODS[spec.name] = spec
    return spec


# vLLM-only: which drafter a draft-model rule runs with: the draft model, a MARS block drafter
# (block size = k), or one of vLLM's model-free proposers (integrations/vllm/lookup.py), whose
# drafts carry no probabilities (q is one-hot at the draft): ngram (prompt lookup in the request's
# own context, window prompt_lookup_min..max) or suffix (suffix decoding, needs arctic-inference)
LOOKUP_PROPOSERS = ("ngram", "suffix")
RULE_PROPOSER = Param(
    "proposer",
    str,
    "draft",
    "vLLM drafter: draft model, block proposer, or vLLM's model-free ngram / suffix",
    choices=("draft", "block", *LOOKUP_PROPOSERS),
)
PROMPT_LOOKUP_MIN = Param(
    "prompt_lookup_min",
    int,
    None,
    "proposer=ngram: shortest n-gram matched (None: prompt_lookup_max, or vLLM's 5)",
    lo=1,
    hi=MAX_DRAFT_WORK,
    optional=True,
)
PROMPT_LOOKUP_MAX = Param(
    "prompt_lookup_max",
    int,
    None,
    "proposer=ngram: longest n-gram matched (None: prompt_lookup_min, or vLLM's 5)",
    lo=1,
    hi=MAX_DRAFT_WORK,
    optional=True,
)


def draft_proposer(target: LoadedModel, draft: LoadedModel | LoadedEagle) -> DraftModel | EagleProposer:
    """What ``--draft`` proposes with: a draft model, or an EAGLE head drafting from the target's
    hidden states (checked against the target it was trained for)."""
    if isinstance(draft, LoadedEagle):
        return EagleProposer(draft.head, target.model, draft.target)
    check_compatible(target.model, draft.model, "draft")
    check_same_tokenizer(target.tokenizer, draft.tokenizer, "draft")
    return DraftModel(draft.model)


def draft_model_method(
    name: str,
    summary: str,
    rule: RuleSpec,
    sampling_only: bool = False,
    validate: Callable[[Params], None] = _no_check,
) -> MethodSpec:
    """A classic SD-style preset: DraftModel proposer, target verifier, ``rule``'s (sampling,
    greedy) pair (``sampling_only``: no greedy variant on our engine)."""

    def build(models: ModelSet, p: Params) -> Engine:
        target, draft = models.require("target", name), models.require("draft", name)
        sampling, greedy = rule.pair(p)
        return Engine(
            target.model,
            target.tokenizer,
            proposer=draft_proposer(target, draft),
            rule=sampling,
            greedy_rule=None if sampling_only else greedy,
            k=p.k,
        )

    params = declare(K, *rule.params.values())
    row = VllmRow("draft", declare(RULE_PROPOSER, PROMPT_LOOKUP_MIN, PROMPT_LOOKUP_MAX))
    return MethodSpec(name, summary, ("target", "draft"), params, build, validate, rule=rule, vllm=row)


register(
    MethodSpec(
        "ar",
        "autoregressive decoding with the target (the baseline)",
        ("target",),
        declare(),
        lambda models, p: Engine(
            models.require("target", "ar").model, models.require("target", "ar").tokenizer
        ),
        vllm=VllmRow("ar"),
    )
)
register(
    draft_model_method(
        "sd", "speculative decoding, exact (Leviathan/Chen); greedy: argmax match", RULES["sd"]
    )
)
register(
    draft_model_method(
        "nsd", "Nucleus Speculative Decoding: also accept drafts in the target's θ-nucleus", RULES["nsd"]
    )
)
register(
    draft_model_method("topk", "also accept drafts among the target's top accept_k tokens", RULES["topk"])
)
register(
    draft_model_method(
        "typical", "typical acceptance (Medusa): also accept p(x) ≥ min(ε, δ·exp(−H(p)))", RULES["typical"]
    )
)
register(
    draft_model_method(
        "lenience", "lenient acceptance min(1, p/(ℓq)); sampling only", RULES["lenience"], True
    )
)

# --- The other engines' relaxed rules (core/peer_rules.py; issue 31) ------------------------------
# Their defaults are moderate relaxations to start a sweep from (relaxspec bench --set), not tuned.

register(
    draft_model_method(
        "topk-delta",
        "TensorRT-LLM relaxed acceptance: also accept drafts in the target's top_n within delta of its top p",
        RULES["topk-delta"],
    )
)
register(
    draft_model_method(
        "threshold",
        "SGLang accept thresholds: accept if p ≥ single, else with probability min(1, p/(acc·q))",
        RULES["threshold"],
    )
)


def _validate_fly(p: Params) -> None:
    """A window that reaches past the draft block defers nothing (``window`` None: ``min(6, K − 1)``
    per cycle, vLLM's default)."""
    if p.k == 1:
        raise RelaxSpecError("fly needs k ≥ 2: it defers a rejection on the evidence of later drafts")
    if is_int(p.window) and p.window >= p.k:
        raise RelaxSpecError(
            f"window ({p.window}) must be smaller than k ({p.k}): FLy defers a rejection only "
            "when the whole window of later drafts lies inside the block"
        )


register(
    draft_model_method(
        "fly",
        "FLy: keep a rejected draft at a high-entropy position if the next window drafts are accepted",
        RULES["fly"],
        validate=_validate_fly,
    )
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


def _build_mars(models: ModelSet, p: Params) -> Engine:
    block, proposer = _block_proposer(models, "mars", p)
    # No verifier: the commit-first scheduler commits >= 1 token every cycle, so the rules are
    # never consulted (the engine only verifies the last token of a length budget).
    return Engine(
        block.model,
        block.tokenizer,
        proposer=proposer,
        rule=Exact(),
        greedy_rule=Greedy(),
        scheduler=ConfidenceSkip(p.tau, commit_first=True),
        k=proposer.block_size,
    )


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
    return Engine(
        block.model,
        block.tokenizer,
        proposer=proposer,
        rule=Exact(),
        greedy_rule=Greedy(),
        k=proposer.block_size,
    )


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


def params_named(name: str) -> list[tuple[str, Param]]:
    """Every (method, its :class:`Param`) of that name, in registry order (the CLI's flag help)."""
    return [(m, spec.params[name]) for m, spec in METHODS.items() if name in spec.params]


def method_names() -> list[str]:
    return list(METHODS)


def get_method(method: str) -> MethodSpec:
    if method not in METHODS:
        raise RelaxSpecError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    return METHODS[method]


def resolve_params(method: str, params: Mapping[str, Any]) -> Params:
    """Defaults of ``method`` overridden by ``params``, validated once; unknown names are an error."""
    return get_method(method).resolve(params)


def build_engine(
    method: str, target: LoadedModel | ModelSet, draft: LoadedModel | None = None, **params: Any
) -> Engine:
    """An :class:`Engine` for a named method; ``target`` may be a :class:`ModelSet` of all roles."""
    resolved = resolve_params(method, params)
    models = target if isinstance(target, ModelSet) else ModelSet(target=target, draft=draft)
    return get_method(method).build(models, resolved)


def load_draft(path: Path) -> LoadedModel | LoadedEagle:
    """A ``--draft`` directory: an EAGLE head (recognised by its config) or a causal LM."""
    return load_eagle(path) if is_eagle_dir(path) else load_model(path)


# How a model of each role is loaded from a directory.
ROLE_LOADERS: dict[str, Callable[[Path], Any]] = {
    "target": load_model,
    "draft": load_draft,
    "block": load_model,
    "diffusion": load_diffusion,
    "survival": SurvivalPredictor.load,
}


# Roles whose decoding forwards may run on packed kernels (engine/packed.py): every transformers
# model the engines decode with (the diffusion drafter's block forward passes its own mask).
PACKED_ROLES = ("target", "draft", "block", "diffusion")


def load_role(role: str, path: Path, kernels: str = "auto") -> Any:
    """A model of ``role`` loaded from ``path`` with that role's loader.

    ``kernels`` (:data:`relaxspec.engine.packed.KERNELS`) says what the decoding forwards of a
    :data:`PACKED_ROLES` model run on; ``auto`` picks the fastest measured one it allows.
    """
    if role not in ROLE_LOADERS:
        raise RelaxSpecError(f"no loader for {role} models (roles: {', '.join(ROLE_LOADERS)})")
    if kernels not in KERNELS:
        raise RelaxSpecError(f"unknown kernels {kernels!r} (choose from {', '.join(KERNELS)})")
    loaded = ROLE_LOADERS[role](path)
    if role in PACKED_ROLES and not isinstance(loaded, LoadedEagle):  # a head runs on the target's
        attach_kernels(loaded.model, kernels)
    return loaded


def load_models(
    method: str, paths: dict[str, str | Path | None] | None = None, kernels: str = "auto"
) -> ModelSet:
    """Load the models ``method`` needs: from ``paths[role]`` or the bundled ``models/<role>``."""
    spec = get_method(method)
    paths = paths or {}
    models = ModelSet()
    for role in spec.needs:
        path = model_dir(role, paths.get(role), f"method {method!r}")
        setattr(models, role, load_role(role, path, kernels))
    for role in spec.optional:
        path = model_dir(role, paths.get(role), required=False)
        if path is not None:
            setattr(models, role, load_role(role, path, kernels))
    return models
