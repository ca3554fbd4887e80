"""Survival signals: labels, AUROC, the MLPs on synthetic data, save/load, the VS diagnostics
(permutation test, break-even K*), and `train survival` end to end on tiny models."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.survival import (
    SCALAR_FEATURES,
    SurvivalPredictor,
    auroc,
    break_even_skip_length,
    feasible_prefix_lengths,
    permutation_test,
    survival_labels,
)
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ModelSet, build_engine
from relaxspec.models import LoadedModel
from relaxspec.testing import perturbed_copy
from relaxspec.train.diffusion import mark_drafter
from relaxspec.train.survival import (
    FitConfig,
    SurvivalRun,
    Trajectories,
    collect_trajectories,
    evaluate_predictor,
    fit_predictor,
    position_dataset,
    split_by_prompt,
    train_survival,
)

GAMMA, H = 8, 6


def synthetic(m: int = 600, seed: int = 0) -> Trajectories:
    """Blocks whose strict length is driven by a latent visible in hidden dim 0 (not in position)."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(m, generator=gen)
    accepted = (4 + 2.5 * z + 0.5 * torch.randn(m, generator=gen)).round().clamp(0, GAMMA).long()
    hidden = torch.randn(m, GAMMA, H, generator=gen)
    hidden[:, :, 0] = z[:, None] + 0.1 * torch.randn(m, GAMMA, generator=gen)
    scalars = torch.randn(m, GAMMA, len(SCALAR_FEATURES), generator=gen)
    scalars[:, :, 4] = torch.arange(1, GAMMA + 1)  # position
    return Trajectories(
        hidden=hidden.half(),
        scalars=scalars,
        raw=torch.rand(m, GAMMA, generator=gen),
        accepted=accepted,
        k=torch.full((m,), GAMMA),
        prompt=torch.arange(m) // 10,
    )


# --- labels and metrics -------------------------------------------------------------------------


def test_survival_labels():
    out = survival_labels(torch.tensor([0, 2, 4]), torch.tensor([4, 4, 3]), 4)
    assert out["label"].tolist() == [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert out["marginal"].tolist() == [[True] * 4, [True] * 4, [True, True, True, False]]
    # conditional: positions reached (L ≥ j − 1) and drafted
    assert out["conditional"].tolist() == [
        [True, False, False, False],
        [True, True, True, False],
        [True, True, True, False],
    ]


def brute_auroc(scores, labels):
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_auroc_matches_pairwise_count(seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 5, (40,), generator=gen).float()  # many ties
    labels = torch.rand(40, generator=gen) < 0.4
    assert auroc(scores, labels) == pytest.approx(brute_auroc(scores.tolist(), labels.tolist()))


def test_auroc_edge_cases():
    assert auroc(torch.tensor([1.0, 2.0]), torch.tensor([0, 1])) == 1.0
    assert auroc(torch.tensor([3.0, 3.0]), torch.tensor([0, 1])) == 0.5
    assert math.isnan(auroc(torch.tensor([1.0, 2.0]), torch.tensor([1, 1])))


# --- the MLPs -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    traj = synthetic()
    train, val = split_by_prompt(traj, 0.25)
    config = FitConfig(epochs=8, batch_size=256, lr=3e-3, mlp_hidden=(32, 32))
    predictor = fit_predictor(train, config, tmp_path_factory.mktemp("fit"), progress=False)
    return predictor, train, val


def test_mlps_beat_the_position_only_baseline(fitted):
    predictor, train, val = fitted
    metrics = evaluate_predictor(predictor, train, val)
    for kind, margin in (("marginal", 0.05), ("conditional", 0.01)):
        m = metrics[kind]
        assert m["auroc"] > m["auroc_position_only"] + margin, kind
        assert m["bce"] < m["bce_position_only"], kind
        assert len(m["per_position"]) == GAMMA
        # per position the baseline is a constant (AUROC 0.5); the model ranks blocks by the latent
        good = [r["auroc"] for r in m["per_position"] if not math.isnan(r["auroc"])]
        assert sum(good) / len(good) > 0.7


def test_split_by_prompt_keeps_prompts_apart():
    train, val = split_by_prompt(synthetic(100), 0.2)
    assert set(train.prompt.tolist()).isdisjoint(val.prompt.tolist())
    assert len(train) + len(val) == 100
    # validation prompts are spread over the whole prompt list (math and code alike), not its tail
    val_prompts = sorted(set(val.prompt.tolist()))
    assert val_prompts == [4, 9]  # 10 prompts, stride 5
    with pytest.raises(RelaxSpecError, match="val_fraction"):
        split_by_prompt(synthetic(10), 1.0)


def test_position_dataset_rows():
    traj = synthetic(5)
    marginal, conditional = position_dataset(traj, "marginal"), position_dataset(traj, "conditional")
    assert marginal["y"].numel() == 5 * GAMMA
    assert conditional["y"].numel() == int(torch.clamp(traj.accepted + 1, max=GAMMA).sum())
    assert marginal["hidden"].shape == (5 * GAMMA, H)
    with pytest.raises(RelaxSpecError, match="unknown survival kind"):
        position_dataset(traj, "joint")


def test_save_load_round_trip(fitted, tmp_path):
    predictor, _, val = fitted
    predictor.save(tmp_path / "s")
    loaded = SurvivalPredictor.load(tmp_path / "s")
    data = position_dataset(val, "marginal")
    for kind in ("marginal", "conditional"):
        torch.testing.assert_close(
            loaded.probabilities(kind, data["hidden"], data["scalars"]),
            predictor.probabilities(kind, data["hidden"], data["scalars"]),
        )
    with pytest.raises(RelaxSpecError, match="expects drafter hidden states of size 6"):
        loaded.probabilities("marginal", torch.zeros(2, 5), torch.zeros(2, len(SCALAR_FEATURES)))


def test_load_errors(tmp_path):
    with pytest.raises(RelaxSpecError, match="not a survival model directory"):
        SurvivalPredictor.load(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(RelaxSpecError, match="corrupt survival model"):
        SurvivalPredictor.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"format": "relaxspec-survival-v1", "hidden_size": 4}))
    with pytest.raises(RelaxSpecError, match="corrupt survival model"):
        SurvivalPredictor.load(tmp_path)


# --- diagnostics --------------------------------------------------------------------------------


def test_feasible_prefix_lengths():
    s = torch.tensor([[0.9, 0.95, 0.5, 0.99], [0.4, 0.9, 0.9, 0.9], [0.99, 0.99, 0.99, 0.99]])
    assert feasible_prefix_lengths(s, 0.9).tolist() == [2, 0, 4]
    assert feasible_prefix_lengths(s, 0.9, "product").tolist() == [1, 0, 4]
    with pytest.raises(RelaxSpecError, match="aggregate"):
        feasible_prefix_lengths(s, 0.9, "max")


def test_permutation_collapses_prefixes_but_keeps_positionwise_auroc():
    """VS App. A.1: shared randomness makes high scores co-occur within blocks; shuffling per
    position keeps each position's (score, label) law but breaks contiguous prefixes."""
    gen = torch.Generator().manual_seed(0)
    N, K, rho = 4000, 8, 0.5
    L = torch.randint(0, K + 1, (N,), generator=gen)
    labels = (torch.arange(1, K + 1)[None] <= L[:, None]).float()
    shared = (torch.rand(N, 1, generator=gen) < rho).float()
    scores = torch.where(labels.bool() & shared.bool(), 0.95, 0.3) + 0.01 * torch.rand(N, K, generator=gen)
    out = permutation_test(scores, labels, tau=0.9, generator=torch.Generator().manual_seed(1))
    assert out["feasible_mean_nonzero"] > 2 * out["permuted_feasible_mean_nonzero"]
    assert out["feasible_mean"] > 2 * out["permuted_feasible_mean"]
    for a, b in zip(out["auroc"], out["permuted_auroc"], strict=True):
        assert a == pytest.approx(b, abs=1e-12) or (math.isnan(a) and math.isnan(b))


def test_break_even_skip_length():
    # strict round: 1 + 4 = 5 s for 2.5 tokens (2 s/token); a skip costs 1 s: wins for K > 0.5
    assert break_even_skip_length(1.0, 4.0, 2.5) == pytest.approx(0.5)
    # with a deferred prefill cost of 1.5 s/token: K* = 1 / (2 - 1.5) = 2
    assert break_even_skip_length(1.0, 4.0, 2.5, 1.5) == pytest.approx(2.0)
    assert break_even_skip_length(1.0, 1.0, 1.0, 2.0) == math.inf
    with pytest.raises(RelaxSpecError, match="strict_tokens_per_round"):
        break_even_skip_length(1.0, 1.0, 0.0)
    with pytest.raises(RelaxSpecError, match="draft_seconds"):
        break_even_skip_length(-1.0, 1.0, 1.0)


# --- end to end on tiny models ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, target, tokenizer):
    root = tmp_path_factory.mktemp("surv")
    drafter = perturbed_copy(target.model, noise=0.3, seed=4)
    mark_drafter(drafter, 6, 2)
    for name, model in (("target", target.model), ("diffusion", drafter)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def test_collect_trajectories_records_verified_blocks(target, tokenizer, tiny_dirs):
    from relaxspec.engine.proposers.diffusion import load_diffusion

    models = ModelSet(target=target, diffusion=load_diffusion(tiny_dirs / "diffusion"))
    engine = build_engine("sdd", models, gamma=6, steps=2)
    params = SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True)
    traj = collect_trajectories(engine, ["w1 w2", "w3"], params, progress=False)
    assert traj.hidden.shape[1:] == (6, models.diffusion.model.config.hidden_size)
    assert (traj.accepted <= traj.k).all() and set(traj.prompt.tolist()) == {0, 1}
    # padded positions beyond k are zero
    short = traj.k < 6
    if short.any():
        assert traj.raw[short][:, -1].eq(0).all()


def test_train_survival_end_to_end(tiny_dirs, target, tokenizer):
    out = tiny_dirs / "survival"
    run = SurvivalRun(n_math=6, n_code=0, max_new_tokens=24, gamma=6, steps=2, val_fraction=0.34,
                      fit=FitConfig(epochs=3, batch_size=128, mlp_hidden=(16,)))  # fmt: skip
    t, d = tiny_dirs / "target", tiny_dirs / "diffusion"
    metrics = train_survival(t, d, tiny_dirs, out, tiny_dirs / "run", run, progress=False, command="test")
    assert set(metrics) == {"marginal", "conditional"}
    card = (out / "README.md").read_text()
    assert "BCE pos-only" in card and "AUROC raw" in card and "command: test" in card
    assert (tiny_dirs / "run" / "trajectories.pt").is_file()
    # the bundled-style directory plugs into sdd-skip
    from relaxspec.methods import load_models

    models = load_models(
        "sdd-skip", {"target": tiny_dirs / "target", "diffusion": tiny_dirs / "diffusion", "survival": out}
    )
    for signal in ("marginal", "conditional"):
        engine = build_engine(
            "sdd-skip", models, gamma=6, steps=2, signal=signal, tau=0.1, signal_tau=0.05, k_min=1
        )
        s = engine.generate("w1 w2", SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True)).stats
        assert s.new_tokens == 20


def test_survival_for_another_drafter_is_refused(tiny_dirs, target, tokenizer, fitted):
    from relaxspec.engine.proposers.diffusion import load_diffusion

    predictor, _, _ = fitted  # trained on hidden size 6; the tiny drafter has 32
    models = ModelSet(target=target, diffusion=load_diffusion(tiny_dirs / "diffusion"), survival=predictor)
    with pytest.raises(RelaxSpecError, match="trained on drafter hidden states of size 6"):
        build_engine("sdd-skip", models, signal="marginal")
    assert isinstance(models.diffusion, LoadedModel)


def test_break_even_from_strict_stats():
    from relaxspec.engine import GenerationStats
    from relaxspec.engine.survival import break_even_from_stats

    s = GenerationStats(new_tokens=25, cycles=10, verifier_calls=10, draft_seconds=10.0, verify_seconds=40.0)
    assert break_even_from_stats(s) == pytest.approx(0.5)  # c_d 1, c_v 4, τ 2.5
    s.skipped_rounds = 1
    with pytest.raises(RelaxSpecError, match="strict run"):
        break_even_from_stats(s)
