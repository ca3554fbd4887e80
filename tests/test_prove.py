"""ProVe methods: prove-lossless = greedy AR, exact sampling, the product gate, MARS, diagnostics."""

from __future__ import annotations

import itertools

import pytest
import torch

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine import CycleRecord
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.prove_diagnostics import (
    analyze_cycles,
    ar_matching_prefix,
    auroc,
    gate_aucs,
    non_matching_rate,
    sequential_population,
)
from relaxspec.methods import ModelSet, build_engine, resolve_params
from relaxspec.models import LoadedModel
from relaxspec.testing import chi_square_pvalue, exact_joint, sample_continuations, tiny_llama, tiny_tokenizer

# on the counting pattern (long AR-matching prefixes) and off it (early mismatches)
PROMPTS = ["w1 w3 w5 w7", "w0 w1", "w6 w2 w2 w3 w1", "w4 w7 w2 w5 w0 w3", "w5"]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def records_of(engine, prompt: str, params: SamplingParams) -> tuple[list[CycleRecord], object]:
    records: list[CycleRecord] = []
    result = engine.generate(prompt, params, on_cycle=records.append)
    return records, result


@pytest.mark.parametrize("block_size", [1, 2, 4, 6])
def test_prove_lossless_greedy_is_token_identical_to_ar(block, block_size):
    ar = build_engine("ar", block)
    lossless = build_engine("prove-lossless", ModelSet(block=block), block_size=block_size, fused=False)
    deep = 0
    for prompt in PROMPTS:
        expected = ar.generate(prompt, greedy(36)).tokens
        result = lossless.generate(prompt, greedy(36))
        assert result.tokens == expected
        s = result.stats
        assert s.draft_calls == s.verifier_calls or s.draft_calls == s.verifier_calls - 1
        deep += s.accepted_tokens - s.cycles  # accepted beyond the always-matching first token
    if block_size > 1:
        assert deep > 0  # proposals really matched beyond position 1 somewhere


@pytest.mark.parametrize("block_size,min_confidence", [(2, 0.0), (4, 0.3), (6, 0.0)])
def test_fused_prove_lossless_greedy_is_token_identical_to_ar(block, block_size, min_confidence):
    """fused=true: one verifier forward per cycle verifies the last block and draws the next one
    at the placeholders; no proposer forward; greedy output = AR."""
    ar = build_engine("ar", block)
    models = ModelSet(block=block)
    fused = build_engine(
        "prove-lossless", models, block_size=block_size, fused=True, min_confidence=min_confidence
    )
    deep = 0
    for prompt in PROMPTS:
        expected = ar.generate(prompt, greedy(36)).tokens
        records, result = records_of(fused, prompt, greedy(36))
        assert result.tokens == expected
        assert result.stats.draft_calls == 0 and result.stats.verifier_calls == len(records)
        assert all(r.proposal is None or r.proposal.k <= block_size - 1 for r in records)
        deep += sum(len(r.chunk) - 1 for r in records)  # tokens beyond one per forward
    assert deep > 0


def test_fused_cycles_draft_after_a_whole_block_and_not_after_a_rejection(block):
    engine = build_engine("prove-lossless", ModelSet(block=block), block_size=6, fused=True, min_confidence=0)
    records, result = records_of(engine, "w1 w3 w5 w7", greedy(40))
    assert result.stats.tau > 1.5 and max(len(r.chunk) for r in records) >= 4
    for before, after in itertools.pairwise(records[:-2]):  # not the budget's last cycles
        # a cycle without drafts always draws a block; one with drafts only if all were accepted
        whole = before.proposal is None or len(before.chunk) == before.proposal.k + 1
        assert (after.proposal is not None) == whole


def test_prove_lossless_commits_up_to_a_block_plus_bonus(block):
    engine = build_engine("prove-lossless", ModelSet(block=block), block_size=6, fused=False)
    records, result = records_of(engine, "w1 w3 w5 w7", greedy(40))
    sizes = [len(r.chunk) for r in records if r.proposal is not None]
    assert max(sizes) == 7  # a fully accepted block of 6 plus the bonus token
    assert min(sizes) >= 1
    assert result.stats.tau > 2


def test_mars_with_tau_one_is_greedy_ar_and_tau_zero_commits_blocks(block):
    ar = build_engine("ar", block)
    strict = build_engine("mars", ModelSet(block=block), block_size=6, tau=1.0)
    loose = build_engine("mars", ModelSet(block=block), block_size=6, tau=0.0)
    for prompt in PROMPTS[:3]:
        assert strict.generate(prompt, greedy(20)).tokens == ar.generate(prompt, greedy(20)).tokens
        records, result = records_of(loose, prompt, greedy(31))
        assert all(len(r.chunk) == r.proposal.k and r.skipped == r.proposal.k for r in records if r.proposal)
        assert result.stats.verifier_calls <= 1  # only a last single token of the budget is verified
        if result.stats.verifier_calls == 0:  # τ of a verifier-free method: tokens per cycle
            assert result.stats.tau == pytest.approx(31 / result.stats.cycles) and result.stats.tau > 1


def test_mars_commits_the_confident_prefix(block):
    engine = build_engine("mars", ModelSet(block=block), block_size=6, tau=0.6)
    records, _ = records_of(
        engine, "w6 w2 w2 w3 w1", SamplingParams(temperature=1.0, seed=3, max_new_tokens=40)
    )
    for r in records:
        if r.proposal is None:
            continue
        conf = r.proposal.confidence[0].tolist()
        n = len(r.chunk)
        assert n >= 1 and all(c >= 0.6 for c in conf[1:n])
        assert n == r.proposal.k or conf[n] < 0.6 or (n == 1 and conf[0] < 0.6)


@pytest.fixture(scope="module")
def verifier(block, tokenizer):
    """A small verifier sharing the tokenizer (random: disagrees with the proposer often)."""
    return LoadedModel(tiny_llama(len(tokenizer), seed=2, layers=1, logit_scale=3.0), tokenizer, None)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prove_gate_thresholds(block, verifier, temperature):
    models = ModelSet(block=block, draft=verifier)
    params = SamplingParams(temperature=temperature, seed=1, max_new_tokens=41, ignore_eos=True)
    records, result = records_of(build_engine("prove", models, block_size=4, theta=0.0), "w2 w4", params)
    verified = [r for r in records if r.proposal is not None]
    assert all(len(r.chunk) == r.proposal.k for r in verified)  # θ = 0: whole blocks, no bonus
    assert result.stats.tau == pytest.approx(41 / result.stats.verifier_calls)
    records, result = records_of(build_engine("prove", models, block_size=4, theta=1.5), "w2 w4", params)
    assert all(len(r.chunk) == 1 for r in records)  # θ > 1: exactly one token per cycle
    assert result.stats.cycles == 41


def test_prove_gate_is_the_product_rule(block, verifier):
    theta = 0.05
    engine = build_engine("prove", ModelSet(block=block, draft=verifier), block_size=6, theta=theta)
    records, _ = records_of(engine, "w1 w3 w5", SamplingParams(temperature=0, max_new_tokens=40))
    lengths = set()
    for r in records:
        if r.proposal is None:
            continue
        d = r.proposal.tokens[0]
        gate = r.proposal.confidence[0] * r.target_probs[0, :-1].gather(-1, d[:, None]).squeeze(-1)
        passing = (gate >= theta).long()
        passing[0] = 1
        assert len(r.chunk) == int(passing.cumprod(0).sum())
        lengths.add(len(r.chunk))
    assert len(lengths) > 1  # the gate cut blocks at different depths


# ---------------------------------------------------------------------------------------------
# Exact sampling: prove-lossless at temperature > 0 reproduces the proposer's AR law


N_TOKENS = 3


@pytest.fixture(scope="module")
def small_block():
    """V = 6: 216 triples. Untrained, so placeholder laws differ from the AR law (decisive control)."""
    tok = tiny_tokenizer(2)
    model = tiny_llama(len(tok), seed=0, logit_scale=2.0)
    model.config.mars_block_size = 4
    return LoadedModel(model, tok, None)


def exact_ar_joint(model: LoadedModel, prompt: str, params: SamplingParams) -> dict[tuple[int, ...], float]:
    return exact_joint(model.model, model.tokenizer(prompt)["input_ids"], params, N_TOKENS)


def sample_triples(engine, prompt: str, n: int, params: SamplingParams) -> list[tuple[int, ...]]:
    return sample_continuations(engine, prompt, n, params, N_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_p,block_size", [(1.0, 1.0, 3), (0.7, 0.9, 2)])
def test_prove_lossless_sampling_is_exact(small_block, temperature, top_p, block_size):
    params = SamplingParams(temperature=temperature, top_p=top_p)
    engine = build_engine("prove-lossless", ModelSet(block=small_block), block_size=block_size, fused=False)
    samples = sample_triples(engine, "w0 w1", 3000, params)
    assert chi_square_pvalue(samples, exact_ar_joint(small_block, "w0 w1", params)) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_p,block_size", [(1.0, 1.0, 3), (0.7, 0.9, 4)])
def test_fused_prove_lossless_sampling_is_exact(small_block, temperature, top_p, block_size):
    """fused=true draws drafts from the placeholder laws (untrained: far from the AR law) and still
    emits the AR law (the Exact rule with the q it drew from)."""
    params = SamplingParams(temperature=temperature, top_p=top_p)
    models = ModelSet(block=small_block)
    engine = build_engine("prove-lossless", models, block_size=block_size, fused=True, min_confidence=0)
    samples = sample_triples(engine, "w0 w1", 3000, params)
    assert chi_square_pvalue(samples, exact_ar_joint(small_block, "w0 w1", params)) > 1e-3


@pytest.mark.slow
def test_negative_control_mars_sampling_is_detected(small_block):
    """MARS at τ = 0 samples whole blocks from placeholder laws: not the AR law, and the test sees it."""
    params = SamplingParams(temperature=1.0)
    engine = build_engine("mars", ModelSet(block=small_block), block_size=3, tau=0.0)
    samples = sample_triples(engine, "w0 w1", 3000, params)
    assert chi_square_pvalue(samples, exact_ar_joint(small_block, "w0 w1", params)) < 1e-3


# ---------------------------------------------------------------------------------------------
# Bad input


def test_bad_input(block, verifier, tokenizer):
    models = ModelSet(block=block, draft=verifier)
    with pytest.raises(RelaxSpecError, match="theta must be a finite number ≥ 0"):
        resolve_params("prove", {"theta": -0.1})
    with pytest.raises(RelaxSpecError, match=r"block_size .* must be an integer in \[1, 64\]"):
        resolve_params("prove-lossless", {"block_size": 0})
    with pytest.raises(RelaxSpecError, match=r"tau must be a number in \[0, 1\]"):
        resolve_params("mars", {"tau": 1.5})
    with pytest.raises(RelaxSpecError, match="has no parameter k"):
        resolve_params("prove", {"k": 4})
    with pytest.raises(RelaxSpecError, match="larger than the block size the proposer was trained with"):
        build_engine("prove", models, block_size=7)
    with pytest.raises(RelaxSpecError, match="needs a draft model"):
        build_engine("prove", ModelSet(block=block))
    assert build_engine("prove", models).k == 6  # default: the trained block size
    with pytest.raises(RelaxSpecError, match="needs a block model"):
        build_engine("prove-lossless", ModelSet(target=block))
    other_tok = tiny_tokenizer(10)
    other = LoadedModel(tiny_llama(len(other_tok), seed=2, layers=1), other_tok, None)
    with pytest.raises(RelaxSpecError, match="vocabulary mismatch"):
        build_engine("prove", ModelSet(block=block, draft=other), block_size=4)
    no_mask = tiny_tokenizer(8)
    no_mask.mask_token = None
    with pytest.raises(RelaxSpecError, match="no mask token"):
        build_engine("prove-lossless", ModelSet(block=LoadedModel(block.model, no_mask, None)), block_size=4)
    with pytest.raises(RelaxSpecError, match="is not a block proposer"):
        build_engine("mars", ModelSet(block=verifier), block_size=4)
    with pytest.raises(RelaxSpecError, match="fused must be true or false"):
        resolve_params("prove-lossless", {"fused": "yes"})
    with pytest.raises(RelaxSpecError, match="min_confidence must be"):
        resolve_params("prove-lossless", {"min_confidence": 1.0})
    with pytest.raises(RelaxSpecError, match="block_size >= 2"):
        resolve_params("prove-lossless", {"fused": True, "block_size": 1})


# ---------------------------------------------------------------------------------------------
# Diagnostics


def brute_force_auc(scores: list[float], labels: list[bool]) -> float:
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def test_auroc():
    assert auroc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == pytest.approx(0.75)
    assert auroc(torch.tensor([1.0, 2.0]), torch.tensor([0, 1])) == 1.0
    assert auroc(torch.tensor([1.0, 2.0]), torch.tensor([1, 0])) == 0.0
    assert auroc(torch.ones(6), torch.tensor([0, 1, 0, 1, 1, 0])) == 0.5
    assert auroc(torch.rand(5), torch.ones(5)) != auroc(torch.rand(5), torch.ones(5))  # NaN: one class
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        scores = torch.randint(0, 6, (40,), generator=gen).float()  # many ties
        labels = torch.rand(40, generator=gen) < 0.4
        assert auroc(scores, labels) == pytest.approx(brute_force_auc(scores.tolist(), labels.tolist()))
    aucs = gate_aucs(torch.tensor([0.9, 0.2, 0.5]), torch.tensor([0.1, 0.3, 0.9]), torch.tensor([1, 0, 1]))
    assert aucs == {"auc_confidence": 1.0, "auc_verifier": 0.5, "auc_product": 1.0}


def test_prefix_helpers():
    d, a = torch.tensor([5, 6, 7, 8]), torch.tensor([5, 6, 1, 8])
    assert ar_matching_prefix(d, a) == 2
    assert ar_matching_prefix(d, torch.tensor([0, 6, 7, 8])) == 0
    assert sequential_population(d == a).tolist() == [True, True, True, False]
    assert sequential_population(d == d).tolist() == [True] * 4
    assert non_matching_rate(d, a) == 0.25
    assert non_matching_rate(torch.tensor([]), torch.tensor([])) == 0.0
    with pytest.raises(RelaxSpecError):
        ar_matching_prefix(d, a[:3])


def test_analyze_cycles_on_prove_lossless(block):
    """Greedy prove-lossless (proposer forward + verify forward): accepted = AR-matching prefix
    every cycle, non-matching rate 0."""
    engine = build_engine("prove-lossless", ModelSet(block=block), block_size=6, fused=False)
    prompt = "w2 w5 w0 w3"
    records, result = records_of(engine, prompt, greedy(40))
    ids = torch.cat([engine.encode(prompt), torch.tensor([result.tokens])], dim=1)
    report = analyze_cycles(records, ids, engine.encode(prompt).shape[1], block.model)
    accepted = [int(r.verdict.accepted[0]) for r in records if r.verdict is not None]
    assert report["mean_ar_prefix"] == pytest.approx(sum(accepted) / len(accepted))
    assert report["non_matching_rate"] == 0.0
    assert report["committed_per_cycle"] == pytest.approx(40 / result.stats.cycles)
    assert report["ar_match_by_depth"][0] == 1.0
    assert 0.0 <= report["auc_product"] <= 1.0 and report["auc_positions"] > 0


def test_analyze_cycles_on_mars_scores_skipped_cycles_offline(block, verifier):
    engine = build_engine("mars", ModelSet(block=block), block_size=6, tau=0.0)
    prompt = "w6 w2 w2 w3 w1"
    records, result = records_of(engine, prompt, greedy(30))
    ids = torch.cat([engine.encode(prompt), torch.tensor([result.tokens])], dim=1)
    n = engine.encode(prompt).shape[1]
    report = analyze_cycles(records, ids, n, block.model, verifier_model=verifier.model)
    assert report["non_matching_rate"] > 0  # τ = 0 commits unverified mistakes
    assert "auc_verifier" in report
    assert "auc_verifier" not in analyze_cycles(records, ids, n, block.model)
