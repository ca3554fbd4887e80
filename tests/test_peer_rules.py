"""The other engines' relaxed rules (issue 31): TopKDelta (TensorRT-LLM), Threshold (SGLang), FLy.

Sets and tie semantics on worked examples; the sampler's emitted law against the closed form
(TopKDelta, Threshold) or exact enumeration (FLy) with fixed seeds and 200k rows; invariants by
hypothesis; the "exact settings" give Exact / Greedy verdicts on the same draws.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relaxspec.acceptance import Exact, FLy, Greedy, Threshold, TopKDelta, Verdict, fly_entropy, verify
from relaxspec.errors import RelaxSpecError
from relaxspec.testing import LAW_CASES
from relaxspec.testing import law_chi2_pvalue as chi2_pvalue
from relaxspec.theory import (
    emitted_distribution,
    fly_block_law,
    peer_emitted_law,
    peer_excess,
    total_variation,
)

N_ROWS = 200_000
# (p, q) with a generic law and one with ties and zeros (the tied boundary decides membership).
LAWS = LAW_CASES
PEER_RULES = [
    TopKDelta(3, 0.2),
    TopKDelta(8, 1.0),
    Threshold(0.2, 1.0),
    Threshold(0.5, 0.5),
    Threshold(1.0, 0.3),
]


def same(a: Verdict, b: Verdict) -> bool:
    return torch.equal(a.accepted, b.accepted) and torch.equal(a.next_token, b.next_token)


def first_emitted(tokens: torch.Tensor, verdict: Verdict) -> torch.Tensor:
    return torch.where(verdict.accepted > 0, tokens[:, 0], verdict.next_token)


# ---------------------------------------------------------------------------------------------
# Parameters, sets and ties
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: TopKDelta(0, 0.1),
        lambda: TopKDelta(2.0, 0.1),
        lambda: TopKDelta(True, 0.1),
        lambda: TopKDelta(2, -0.1),
        lambda: TopKDelta(2, 1.5),
        lambda: TopKDelta(2, True),
        lambda: TopKDelta(2, float("nan")),
        lambda: Threshold(0.0, 1.0),
        lambda: Threshold(1.5, 1.0),
        lambda: Threshold(0.5, 0.0),
        lambda: Threshold(True, 1.0),
        lambda: Threshold(0.5, "1"),
        lambda: FLy(0, 0.3, 3),
        lambda: FLy(2.5, 0.3, 3),
        lambda: FLy(2, -0.1, 3),
        lambda: FLy(2, float("nan"), 3),
        lambda: FLy(2, True, 3),
        lambda: FLy(2, 0.3, 0),
        lambda: FLy(2, 0.3, False),
        lambda: FLy(2, 0.3, 3, greedy=1),
    ],
)
def test_bad_parameters(make):
    with pytest.raises(RelaxSpecError):
        make()


def test_topk_delta_set_with_ties():
    p = torch.tensor([0.375, 0.375, 0.125, 0.0625, 0.0625, 0.0])  # exact in binary: no rounding
    # rank < 1: both tied modes; δ = 0 keeps exactly them.
    assert TopKDelta(1, 0.0).relaxed_set(p).tolist() == [True, True, False, False, False, False]
    # rank < 3 is {0.375, 0.375, 0.125}; p ≥ 0.375 − 0.25 keeps all three (equality counts).
    assert TopKDelta(3, 0.25).relaxed_set(p).tolist() == [True, True, True, False, False, False]
    # rank < 4 adds both tied 0.0625s, but δ = 0.25 cuts them; δ = 1 keeps them, never the zero.
    assert TopKDelta(4, 0.25).relaxed_set(p).tolist() == [True, True, True, False, False, False]
    assert TopKDelta(4, 1.0).relaxed_set(p).tolist() == [True] * 5 + [False]


def test_threshold_set_and_h():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.6, 0.1, 0.2])
    rule = Threshold(0.3, 0.5)
    assert rule.relaxed_set(p).tolist() == [True, True, False, False]
    # off the set: min(1, p/(acc·q)): 0.2/(0.5·0.1) → 1; p = 0 → 0.
    assert rule.h_full(p, q).tolist() == [1.0, 1.0, 1.0, 0.0]
    h = Threshold(0.9, 0.5).h_full(p, q)
    assert h.tolist() == pytest.approx([1.0, 1.0, 1.0, 0.0])
    assert Threshold(0.9, 1.0).h_full(p, q).tolist() == pytest.approx([1.0, 0.5, 1.0, 0.0])


def test_fly_entropy_and_deferral_example():
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    want = -sum(x * math.log(x) for x in (0.4, 0.3, 0.2))
    assert float(fly_entropy(p, 3)) == pytest.approx(want)
    assert float(fly_entropy(p, 99)) == pytest.approx(want - 0.1 * math.log(0.1))
    rule = FLy(window=2, entropy_threshold=0.3, entropy_top_k=3)
    native = torch.tensor([[False, True, True, False], [False, True, False, True], [True, False, True, True]])
    p_draft = p.expand(3, 4, 4)
    p_tok = torch.full((3, 4), 0.2)
    # row 0: position 0 defers (1, 2 accepted); position 3 cannot (window leaves the block).
    # row 1: position 0's window has a rejection. row 2: position 1 defers (2, 3 accepted).
    assert rule.defer(native, p_draft, p_tok).tolist() == [
        [True, True, True, False],
        [False, True, False, True],
        [True, True, True, True],
    ]
    assert rule.defer(native, p_draft, torch.zeros(3, 4)).tolist() == native.tolist()  # p(d) = 0
    assert FLy(2, 2.0, 3).defer(native, p_draft, p_tok).tolist() == native.tolist()  # low entropy
    assert FLy(4, 0.3, 3).defer(native, p_draft, p_tok).tolist() == native.tolist()  # window ≥ K


# ---------------------------------------------------------------------------------------------
# Closed forms and statistics
# ---------------------------------------------------------------------------------------------


def random_pairs(seed: int, rows: int, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dirichlet rows and small-integer rows (ties and zeros) of p and q."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(2):
        x = np.concatenate(
            [rng.dirichlet(np.full(V, 0.5), size=rows), rng.integers(0, 4, size=(rows, V)).astype(float)]
        )
        x[:, 0] += x.sum(-1) == 0
        out.append(torch.from_numpy(x / x.sum(-1, keepdims=True)).float())
    return out[0], out[1]


@pytest.mark.parametrize("rule", PEER_RULES, ids=repr)
def test_closed_form_equals_the_rule_law_and_tv_is_the_excess(rule):
    p, q = random_pairs(3, 200, 7)
    law = emitted_distribution(rule, p, q)  # through the rule's own h
    closed = peer_emitted_law(rule, p, q)  # written from the definition
    assert torch.allclose(law, closed, atol=1e-5)
    assert torch.allclose(total_variation(law, p), peer_excess(rule, p, q), atol=1e-5)
    assert torch.allclose(closed.sum(-1), torch.ones(len(p)), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(LAWS))
@pytest.mark.parametrize("rule", PEER_RULES, ids=repr)
def test_sampled_law_matches_the_closed_form(rule, case):
    p, q = (torch.tensor(x) for x in LAWS[case])
    V = p.numel()
    g = torch.Generator().manual_seed(31)
    tokens = torch.multinomial(q, N_ROWS, replacement=True, generator=g).unsqueeze(-1)
    verdict = verify(rule, tokens, q.expand(N_ROWS, 1, V), p.expand(N_ROWS, 2, V), generator=g)
    counts = torch.bincount(first_emitted(tokens, verdict), minlength=V)
    assert chi2_pvalue(counts, peer_emitted_law(rule, p, q)) > 1e-4


def test_the_sample_size_is_decisive():
    """200k rows tell TopKDelta's law from p where its excess is 0.05 (the ties case)."""
    p, q = (torch.tensor(x) for x in LAWS["ties"])
    rule = TopKDelta(2, 0.0)  # the two tied modes: excess (0.30 − 0.25) on token 1
    assert float(peer_excess(rule, p, q)) == pytest.approx(0.05)
    g = torch.Generator().manual_seed(5)
    tokens = torch.multinomial(q, N_ROWS, replacement=True, generator=g).unsqueeze(-1)
    verdict = verify(rule, tokens, q.expand(N_ROWS, 1, 8), p.expand(N_ROWS, 2, 8), generator=g)
    counts = torch.bincount(first_emitted(tokens, verdict), minlength=8)
    assert chi2_pvalue(counts[:6], p[:6]) < 1e-12


FLY_CASES = {
    # K = 3 over V = 4, position laws differ so an index slip shows up.
    "generic": (
        [[0.4, 0.3, 0.2, 0.1], [0.1, 0.5, 0.3, 0.1], [0.3, 0.3, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25]],
        [[0.1, 0.2, 0.3, 0.4], [0.2, 0.4, 0.2, 0.2], [0.3, 0.2, 0.3, 0.2]],
    ),
    "ties-zeros": (
        [[0.5, 0.25, 0.25, 0.0], [0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.0, 0.5, 0.0]],
        [[0.25, 0.25, 0.25, 0.25], [0.5, 0.25, 0.25, 0.0], [0.4, 0.2, 0.2, 0.2]],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FLY_CASES))
@pytest.mark.parametrize("rule", [FLy(1, 0.3, 3), FLy(2, 0.0, 2), FLy(1, 1.0, 4)], ids=repr)
def test_fly_sampled_block_law_matches_the_enumeration(rule, case):
    p, q = (torch.tensor(x) for x in FLY_CASES[case])
    K, V = q.shape
    law = fly_block_law(rule, p, q)
    g = torch.Generator().manual_seed(17)
    tokens = torch.multinomial(q, N_ROWS, replacement=True, generator=g).T.contiguous()
    verdict = verify(rule, tokens, q.expand(N_ROWS, K, V), p.expand(N_ROWS, K + 1, V), generator=g)
    assert chi2_pvalue(torch.bincount(verdict.accepted, minlength=K + 1), law["accepted"]) > 1e-4
    assert chi2_pvalue(torch.bincount(first_emitted(tokens, verdict), minlength=V), law["first"]) > 1e-4
    # the window is a relaxation: it accepts at least as much as exact SD on the same draws
    assert bool((verdict.accepted >= verdict.exact_accepted).all())


def test_fly_enumeration_is_exact_sd_without_deferral_and_detects_it():
    p, q = (torch.tensor(x) for x in FLY_CASES["generic"])
    never = fly_block_law(FLy(1, math.inf, 3), p, q)
    assert torch.allclose(never["first"], p[0].double(), atol=1e-6)  # lossless
    fly = fly_block_law(FLy(1, 0.0, 3), p, q)
    assert float(total_variation(fly["first"], p[0].double())) > 0.02
    assert float(fly["accepted"][1:].sum()) > float(never["accepted"][1:].sum())


def test_greedy_fly_enumeration_counts_blocks():
    p = torch.tensor([[0.4, 0.35, 0.25], [0.2, 0.7, 0.1], [0.6, 0.2, 0.2]])
    law = fly_block_law(FLy(1, 0.0, 3, greedy=True), p, None)
    # of the 9 blocks (d_1, d_2): d_2 = argmax p_2 = 1 makes any d_1 pass (deferred unless it is
    # argmax p_1 = 0): 3 accept both; (0, ≠1): 2 accept one; (≠0, ≠1): 4 accept none.
    assert law["accepted"].tolist() == [4.0, 2.0, 3.0]
    tokens = torch.tensor([[a, b] for a in range(3) for b in range(3)])
    verdict = verify(FLy(1, 0.0, 3, greedy=True), tokens, None, p.expand(9, 3, 3))
    assert torch.bincount(verdict.accepted, minlength=3).tolist() == [4, 2, 3]


# ---------------------------------------------------------------------------------------------
# Invariants (hypothesis) and exact settings
# ---------------------------------------------------------------------------------------------


@st.composite
def processed_inputs(draw):
    """(tokens, q, p, seed): p with zeros as top-k / top-p processing leaves them."""
    B, K, V = draw(st.integers(1, 6)), draw(st.integers(1, 5)), draw(st.integers(2, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p = rng.dirichlet(np.full(V, 0.7), size=(B, K + 1))
    keep = draw(st.integers(1, V))
    kth = -np.sort(-p, axis=-1)[..., keep - 1 : keep]
    p = np.where(p >= kth, p, 0.0)  # top-k processing: the rest has probability 0
    q = rng.dirichlet(np.full(V, 0.7), size=(B, K))
    cdf = q.cumsum(-1)
    tokens = np.minimum((rng.random((B, K, 1)) * cdf[..., -1:] >= cdf).sum(-1), V - 1)
    to = lambda x: torch.from_numpy(x / x.sum(-1, keepdims=True)).float()  # noqa: E731
    return torch.from_numpy(tokens).long(), to(q), to(p), draw(st.integers(0, 2**31 - 1))


RULE_STRATEGY = st.one_of(
    st.builds(FLy, st.integers(1, 4), st.floats(0.0, 1.5), st.integers(1, 8), st.booleans()),
    st.builds(TopKDelta, st.integers(1, 8), st.floats(0.0, 1.0), greedy=st.booleans()),
    st.builds(Threshold, st.floats(0.01, 1.0), st.floats(0.01, 1.0), greedy=st.booleans()),
)


@settings(max_examples=80, deadline=None)
@given(processed_inputs(), RULE_STRATEGY)
def test_no_rule_emits_a_token_the_processed_target_forbids(inputs, rule):
    tokens, q, p, seed = inputs
    B, K = tokens.shape
    g = torch.Generator().manual_seed(seed)
    verdict = verify(rule, tokens, None if rule.is_greedy else q, p, generator=g)
    rows = torch.arange(B)
    for b in range(B):
        n = int(verdict.accepted[b])
        assert all(float(p[b, i, tokens[b, i]]) > 0 for i in range(n))
        assert float(p[b, n, verdict.next_token[b]]) > 0
    assert bool((verdict.accepted >= verdict.exact_accepted).all())
    assert bool((verdict.accepted <= K).all()) and rows.numel() == B
    again = verify(rule, tokens, None if rule.is_greedy else q, p, torch.Generator().manual_seed(seed))
    assert same(again, verdict)


@settings(max_examples=40, deadline=None)
@given(processed_inputs())
def test_exact_settings_give_exact_and_greedy_verdicts(inputs):
    tokens, q, p, seed = inputs
    for sampling, greedy in (
        (Threshold(1.0, 1.0), Threshold(1.0, 1.0, greedy=True)),
        (FLy(1, math.inf, 3), FLy(1, math.inf, 3, greedy=True)),
        (FLy(tokens.shape[1], 0.0, 3), FLy(tokens.shape[1], 0.0, 3, greedy=True)),  # window ≥ K
    ):
        ours = verify(sampling, tokens, q, p, generator=torch.Generator().manual_seed(seed))
        exact = verify(Exact(), tokens, q, p, generator=torch.Generator().manual_seed(seed))
        assert same(ours, exact)
        assert same(verify(greedy, tokens, None, p), verify(Greedy(), tokens, None, p))
    # δ = 0 keeps the tokens tied with the mode: Greedy where the mode is unique.
    unique = (p[:, :-1] == p[:, :-1].amax(-1, keepdim=True)).sum(-1).eq(1).all(-1)
    if bool(unique.all()):
        assert same(
            verify(TopKDelta(5, 0.0, greedy=True), tokens, None, p), verify(Greedy(), tokens, None, p)
        )


def test_fly_has_no_single_step_law():
    p = torch.tensor([0.5, 0.5])
    with pytest.raises(RelaxSpecError, match="fly_block_law"):
        emitted_distribution(FLy(), p, p)
    with pytest.raises(RelaxSpecError, match="too many"):
        fly_block_law(FLy(), torch.full((9, 8), 0.125), torch.full((8, 8), 0.125))
