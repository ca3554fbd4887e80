"""Tests for relaxspec.acceptance: rules, nucleus membership, verify (docs/design.md §2)."""

from __future__ import annotations

import itertools
import os
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relaxspec.acceptance import (
    Exact,
    Gate,
    Greedy,
    Lenience,
    Nucleus,
    TopK,
    Typical,
    Verdict,
    nucleus_mask,
    residual_distribution,
    verify,
    verify_greedy,
    verify_unchecked,
)
from relaxspec.core.peer_rules import FLy, Threshold, TopKDelta
from relaxspec.core.relaxed_sets import nucleus_member_unchecked
from relaxspec.errors import RelaxSpecError
from relaxspec.testing import LAW_CASES
from relaxspec.testing import law_chi2_pvalue as chi2_pvalue
from relaxspec.theory import emitted_distribution


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small-tensor ops are dominated by thread sync on shared CPUs; one thread is much faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SAMPLING_RULES = [Exact(), Nucleus(0.5), Nucleus(0.9), TopK(2), Typical(), Lenience(0.5)]
GREEDY_RULES = [Greedy(), Nucleus(0.5, greedy=True), TopK(2, greedy=True), Typical(greedy=True)]
ALL_RULES = [*SAMPLING_RULES, *GREEDY_RULES, Gate(0.0), Gate(0.05), Gate(1.5)]


# ---------------------------------------------------------------------------------------------
# Random distributions: Dirichlet (continuous) and small-integer weights (ties and zeros)
# ---------------------------------------------------------------------------------------------


def random_probs(rng: np.random.Generator, shape: tuple[int, ...], kind: str) -> torch.Tensor:
    """Probabilities of the given shape [..., V], normalised over the last dim, float32."""
    if kind == "dirichlet":
        x = rng.dirichlet(np.full(shape[-1], rng.choice([0.2, 1.0, 5.0])), size=shape[:-1])
    else:
        x = rng.integers(0, 4, size=shape).astype(np.float64)
        x[..., 0] += x.sum(-1) == 0
    x = x / x.sum(-1, keepdims=True)
    return torch.from_numpy(x).float()


@st.composite
def verify_inputs(draw):
    """(tokens [B,K], q [B,K,V], p [B,K+1,V], rng seed) with drafts sampled from q or arbitrary."""
    B, K, V = draw(st.integers(1, 4)), draw(st.integers(0, 4)), draw(st.integers(1, 6))
    kind = draw(st.sampled_from(["dirichlet", "ties"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p = random_probs(rng, (B, K + 1, V), kind)
    q = random_probs(rng, (B, K, V), draw(st.sampled_from(["dirichlet", "ties"])))
    if draw(st.booleans()):
        cdf = q.double().cumsum(-1).numpy()
        u = rng.random((B, K, 1)) * cdf[..., -1:]
        tokens = torch.from_numpy((u >= cdf).sum(-1)).clamp(max=V - 1)
    else:  # arbitrary tokens, possibly with q(d) = 0 or p(d) = 0
        tokens = torch.from_numpy(rng.integers(0, V, size=(B, K)))
    return tokens.long(), q, p, draw(st.integers(0, 2**31 - 1))


def prefix_length(mask: torch.Tensor) -> torch.Tensor:
    return mask.long().cumprod(-1).sum(-1)


# ---------------------------------------------------------------------------------------------
# Rule parameters
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: Nucleus(0.0),
        lambda: Nucleus(1.5),
        lambda: Nucleus(float("nan")),
        lambda: Nucleus(-0.1),
        lambda: Nucleus(0.5, greedy="yes"),
        lambda: TopK(0),
        lambda: TopK(2.5),
        lambda: TopK(True),
        lambda: Typical(epsilon=0.0),
        lambda: Typical(epsilon=1.2),
        lambda: Typical(delta=0.0),
        lambda: Typical(delta=float("inf")),
        lambda: Lenience(0.0),
        lambda: Lenience(1.01),
        lambda: Gate(-0.1),
        lambda: Gate(float("nan")),
    ],
)
def test_bad_rule_parameters(make):
    with pytest.raises(RelaxSpecError):
        make()


def test_rule_properties():
    assert Exact().needs_draft_probs and Exact().needs_full_draft_probs and not Exact().is_greedy
    assert Greedy().is_greedy and not Greedy().needs_draft_probs
    assert Nucleus(0.9, greedy=True).is_greedy and not Nucleus(0.9, greedy=True).needs_draft_probs
    assert Gate(0.1).needs_draft_probs and not Gate(0.1).needs_full_draft_probs
    assert Typical() == Typical(0.09, 0.3)
    assert Gate(2.0).theta == 2.0  # θ > 1 is allowed


def test_acceptance_function_values():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.25, 0.6, 0.0, 0.15])
    torch.testing.assert_close(Exact().h_full(p, q), torch.tensor([1.0, 0.5, 1.0, 0.0]))
    torch.testing.assert_close(Lenience(0.5).h_full(p, q), torch.tensor([1.0, 1.0, 1.0, 0.0]))
    # N_0.6 = {0, 1}: mass strictly above token 1 is 0.5 < 0.6.
    torch.testing.assert_close(Nucleus(0.6).h_full(p, q), torch.tensor([1.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(Greedy().h_full(p, None), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    h = Exact().acceptance_prob(torch.tensor([1, 3]), torch.tensor([0.6, 0.15]), p.expand(2, 4))
    torch.testing.assert_close(h, torch.tensor([0.5, 0.0]))


def test_h_has_no_nan_when_q_is_zero():
    p = torch.tensor([0.0, 1.0, 0.0])
    q = torch.tensor([0.0, 0.0, 1.0])
    for rule in SAMPLING_RULES:
        h = rule.h_full(p, q)
        assert torch.isfinite(h).all() and ((h >= 0) & (h <= 1)).all()
        assert h[1] == 1.0  # q = 0 < p: ratio +inf → 1
        assert h[0] == 0.0 and h[2] == 0.0  # p = 0: never accepted, even where q = 0


# ---------------------------------------------------------------------------------------------
# Nucleus membership
# ---------------------------------------------------------------------------------------------


def brute_nucleus(p: torch.Tensor, theta: float) -> torch.Tensor:
    """O(V²) reference in exact rational arithmetic: p(x) > 0 and Σ_{p(y) > p(x)} p(y) < θ.

    p: [R, V] -> [R, V] bool.
    """
    bound = Fraction(theta)
    rows = []
    for row in p.tolist():
        above = [sum((Fraction(y) for y in row if y > x), Fraction(0)) for x in row]
        rows.append([x > 0 and (a < bound or theta >= 1.0) for x, a in zip(row, above, strict=True)])
    return torch.tensor(rows, dtype=torch.bool)


def test_nucleus_mask_examples():
    p = torch.tensor([0.25, 0.25, 0.125, 0.125, 0.125, 0.125, 0.0, 0.0])
    assert nucleus_mask(p, 0.5).tolist() == [True, True] + [False] * 6
    # 0.5 < θ: the whole tie group at 0.125 is in, even though two of them would reach 0.75.
    assert nucleus_mask(p, 0.51).tolist() == [True] * 6 + [False] * 2
    assert nucleus_mask(p, 0.01).tolist() == [True, True] + [False] * 6  # top tie group
    assert nucleus_mask(p, 1.0).tolist() == [True] * 6 + [False] * 2
    uniform = torch.full((5,), 0.2)
    assert nucleus_mask(uniform, 1e-6).all()
    batched = torch.stack([p, p.flip(0)]).unsqueeze(0)  # [1, 2, 8]
    assert nucleus_mask(batched, 0.5).shape == (1, 2, 8)
    assert nucleus_mask(batched, 0.5)[0, 1].tolist() == [False] * 6 + [True, True]


def test_property_tests_are_derandomised():
    """conftest loads the "ci" profile: every run draws the same examples (issue 36)."""
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci":
        assert settings.default.derandomize and settings.default.database is None
        assert settings.default.deadline is None


def test_nucleus_mask_exact_near_theta_one():
    """Regression (issue 36): at θ = 1 − 2⁻⁵³ a float32 mass-above sum rounded to either side of θ
    depending on the summation order, so the mask dropped a token whose exact mass above is < θ
    (and kept one whose mass above is ≥ θ). Rows drawn by `random_probs(default_rng(11|49), (3, 4))`.
    """
    theta = 0.9999999999999999
    p = torch.tensor(
        [
            [0.029382744804024696, 1.8405961199619014e-08, 0.9705823659896851, 3.485928027657792e-05],
            [0.4376457631587982, 0.5622507929801941, 2.7573365812827433e-09, 0.00010342409950681031],
            [1.5e-2, 0.985, 2.1e-8, 1.1e-11],
        ]
    )
    mask = nucleus_mask(p, theta)
    assert torch.equal(mask, brute_nucleus(p, theta))
    # Rows 0 and 1: the exact mass above the smallest token is just below 1, so every token is a
    # member. Row 2: float32(0.985) + float32(0.015) exceeds 1, so the two small tokens are not.
    assert mask.tolist() == [[True] * 4, [True] * 4, [True, True, False, False]]
    # The float64 path is what a float64 input sees too: same answer.
    assert torch.equal(nucleus_mask(p.double(), theta), mask)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 9),
    st.sampled_from(["dirichlet", "ties"]),
    st.floats(1e-4, 1.0),
    st.integers(0, 2**32 - 1),
)
def test_nucleus_mask_properties(V, kind, theta, seed):
    rng = np.random.default_rng(seed)
    p = random_probs(rng, (3, V), kind)
    mask = nucleus_mask(p, theta)
    assert torch.equal(mask, brute_nucleus(p, theta))
    for token in range(V):  # membership at one token (one pass, no sort): the set's answer
        assert torch.equal(nucleus_member_unchecked(p, torch.full((3,), token), theta), mask[:, token])
    assert mask[torch.arange(3), p.argmax(-1)].all()  # top token always a member
    assert not (mask & (p == 0)).any()  # zero-probability tokens never
    assert torch.equal(nucleus_mask(p, 1.0), p > 0)
    # Tie-inclusive: equal probabilities have equal membership.
    ties = p.unsqueeze(-1) == p.unsqueeze(-2)
    assert (~ties | (mask.unsqueeze(-1) == mask.unsqueeze(-2))).all()
    # Order-free: permuting the vocabulary permutes the mask.
    perm = torch.from_numpy(rng.permutation(V))
    assert torch.equal(nucleus_mask(p[:, perm], theta), mask[:, perm])
    # Nested in θ.
    assert (mask <= nucleus_mask(p, min(1.0, theta + 0.1))).all()


def test_topk_and_typical_sets():
    p = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1, 0.0])
    assert TopK(1).relaxed_set(p).tolist() == [True, True, False, False, False, False]
    assert TopK(3).relaxed_set(p).tolist() == [True, True, True, False, False, False]
    assert TopK(4).relaxed_set(p).tolist() == [True, True, True, True, True, False]
    assert TopK(100).relaxed_set(p).tolist() == [True] * 5 + [False]
    entropy = -(p[p > 0] * p[p > 0].log()).sum()
    threshold = min(0.15, 0.3 * float(torch.exp(-entropy)))
    assert Typical(0.15, 0.3).relaxed_set(p).tolist() == (p >= threshold).tolist()
    assert Typical(1e-3, 5.0).relaxed_set(p).tolist() == [True] * 5 + [False]


# ---------------------------------------------------------------------------------------------
# Statistical: empirical emitted law == closed form (docs/design.md §3), one vectorised call per case
# ---------------------------------------------------------------------------------------------

N_ROWS = 200_000
LAWS = LAW_CASES
# Laws for positions 2.. so that an indexing mistake shows up in the position-1 marginal.
OTHER_P = [0.05, 0.05, 0.1, 0.1, 0.2, 0.2, 0.15, 0.15]
OTHER_Q = [0.4, 0.05, 0.05, 0.1, 0.1, 0.1, 0.1, 0.1]


def emitted_tokens(tokens: torch.Tensor, verdict: Verdict, position: int) -> torch.Tensor:
    """Token emitted at block position `position` (0-based) for rows that reached it."""
    return torch.where(verdict.accepted > position, tokens[:, position], verdict.next_token)


@pytest.mark.slow
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("case", sorted(LAWS))
@pytest.mark.parametrize("rule", SAMPLING_RULES + GREEDY_RULES, ids=repr)
def test_emitted_law_matches_closed_form(rule, case, K):
    p1, q1 = (torch.tensor(x) for x in LAWS[case])
    other_p, other_q = torch.tensor(OTHER_P), torch.tensor(OTHER_Q)
    V = p1.numel()
    P = torch.stack([p1, other_p, p1.flip(0), other_p][: K + 1])  # [K+1, V]
    Q = torch.stack([q1, other_q, q1.flip(0)][:K])  # [K, V]
    n = N_ROWS
    g = torch.Generator().manual_seed(20240917)
    tokens = torch.multinomial(Q, n, replacement=True, generator=g).T.contiguous()  # [n, K]
    draft_probs = None if rule.is_greedy else Q.expand(n, K, V)
    verdict = verify(rule, tokens, draft_probs, P.expand(n, K + 1, V), generator=g)
    first = emitted_tokens(tokens, verdict, 0)
    counts = torch.bincount(first, minlength=V)
    assert chi2_pvalue(counts, emitted_distribution(rule, p1, q1)) > 1e-4
    if isinstance(rule, Exact):
        assert chi2_pvalue(counts, p1) > 1e-4  # lossless
    if K == 3:
        # Given position 1 was accepted, position 2 is an independent single step on (p_2, q_2).
        reached = verdict.accepted >= 1
        sub = Verdict(verdict.accepted[reached], verdict.next_token[reached])
        second = emitted_tokens(tokens[reached], sub, 1)
        law2 = emitted_distribution(rule, other_p, other_q)
        assert chi2_pvalue(torch.bincount(second, minlength=V), law2) > 1e-4


def test_chi_square_is_decisive():
    """The sample size detects NSD's deviation from p (TV = ES = 0.05 on the tie case)."""
    p, q = (torch.tensor(x) for x in LAWS["ties"])
    g = torch.Generator().manual_seed(7)
    tokens = torch.multinomial(q, N_ROWS, replacement=True, generator=g).unsqueeze(-1)
    verdict = verify(Nucleus(0.5), tokens, q.expand(N_ROWS, 1, 8), p.expand(N_ROWS, 2, 8), generator=g)
    counts = torch.bincount(emitted_tokens(tokens, verdict, 0), minlength=8)
    assert chi2_pvalue(counts[:6], p[:6]) < 1e-12


# ---------------------------------------------------------------------------------------------
# verify invariants
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(verify_inputs())
def test_verify_invariants(inputs):
    tokens, q, p, seed = inputs
    B, K = tokens.shape
    rows = torch.arange(B)
    for rule in ALL_RULES:
        draft_probs = None if rule.is_greedy else q
        v = verify(rule, tokens, draft_probs, p, generator=torch.Generator().manual_seed(seed))
        assert v.accepted.dtype == torch.long and v.accepted.shape == (B,)
        assert v.next_token.dtype == torch.long and v.next_token.shape == (B,)
        assert ((v.accepted >= 0) & (v.accepted <= K)).all()
        assert v.accept_mask.shape == (B, K) and v.accept_mask.dtype == torch.bool
        assert torch.equal(v.accepted, prefix_length(v.accept_mask))
        if isinstance(rule, Gate):
            assert (v.next_token == -1).all()
            continue
        assert ((v.next_token >= 0) & (v.next_token < p.shape[-1])).all()
        assert (p[rows, v.accepted, v.next_token] > 0).all()
        committed = torch.arange(K) < v.accepted.unsqueeze(-1)
        p_tok = p[:, :K].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        assert (p_tok[committed] > 0).all(), "accepted a token the target gives probability 0"
        if rule.is_greedy:
            assert torch.equal(v.next_token, p.argmax(-1)[rows, v.accepted])
        if isinstance(rule, Exact | Greedy):
            assert torch.equal(v.exact_accepted, v.accepted)
        else:
            assert (v.exact_accepted <= v.accepted).all()
        again = verify(rule, tokens, draft_probs, p, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(again.accepted, v.accepted) and torch.equal(again.next_token, v.next_token)
        assert torch.equal(again.accept_mask, v.accept_mask)


GREEDY_PEERS = [
    Lenience(0.5, greedy=True),
    TopKDelta(2, 0.3, greedy=True),
    Threshold(0.2, 1.0, greedy=True),
    FLy(1, 0.0, 3, greedy=True),
]


@settings(max_examples=60, deadline=None)
@given(verify_inputs())
def test_greedy_verdict_reads_target_laws_only_where_a_draft_is_not_the_argmax(inputs):
    """``verify_greedy`` = the definition (accept iff the draft is in the rule's accept set,
    next token the argmax), asking for target laws only at positions whose draft is not the
    argmax — never for a rule without a relaxed set — except for FLy, which reads the block."""
    tokens, _, p, _ = inputs
    K = tokens.shape[1]
    top = p.argmax(-1)
    for rule in GREEDY_RULES + GREEDY_PEERS:
        asked = []

        def laws(at, asked=asked):
            asked.append(at.clone())
            return p[:, :K][at]

        v = verify_greedy(rule, tokens, top, laws)
        in_set = rule.accept_set(p[:, :K]).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        if not rule.reads_block:
            assert torch.equal(v.accept_mask, in_set)
        assert torch.equal(v.accepted, prefix_length(v.accept_mask))
        assert torch.equal(v.next_token, top.gather(-1, v.accepted.unsqueeze(-1)).squeeze(-1))
        assert torch.equal(v.exact_accepted, prefix_length(tokens == top[:, :K]))
        reference = verify_unchecked(rule, tokens, None, p)
        assert torch.equal(v.accept_mask, reference.accept_mask)
        miss = tokens != top[:, :K]
        if rule.reads_block:
            assert len(asked) == 1 and asked[0].all()
        elif rule.relaxes and bool(miss.any()):
            assert len(asked) == 1 and torch.equal(asked[0], miss)
        else:
            assert asked == []


@settings(max_examples=40, deadline=None)
@given(verify_inputs())
def test_greedy_accepts_argmax_drafts(inputs):
    _, _, p, _ = inputs
    K = p.shape[1] - 1
    tokens = p[:, :K].argmax(-1)
    for rule in GREEDY_RULES:
        v = verify(rule, tokens, None, p)
        assert (v.accepted == K).all()
        assert torch.equal(v.next_token, p[:, K].argmax(-1))
        assert v.accept_mask.all()


@settings(max_examples=40, deadline=None)
@given(verify_inputs())
def test_gate_thresholds(inputs):
    tokens, q, p, _ = inputs
    K = tokens.shape[1]
    q_tok = q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    for draft_probs in (q, q_tok):
        assert (verify(Gate(0.0), tokens, draft_probs, p).accepted == K).all()
        assert (verify(Gate(1.5), tokens, draft_probs, p).accepted == min(K, 1)).all()
        theta = 0.05
        v = verify(Gate(theta), tokens, draft_probs, p)
        score = q_tok * p[:, :K].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        expected = score >= theta
        expected[:, :1] = True
        assert torch.equal(v.accepted, prefix_length(expected))


def test_greedy_example():
    p = torch.tensor([[[0.1, 0.6, 0.3], [0.5, 0.2, 0.3], [0.2, 0.2, 0.6]]])
    tokens = torch.tensor([[1, 2]])
    v = verify(Greedy(), tokens, None, p)
    assert v.accepted.tolist() == [1] and v.next_token.tolist() == [0]
    # Ties break to the lowest id: argmax of [0.2, 0.2, 0.6] is 2, of [0.4, 0.4, 0.2] is 0.
    p2 = torch.tensor([[[0.4, 0.4, 0.2], [0.4, 0.4, 0.2]]])
    v2 = verify(Greedy(), torch.tensor([[1]]), None, p2)
    assert v2.accepted.tolist() == [0] and v2.next_token.tolist() == [0]
    # The nucleus variant accepts the tied runner-up, then the bonus is argmax p_2.
    v3 = verify(Nucleus(0.9, greedy=True), torch.tensor([[1]]), None, p2)
    assert v3.accepted.tolist() == [1] and v3.next_token.tolist() == [0]
    assert v3.exact_accepted.tolist() == [0]


def test_exact_recovery_uses_residual():
    # q puts everything on token 0 where p has 0.2: acceptance 0.2, residual = p on {1, 2} renormalised.
    p = torch.tensor([0.2, 0.5, 0.3]).expand(4000, 2, 3)
    q = torch.tensor([1.0, 0.0, 0.0]).expand(4000, 1, 3)
    tokens = torch.zeros(4000, 1, dtype=torch.long)
    v = verify(Exact(), tokens, q, p, generator=torch.Generator().manual_seed(0))
    rejected = v.accepted == 0
    assert abs(float(rejected.double().mean()) - 0.8) < 0.03
    assert (v.next_token[rejected] != 0).all()
    bonus = v.next_token[~rejected]
    assert set(bonus.tolist()) <= {0, 1, 2}


def test_residual_distribution_fallback():
    p = torch.tensor([0.5, 0.5])
    torch.testing.assert_close(residual_distribution(p, p, torch.ones(2)), p)
    torch.testing.assert_close(
        residual_distribution(torch.tensor([0.2, 0.8]), torch.tensor([1.0, 0.0]), torch.tensor([0.2, 1.0])),
        torch.tensor([0.0, 1.0]),
    )


def test_zero_draft_positions():
    p = torch.tensor([[[0.0, 1.0]]])
    for rule in (Exact(), Greedy(), Gate(0.5)):
        v = verify(rule, torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, 2), p)
        assert v.accepted.tolist() == [0]
        assert v.next_token.tolist() == ([-1] if isinstance(rule, Gate) else [1])


def test_verdict_construction_and_unpacking():
    v = Verdict(accepted=torch.tensor([1]), next_token=torch.tensor([2]))
    accepted, next_token = v
    assert accepted.tolist() == [1] and next_token.tolist() == [2]
    assert v.accept_mask is None and v.exact_accepted is None


def test_generator_reproducible_and_seed_sensitive():
    rng = np.random.default_rng(0)
    p = random_probs(rng, (512, 5, 6), "dirichlet")
    q = random_probs(rng, (512, 4, 6), "dirichlet")
    tokens = torch.from_numpy(rng.integers(0, 6, size=(512, 4)))
    runs = [verify(Nucleus(0.8), tokens, q, p, generator=torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert torch.equal(runs[0].accepted, runs[1].accepted)
    assert torch.equal(runs[0].next_token, runs[1].next_token)
    assert not torch.equal(runs[0].next_token, runs[2].next_token)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


def _good():
    p = torch.full((2, 3, 4), 0.25)
    q = torch.full((2, 2, 4), 0.25)
    return torch.zeros(2, 2, dtype=torch.long), q, p


def _with(x: torch.Tensor, index, value) -> torch.Tensor:
    x = x.clone()
    x[index] = value
    return x


BAD_VERIFY = {
    "nan target": (Exact(), "d", "q", lambda p: _with(p, (0, 0, 0), float("nan")), "NaN or Inf"),
    "inf draft": (Exact(), "d", lambda q: _with(q, (0, 0, 0), float("inf")), "p", "NaN or Inf"),
    "negative": (Exact(), "d", "q", lambda p: _with(p, (0, 0, 0), -0.25), "negative"),
    "logits": (Exact(), "d", "q", lambda p: p * 3, "sum"),
    "none for exact": (Exact(), "d", None, "p", "needs draft_probs"),
    "none for gate": (Gate(0.1), "d", None, "p", "needs draft_probs"),
    "token-only q for nucleus": (Nucleus(0.9), "d", lambda q: q[..., 0], "p", "[B, K, V]"),
    "target K mismatch": (Exact(), "d", "q", lambda p: p[:, :2], "K+1"),
    "batch mismatch": (Exact(), "d", "q", lambda p: p[:1], "K+1"),
    "vocab mismatch": (Exact(), "d", lambda q: torch.full((2, 2, 5), 0.2), "p", "[B, K, V]"),
    "token out of range": (Exact(), lambda d: d + 4, "q", "p", "token ids"),
    "negative token": (Exact(), lambda d: d - 1, "q", "p", "token ids"),
    "float tokens": (Exact(), lambda d: d.float(), "q", "p", "integer"),
    "1-d tokens": (Exact(), lambda d: d[0], "q", "p", "[B, K]"),
    "int target": (Exact(), "d", "q", lambda p: p.long(), "floating"),
    "not a rule": ("exact", "d", "q", "p", "rule"),
    "gate q > 1": (Gate(0.1), "d", lambda q: q[..., 0] * 8, "p", "greater than 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_VERIFY))
def test_verify_bad_input(case):
    rule, make_d, make_q, make_p, message = BAD_VERIFY[case]
    d, q, p = _good()

    def build(make, x):
        return make(x) if callable(make) else (None if make is None else x)

    with pytest.raises(RelaxSpecError, match=message.replace("[", r"\[").replace("+", r"\+")):
        verify(rule, build(make_d, d), build(make_q, q), build(make_p, p))


def test_nucleus_mask_bad_input():
    with pytest.raises(RelaxSpecError, match="theta"):
        nucleus_mask(torch.tensor([1.0]), 0.0)
    with pytest.raises(RelaxSpecError, match="NaN or Inf"):
        nucleus_mask(torch.tensor([float("nan"), 1.0]), 0.5)
    with pytest.raises(RelaxSpecError, match="floating"):
        nucleus_mask(torch.tensor([1, 0]), 0.5)


def test_rule_combinations_smoke():
    """Every rule × draft_probs layout that the API allows runs on a batch of one."""
    d, q, p = _good()
    for rule, layout in itertools.product(ALL_RULES, ("full", "token", "none")):
        draft_probs = {"full": q, "token": q[..., 0], "none": None}[layout]
        missing = layout == "none" and rule.needs_draft_probs
        if missing or (layout == "token" and rule.needs_full_draft_probs):
            with pytest.raises(RelaxSpecError):
                verify(rule, d, draft_probs, p)
        else:
            assert verify(rule, d, draft_probs, p).accepted.shape == (2,)


@pytest.mark.parametrize("vocab", [600, 4096])
@given(scale=st.floats(0.5, 12.0), theta=st.floats(0.05, 0.999), seed=st.integers(0, 10_000))
@settings(max_examples=40, deadline=None)
def test_nucleus_from_the_top_values_equals_the_full_sort(vocab, scale, theta, seed):
    """The nucleus is searched in the top 64 / 512 values before a full sort: same mask as the
    definition computed over the fully sorted vocabulary, for small and large nuclei and ties."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(3, vocab, generator=gen) * scale, dim=-1)
    p[1] = torch.round(p[1] / p[1].max() * 20)  # few distinct values: ties at the boundary
    p[1] /= p[1].sum()
    sorted_p = p.sort(dim=-1, descending=True).values
    before = torch.cat([torch.zeros_like(sorted_p[..., :1]), sorted_p.cumsum(-1)[..., :-1]], dim=-1)
    threshold = sorted_p.gather(-1, (before < theta).sum(-1, keepdim=True) - 1)
    assert torch.equal(nucleus_mask(p, theta), (p >= threshold) & (p > 0))


def test_nsd_rule_takes_the_regimes_default_theta_where_none_is_given():
    from relaxspec.core.acceptance import NSD_DEFAULT_THETA, nsd_rule
    from relaxspec.methods import resolve_params

    assert nsd_rule(None, greedy=True) == Nucleus(NSD_DEFAULT_THETA["greedy"], greedy=True)
    assert nsd_rule(None, greedy=False) == Nucleus(NSD_DEFAULT_THETA["sampling"])
    assert nsd_rule(0.9, greedy=True) == Nucleus(0.9, greedy=True)
    assert all(0 < theta <= 1 for theta in NSD_DEFAULT_THETA.values())
    assert resolve_params("nsd", {})["theta"] is None  # the engine resolves it per request's regime
    with pytest.raises(RelaxSpecError):
        resolve_params("nsd", {"theta": 1.5})


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 5),
    vocab=st.integers(1, 300),
    scale=st.sampled_from([0.0, 0.5, 3.0, 30.0]),  # 0: every logit tied
    top_p=st.floats(0.01, 0.999),
    seed=st.integers(0, 2**31 - 1),
)
def test_top_p_keeps_what_the_full_sort_keeps(rows, vocab, scale, top_p, seed):
    from relaxspec.core.sampling import top_p_drop

    # coarse logits make ties common: the kept set may differ among tied tokens, never in size or mass
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax((torch.randn(rows, vocab, generator=g) * scale).round(decimals=1), dim=-1)
    drop = top_p_drop(probs, top_p)
    ordered, _ = torch.sort(probs, dim=-1, descending=True)
    kept = torch.cumsum(ordered, dim=-1) - ordered < top_p  # the definition over a full sort
    assert torch.equal((~drop).sum(-1), kept.sum(-1))
    assert torch.allclose(probs.masked_fill(drop, 0).sum(-1), (ordered * kept).sum(-1), rtol=0, atol=1e-6)
    lowest_kept = probs.masked_fill(drop, 2.0).min(-1).values
    assert bool((probs.masked_fill(~drop, -1.0).max(-1).values <= lowest_kept).all())  # the highest are kept
