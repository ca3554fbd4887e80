"""Draft-model presets (docs/design.md §4): a draft model (or an EAGLE head) proposes K tokens, the
target verifies them with a rule: exact SD, NSD, top-k, typical, lenience, and the other engines'
relaxed rules (TensorRT-LLM's top-k/δ, SGLang's thresholds, FLy).
"""

from __future__ import annotations

from collections.abc import Callable

from relaxspec.core.named_rules import RULES, RuleSpec
from relaxspec.engine import Engine
from relaxspec.engine.proposers.draft_model import DraftModel
from relaxspec.engine.proposers.draft_vocab import draft_vocabulary
from relaxspec.engine.proposers.eagle import EagleProposer, LoadedEagle
from relaxspec.errors import RelaxSpecError, is_int
from relaxspec.methods.registry import MethodSpec, ModelSet, VllmRow, no_check, register
from relaxspec.models import LoadedModel, check_compatible, check_same_tokenizer
from relaxspec.params import (
    MAX_DRAFT_WORK,
    K,
    Param,
    Params,
    declare,
)

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
# Which model drafts for a draft-model rule, in both engines: the draft role (--draft: a causal LM
# or an EAGLE head) or the eagle role (--eagle, bundled models/eagle), so that one bench compares
# draft-model and EAGLE drafting in the same run (`--set sd.drafter=draft,eagle`).
DRAFTERS = ("draft", "eagle")
DRAFTER = Param(
    "drafter", str, "draft", "model role that drafts: draft (--draft) or eagle (--eagle)", choices=DRAFTERS
)


# Our engine only: a chain of drafts ends early after a draft its proposer gave less than this
# probability (engine/proposers/base.py draft_chain); vLLM's proposers always draft k.
STOP_BELOW = Param(
    "stop_below",
    float,
    0.0,
    "end the chain of drafts after one the drafter gives less than this probability (0: always k)",
    lo=0,
    hi=1,
)


# An EAGLE head's draft vocabulary (EAGLE-3; engine/proposers/draft_vocab.py): the head's law is
# over its n most frequent training tokens. Our engine only: vLLM's eagle proposer drafts over the
# full vocabulary.
EAGLE_VOCAB = Param(
    "eagle_vocab",
    int,
    None,
    "EAGLE head's draft vocabulary: its n most frequent tokens (0: all; None: the head's default; "
    "a draft model ignores it)",
    lo=0,
    hi=1 << 20,
    optional=True,
)


def check_drafter(drafter: str, proposer: str = "draft") -> str:
    """``drafter`` checked (:data:`DRAFTER`); a model role other than ``draft`` drafts through vLLM's
    model proposers (draft-model or eagle), so it takes ``proposer=draft``."""
    DRAFTER.check(drafter)
    if drafter != "draft" and proposer != "draft":
        raise RelaxSpecError(
            f"drafter={drafter} drafts with a model of that role (vLLM's draft-model or eagle proposer): "
            f"it takes proposer=draft, got proposer={proposer!r}"
        )
    return drafter


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


def draft_proposer(
    target: LoadedModel,
    draft: LoadedModel | LoadedEagle,
    stop_below: float = 0.0,
    eagle_vocab: int | None = None,
) -> DraftModel | EagleProposer:
    """What ``--draft`` proposes with: a draft model, or an EAGLE head drafting from the target's
    hidden states (checked against the target it was trained for) over its draft vocabulary
    (:data:`EAGLE_VOCAB`); ``stop_below``: :data:`STOP_BELOW`."""
    if isinstance(draft, LoadedEagle):
        vocab = draft_vocabulary(draft.ranking, eagle_vocab, draft.vocab_default, str(draft.path))
        return EagleProposer(draft.head, target.model, draft.target, stop_below, vocab)
    check_compatible(target.model, draft.model, "draft")
    check_same_tokenizer(target.tokenizer, draft.tokenizer, "draft")
    return DraftModel(draft.model, stop_below)


def draft_model_method(
    name: str,
    summary: str,
    rule: RuleSpec,
    sampling_only: bool = False,
    validate: Callable[[Params], None] = no_check,
) -> MethodSpec:
    """A classic SD-style preset: DraftModel proposer, target verifier, ``rule``'s (sampling,
    greedy) pair (``sampling_only``: no greedy variant on our engine)."""

    def build(models: ModelSet, p: Params) -> Engine:
        target, draft = models.require("target", name), models.require(p.drafter, name)
        sampling, greedy = rule.pair(p)
        return Engine(
            target.model,
            target.tokenizer,
            proposer=draft_proposer(target, draft, p.stop_below, p.eagle_vocab),
            rule=sampling,
            greedy_rule=None if sampling_only else greedy,
            k=p.k,
        )

    params = declare(K, DRAFTER, STOP_BELOW, EAGLE_VOCAB, *rule.params.values())
    lookup = declare(RULE_PROPOSER, PROMPT_LOOKUP_MIN, PROMPT_LOOKUP_MAX)
    row = VllmRow("draft", lookup, drops=("stop_below", "eagle_vocab"))  # vLLM's draft k, full vocab
    return MethodSpec(
        name, summary, ("target", "draft"), params, build, validate, optional=("eagle",), rule=rule, vllm=row
    )


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
