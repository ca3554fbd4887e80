"""Tests for relaxspec.theory: NSD identities and sequence-level bounds (docs/design.md §3; NSD App. A)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relaxspec.acceptance import Exact, Gate, Greedy, Lenience, Nucleus, TopK, Typical, nucleus_mask
from relaxspec.errors import RelaxSpecError
from relaxspec.theory import (
    acceptance_rate,
    certified_horizon,
    coupling_bound,
    emitted_distribution,
    excess_in_nucleus,
    position_report,
    rejection_mass,
    total_variation,
)

ATOL = 2e-6
ALL_RULES = [
    Exact(),
    Nucleus(0.5),
    Nucleus(0.9),
    Nucleus(1.0),
    TopK(1),
    TopK(3),
    Typical(),
    Lenience(0.5),
    Greedy(),
    Nucleus(0.7, greedy=True),
    TopK(2, greedy=True),
    Typical(greedy=True),
]


@st.composite
def prob_pairs(draw, rows: int = 4):
    """(p, q), each [rows, V] float32: Dirichlet or small-integer weights (ties and zeros)."""
    V = draw(st.integers(1, 10))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def one(kind: str) -> torch.Tensor:
        if kind == "dirichlet":
            x = rng.dirichlet(np.full(V, rng.choice([0.1, 0.5, 1.0, 3.0])), size=rows)
        else:
            x = rng.integers(0, 4, size=(rows, V)).astype(np.float64)
            x[:, 0] += x.sum(-1) == 0
        return torch.from_numpy(x / x.sum(-1, keepdims=True)).float()

    kinds = st.sampled_from(["dirichlet", "ties"])
    return one(draw(kinds)), one(draw(kinds))


def close(a, b, atol: float = ATOL) -> bool:
    return bool(torch.allclose(torch.as_tensor(a).float(), torch.as_tensor(b).float(), atol=atol, rtol=0))


# ---------------------------------------------------------------------------------------------
# Emitted law
# ---------------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(prob_pairs())
def test_emitted_law_is_a_distribution(pq):
    p, q = pq
    for rule in ALL_RULES:
        e = emitted_distribution(rule, p, q)
        assert e.shape == p.shape
        assert (e >= 0).all() and close(e.sum(-1), torch.ones(p.shape[0]))
        assert not (e[p == 0] > ATOL).any(), f"{rule!r} emits tokens with p = 0"
        a = acceptance_rate(rule, p, q)
        assert ((a >= -ATOL) & (a <= 1 + ATOL)).all()


@settings(max_examples=80, deadline=None)
@given(prob_pairs())
def test_exact_is_lossless_and_greedy_is_argmax(pq):
    p, q = pq
    assert close(emitted_distribution(Exact(), p, q), p)
    assert close(acceptance_rate(Exact(), p, q), 1 - rejection_mass(p, q))
    onehot = torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).float()
    assert torch.equal(emitted_distribution(Greedy(), p, q), onehot)
    assert torch.equal(emitted_distribution(Greedy(), p, None), onehot)


@settings(max_examples=150, deadline=None)
@given(prob_pairs(), st.floats(1e-3, 1.0))
def test_nsd_identities(pq, theta):
    """NSD §3 / App. A.2: acceptance 1 − R + ES, rejection R − ES, TV(e, p) = ES, ES ≤ R."""
    p, q = pq
    rule = Nucleus(theta)
    R = rejection_mass(p, q)
    ES = excess_in_nucleus(p, q, theta)
    e = emitted_distribution(rule, p, q)
    acceptance = acceptance_rate(rule, p, q)
    assert close(acceptance, 1 - R + ES)
    assert close(1 - acceptance, R - ES)
    assert close(total_variation(e, p), ES)
    assert (ES <= R + ATOL).all()
    assert close(R, total_variation(p, q))
    exact_rows = ES == 0
    assert close(e[exact_rows], p[exact_rows])


@settings(max_examples=80, deadline=None)
@given(prob_pairs())
def test_set_rules_error_is_excess_inside_the_set(pq):
    """The NSD identity holds for any accept-outright set S: TV(e, p) = Σ_S (q − p)⁺."""
    p, q = pq
    for rule in (TopK(1), TopK(3), Typical(), Typical(0.3, 1.0), Nucleus(0.6)):
        excess = torch.where(rule.relaxed_set(p), (q - p).clamp_min(0), 0.0).sum(-1)
        assert close(total_variation(emitted_distribution(rule, p, q), p), excess)
        assert close(acceptance_rate(rule, p, q), 1 - rejection_mass(p, q) + excess)


@settings(max_examples=80, deadline=None)
@given(prob_pairs(), st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
def test_zero_excess_means_exact(pq, scale, seed):
    """App. A.3: if q ≤ p on the nucleus (ES = 0), NSD's emitted law is exactly p."""
    p, _ = pq
    theta = 0.7
    member = nucleus_mask(p, theta)
    rng = np.random.default_rng(seed)
    # q = scale·p on the nucleus, the remaining mass spread over tokens outside it.
    outside = torch.from_numpy(rng.random(p.shape)).float() * ~member
    spare = 1 - scale * (p * member).sum(-1, keepdim=True)
    has_outside = outside.sum(-1, keepdim=True) > 0
    q = torch.where(
        has_outside,
        scale * p * member + spare * outside / outside.sum(-1, keepdim=True).clamp_min(1e-12),
        p,
    )
    assert (excess_in_nucleus(p, q, theta) <= ATOL).all()
    assert close(emitted_distribution(Nucleus(theta), p, q), p, atol=1e-5)


@settings(max_examples=80, deadline=None)
@given(prob_pairs())
def test_monotone_in_theta(pq):
    """App. A.3: nested nuclei — ES and acceptance are non-decreasing in θ."""
    p, q = pq
    thetas = [0.05, 0.2, 0.4, 0.5, 0.6, 0.8, 0.95, 1.0]
    ES = torch.stack([excess_in_nucleus(p, q, t) for t in thetas])
    acc = torch.stack([acceptance_rate(Nucleus(t), p, q) for t in thetas])
    assert (ES.diff(dim=0) >= -ATOL).all()
    assert (acc.diff(dim=0) >= -ATOL).all()
    # Lenience: smaller ℓ accepts more.
    len_acc = torch.stack([acceptance_rate(Lenience(ell), p, q) for ell in (1.0, 0.7, 0.4, 0.1)])
    assert (len_acc.diff(dim=0) >= -ATOL).all()
    assert close(len_acc[0], acceptance_rate(Exact(), p, q))


def test_worked_example():
    p = torch.tensor([0.25, 0.25, 0.125, 0.125, 0.125, 0.125, 0.0, 0.0])
    q = torch.tensor([0.05, 0.30, 0.30, 0.05, 0.10, 0.10, 0.10, 0.0])
    assert close(rejection_mass(p, q), 0.325)
    assert close(excess_in_nucleus(p, q, 0.5), 0.05)  # token 1 only
    assert close(excess_in_nucleus(p, q, 0.9), 0.225)  # tokens 1 and 2
    e = emitted_distribution(Nucleus(0.5), p, q)
    # Accepted mass: q on {0, 1}, min(p, q) elsewhere; ρ = R − ES = 0.275 goes to (p − q)⁺.
    residual = torch.tensor([0.2, 0.0, 0.0, 0.075, 0.025, 0.025, 0.0, 0.0]) / 0.325
    a = torch.tensor([0.05, 0.30, 0.125, 0.05, 0.10, 0.10, 0.0, 0.0])
    assert close(e, a + 0.275 * residual)
    # Greedy nucleus: a = q on N ∪ {argmax}, the rest goes to argmax p (token 0).
    eg = emitted_distribution(Nucleus(0.5, greedy=True), p, q)
    assert close(eg, torch.tensor([0.70, 0.30, 0, 0, 0, 0, 0, 0]))


def test_gate_has_no_emitted_law():
    p = torch.tensor([0.5, 0.5])
    with pytest.raises(RelaxSpecError, match="Gate has no emitted law"):
        emitted_distribution(Gate(0.1), p, p)
    with pytest.raises(RelaxSpecError, match="Gate"):
        acceptance_rate(Gate(0.1), p, p)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: rejection_mass(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0, 0.0])), "same shape"),
        (lambda: rejection_mass(torch.tensor([float("nan"), 1.0]), torch.tensor([0.5, 0.5])), "NaN or Inf"),
        (lambda: rejection_mass(torch.tensor([1.5, -0.5]), torch.tensor([0.5, 0.5])), "negative"),
        (lambda: rejection_mass(torch.tensor([2.0, 3.0]), torch.tensor([0.5, 0.5])), "sum"),
        (lambda: excess_in_nucleus(torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5]), 0.0), "theta"),
        (lambda: emitted_distribution(Exact(), torch.tensor([0.5, 0.5]), None), "needs the proposal"),
        (lambda: emitted_distribution("nsd", torch.tensor([0.5, 0.5]), None), "rule"),
        (lambda: total_variation(torch.tensor([0.5, 0.5]), torch.tensor([1.0])), "same shape"),
        (lambda: position_report(torch.ones(3, 2) / 2, torch.ones(3, 2) / 2, 1.5), "theta"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(RelaxSpecError, match=message):
        call()


# ---------------------------------------------------------------------------------------------
# Sequence level
# ---------------------------------------------------------------------------------------------


def test_coupling_bound():
    assert coupling_bound([1e-3] * 32) == pytest.approx(0.9685, abs=5e-5)  # NSD §3 example
    assert coupling_bound([1e-3] * 32) == pytest.approx(0.999**32)
    assert coupling_bound([]) == 1.0
    assert coupling_bound(torch.tensor([0.1, 0.2])) == pytest.approx(0.72)
    assert coupling_bound([0.0, 1.0]) == 0.0
    for bad in ([0.1, -0.1], [1.1], [float("nan")]):
        with pytest.raises(RelaxSpecError, match="eps"):
            coupling_bound(bad)


def test_certified_horizon_examples():
    assert certified_horizon(1e-3, 1 - 0.999**32) == 32
    assert certified_horizon(1e-3, 0.05) == math.floor(math.log(0.95) / math.log(0.999))  # 51
    assert certified_horizon(0.5, 0.75) == 2  # (1/2)^2 = 1 − 0.75 exactly
    assert certified_horizon(0.5, 0.7) == 1
    assert certified_horizon(0.0, 0.1) == math.inf
    assert certified_horizon(0.1, 1.0) == math.inf
    assert certified_horizon(1.0, 0.5) == 0
    assert certified_horizon(0.1, 0.0) == 0
    for eps, delta in ((-0.1, 0.5), (1.5, 0.5), (0.1, -0.2), (0.1, 2.0), (float("nan"), 0.5)):
        with pytest.raises(RelaxSpecError):
            certified_horizon(eps, delta)


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-6, 0.999), st.floats(1e-6, 0.999))
def test_certified_horizon_is_the_largest_certified_length(eps, delta):
    T = certified_horizon(eps, delta)
    assert isinstance(T, int) and T >= 0
    assert coupling_bound([eps] * T) >= (1 - delta) * (1 - 1e-9)
    assert (1 - eps) ** (T + 1) < 1 - delta


def test_position_report():
    rng = np.random.default_rng(3)
    p = torch.from_numpy(rng.dirichlet(np.ones(12) * 0.5, size=7)).float()
    q = torch.from_numpy(rng.dirichlet(np.ones(12) * 0.5, size=7)).float()
    report = position_report(p, q, 0.9)
    assert set(report) == {
        "rejection_mass",
        "excess_in_nucleus",
        "total_variation",
        "sd_acceptance",
        "nsd_acceptance",
        "nucleus_size",
    }
    assert all(v.shape == (7,) for v in report.values())
    assert close(report["total_variation"], report["excess_in_nucleus"])
    assert close(report["sd_acceptance"], 1 - report["rejection_mass"])
    assert close(report["nsd_acceptance"], report["sd_acceptance"] + report["excess_in_nucleus"])
    assert (report["nucleus_size"] >= 1).all()
