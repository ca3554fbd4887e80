"""Schedulers on hand-made confidence vectors: k_min, s_max, local and signal gates, each signal."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from relaxspec.engine.proposers.base import Proposal
from relaxspec.engine.schedulers import ConfidenceSkip, Periodic, RawConfidence, SchedulerState, Strict
from relaxspec.engine.survival import (
    SCALAR_FEATURES,
    ConditionalSurvival,
    MarginalSurvival,
    SurvivalConfig,
    SurvivalPredictor,
)
from relaxspec.errors import RelaxSpecError

H = 4


def proposal(conf: list[float]) -> Proposal:
    K = len(conf)
    c = torch.tensor([conf])
    features = {
        "hidden": torch.zeros(1, K, H),
        "confidence": c,
        "entropy": torch.zeros(1, K),
        "margin": c,
        "position": torch.arange(1, K + 1, dtype=torch.float32)[None],
        "reveal_step": torch.zeros(1, K),
        "steps": torch.ones(1, K),
        "block_length": torch.full((1, K), float(K)),
    }
    return Proposal(tokens=torch.arange(K)[None], probs=None, confidence=c, features=features)


class Fixed(nn.Module):
    """An 'MLP' that outputs the given per-position probabilities whatever its input."""

    def __init__(self, probs: list[float]) -> None:
        super().__init__()
        self.logits = torch.logit(torch.tensor(probs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits[: x.shape[0]]


def predictor(**kinds: list[float]) -> SurvivalPredictor:
    config = SurvivalConfig(hidden_size=H)
    dim = H + len(SCALAR_FEATURES)
    return SurvivalPredictor(
        config, {k: Fixed(v) for k, v in kinds.items()}, torch.zeros(dim), torch.ones(dim)
    )


class Scores:
    """A signal with fixed prefix scores."""

    name = "fixed"

    def __init__(self, scores: list[float]) -> None:
        self.scores = torch.tensor(scores)

    def prefix_scores(self, proposal: Proposal) -> torch.Tensor:
        return self.scores


HIGH8 = [0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.5, 0.99]

# (name, scheduler, confidences, unverified run, expected skip length)
TABLE = [
    ("prefix of 6 passes tau 0.9", ConfidenceSkip(0.9), HIGH8, 0, 6),
    ("k_min 7 > feasible 6: strict", ConfidenceSkip(0.9, k_min=7), HIGH8, 0, 0),
    ("k_min 6 == feasible 6", ConfidenceSkip(0.9, k_min=6), HIGH8, 0, 6),
    ("tau 0.95 leaves 5 < k_min", ConfidenceSkip(0.95), HIGH8, 0, 0),
    ("tau 0.95, k_min 5", ConfidenceSkip(0.95, k_min=5), HIGH8, 0, 5),
    ("s_max reached: strict", ConfidenceSkip(0.9, s_max=64), HIGH8, 64, 0),
    ("s_max not reached", ConfidenceSkip(0.9, s_max=64), HIGH8, 63, 6),
    ("s_max == k_min", ConfidenceSkip(0.9, k_min=6, s_max=6), HIGH8, 5, 6),
    ("local gate is a running min", ConfidenceSkip(0.9, k_min=1), [0.99, 0.5, 0.99, 0.99], 0, 1),
    ("first token fails", ConfidenceSkip(0.9, k_min=1), [0.5, 0.99, 0.99], 0, 0),
    ("k_min 0 still needs one token", ConfidenceSkip(0.9, k_min=0), [0.5, 0.99], 0, 0),
    ("whole block passes", ConfidenceSkip(0.5, k_min=2), HIGH8, 0, 8),
    ("tau 0 skips everything", ConfidenceSkip(0.0, k_min=8), HIGH8, 0, 8),
    ("tau 1 skips nothing", ConfidenceSkip(1.0, k_min=1), HIGH8, 0, 0),
    (
        "signal gate shorter than local",
        ConfidenceSkip(0.9, k_min=2, signal=Scores([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]), signal_tau=0.7),
        HIGH8,
        0,
        3,
    ),
    (
        "local gate shorter than signal",
        ConfidenceSkip(0.96, k_min=2, signal=Scores([1.0] * 8), signal_tau=0.5),
        HIGH8,
        0,
        4,
    ),
    (
        "signal_tau defaults to tau",
        ConfidenceSkip(0.9, k_min=1, signal=Scores([0.95, 0.85] + [0.0] * 6)),
        HIGH8,
        0,
        1,
    ),
    ("MARS commit-first: first always", ConfidenceSkip(0.9, commit_first=True), [0.1, 0.5, 0.99], 99, 1),
    ("MARS commit-first: gate from 2nd", ConfidenceSkip(0.9, commit_first=True), [0.1, 0.99, 0.5], 99, 2),
    ("MARS commit-first: prefix", ConfidenceSkip(0.9, commit_first=True), HIGH8, 99, 6),
    (
        "marginal: running min of P(L>=j)",
        ConfidenceSkip(
            0.5, k_min=2, signal=MarginalSurvival(predictor(marginal=[0.9, 0.8, 0.4, 0.9] + [0.9] * 4))
        ),
        HIGH8,
        0,
        2,
    ),
    (
        "marginal: all high",
        ConfidenceSkip(0.9, k_min=2, signal=MarginalSurvival(predictor(marginal=[0.9] * 8)), signal_tau=0.5),
        HIGH8,
        0,
        6,
    ),
    (
        "conditional: prefix product",
        # products: .9, .81, .729, .656, .59, .53, .48
        ConfidenceSkip(
            0.9, k_min=2, signal=ConditionalSurvival(predictor(conditional=[0.9] * 8)), signal_tau=0.6
        ),
        HIGH8,
        0,
        4,
    ),
    (
        "conditional below k_min",
        ConfidenceSkip(
            0.9, k_min=3, signal=ConditionalSurvival(predictor(conditional=[0.9] * 8)), signal_tau=0.8
        ),
        HIGH8,
        0,
        0,
    ),
    ("raw signal == local gate", ConfidenceSkip(0.9, signal=RawConfidence()), HIGH8, 0, 6),
    ("strict never skips", Strict(), HIGH8, 0, 0),
]


@pytest.mark.parametrize("name,scheduler,conf,run,expected", TABLE, ids=[row[0] for row in TABLE])
def test_skip_length_table(name, scheduler, conf, run, expected):
    assert scheduler.skip_length(proposal(conf), SchedulerState(rounds=3, unverified_run=run)) == expected


def test_signal_prefix_scores():
    p = proposal(HIGH8)
    torch.testing.assert_close(RawConfidence().prefix_scores(p), torch.cummin(torch.tensor(HIGH8), 0).values)
    m = MarginalSurvival(predictor(marginal=[0.9, 0.7, 0.8, 0.6, 0.9, 0.9, 0.9, 0.9])).prefix_scores(p)
    torch.testing.assert_close(m, torch.tensor([0.9, 0.7, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6]))
    c = ConditionalSurvival(predictor(conditional=[0.5] * 8)).prefix_scores(p)
    torch.testing.assert_close(c, 0.5 ** torch.arange(1, 9, dtype=torch.float32))
    assert (c[1:] <= c[:-1]).all()


@pytest.mark.parametrize(
    "period,rounds,expected", [(1, 0, 6), (3, 0, 0), (3, 1, 0), (3, 2, 6), (3, 5, 6), (3, 6, 0)]
)
def test_periodic(period, rounds, expected):
    assert Periodic(period, k=6).skip_length(proposal(HIGH8), SchedulerState(rounds=rounds)) == expected


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: ConfidenceSkip(1.5), "tau"),
        (lambda: ConfidenceSkip(math.nan), "tau"),
        (lambda: ConfidenceSkip(0.9, k_min=-1), "k_min"),
        (lambda: ConfidenceSkip(0.9, k_min=6, s_max=5), "s_max"),
        (lambda: ConfidenceSkip(0.9, signal_tau=2.0), "signal_tau"),
        (lambda: Periodic(0), "period"),
        (lambda: Periodic(2, k=0), "k must"),
        (lambda: MarginalSurvival(predictor(conditional=[0.5] * 8)), "no trained marginal"),
        (lambda: ConditionalSurvival(predictor(marginal=[0.5] * 8)), "no trained conditional"),
    ],
)
def test_bad_scheduler_arguments(make, match):
    with pytest.raises(RelaxSpecError, match=match):
        make()


def test_learned_signal_needs_drafter_features():
    bare = Proposal(tokens=torch.zeros(1, 3, dtype=torch.long), probs=None, confidence=torch.ones(1, 3))
    with pytest.raises(RelaxSpecError, match="lacks the drafter features"):
        MarginalSurvival(predictor(marginal=[0.5] * 3)).prefix_scores(bare)
