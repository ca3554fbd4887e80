"""Learned survival signals for verifier skipping, and the VS paper's diagnostics.

VS paper §4 (signals), §5 (H1, permutation diagnostic), App. A.7 (predictors); docs/design.md §4.
For a draft block, let ``L`` be the prefix length Strict SDD accepts. Two per-position targets:
**marginal survival** ``m_j = P(L ≥ j)``, prefix gate ``C_k = min_{j≤k} m_j``
(:class:`MarginalSurvival`), and **conditional survival** ``c_j = P(L ≥ j | L ≥ j−1)``,
``C_k = Π_{j≤k} c_j`` (:class:`ConditionalSurvival`). Both are the same small MLP
(:class:`SurvivalPredictor`) on pre-verification drafter features only, trained with BCE on
Strict-SDD trajectories of *training* prompts (``relaxspec train survival``); they plug into
:class:`relaxspec.engine.schedulers.ConfidenceSkip` as its ``signal``. Diagnostics (pure
functions): :func:`auroc`, :func:`permutation_test`, :func:`break_even_skip_length` (K*).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from relaxspec.engine.proposers.base import Proposal
from relaxspec.errors import RelaxSpecError

FORMAT = "relaxspec-survival-v1"
KINDS = ("marginal", "conditional")
SCALAR_FEATURES = (
    "confidence",
    "log_confidence",
    "entropy",
    "margin",
    "position",
    "position_frac",
    "block_length",
    "reveal_step",
    "reveal_frac",
    "prefix_min_confidence",
    "prefix_mean_log_confidence",
    "block_mean_confidence",
    "prev_confidence",
)
_REQUIRED = ("hidden", "confidence", "entropy", "margin", "position", "reveal_step", "steps", "block_length")


# ---------------------------------------------------------------------------------------------
# Features
# ---------------------------------------------------------------------------------------------


def scalar_features(features: dict[str, torch.Tensor]) -> torch.Tensor:
    """``FloatTensor[K, F]`` (F = len(SCALAR_FEATURES)) from a diffusion proposal's features (row 0)."""
    missing = [k for k in _REQUIRED if k not in features]
    if missing:
        raise RelaxSpecError(
            f"the proposal lacks the drafter features {missing}; learned survival signals need the "
            "diffusion proposer"
        )
    conf = features["confidence"][0].float().clamp_min(1e-12)
    K = conf.shape[0]
    log_conf = conf.log()
    position = features["position"][0].float()
    block_length = features["block_length"][0].float()
    step = features["reveal_step"][0].float()
    steps = features["steps"][0].float()
    prev = torch.cat([torch.ones(1), conf[:-1]])
    cols = [
        conf,
        log_conf,
        features["entropy"][0].float(),
        features["margin"][0].float(),
        position,
        position / block_length,
        block_length,
        step,
        step / steps.clamp_min(1),
        torch.cummin(conf, 0).values,
        log_conf.cumsum(0) / torch.arange(1, K + 1),
        conf.mean().expand(K),
        prev,
    ]
    return torch.stack(cols, dim=1)


def block_inputs(proposal: Proposal) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden[K, H], scalars[K, F])`` of a proposal: the predictors' inputs."""
    scalars = scalar_features(proposal.features)  # validates the features first
    return proposal.features["hidden"][0].float(), scalars


# ---------------------------------------------------------------------------------------------
# The predictor
# ---------------------------------------------------------------------------------------------


class SurvivalMLP(nn.Module):
    """Per-position MLP ``[H + F] -> hidden... -> 1`` logit (VS App. A.7, smaller)."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...] = (256, 256)) -> None:
        super().__init__()
        dims = [in_dim, *hidden]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(dims):
            layers += [nn.Linear(a, b), nn.GELU()]
        layers.append(nn.Linear(dims[-1], 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, in_dim] standardised inputs -> logits [N]."""
        return self.net(x).squeeze(-1)


@dataclass
class SurvivalConfig:
    hidden_size: int  # drafter hidden size H
    mlp_hidden: tuple[int, ...] = (256, 256)
    scalar_features: tuple[str, ...] = SCALAR_FEATURES
    trained: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict)  # drafter, γ, S, prompts, ... (for the card)

    @property
    def in_dim(self) -> int:
        return self.hidden_size + len(self.scalar_features)


class SurvivalPredictor:
    """The marginal and/or conditional MLPs with their input standardisation.

    Features are pre-verification only: the hidden state the token was predicted from at its
    reveal step, plus scalars (confidence, entropy, margin, position, reveal step, block length
    and prefix summaries)."""

    def __init__(
        self,
        config: SurvivalConfig,
        mlps: dict[str, SurvivalMLP],
        mean: torch.Tensor,
        std: torch.Tensor,
        path: Path | None = None,
    ) -> None:
        self.config, self.mlps, self.mean, self.std, self.path = config, mlps, mean, std, path
        for m in mlps.values():
            m.eval()

    def has(self, kind: str) -> bool:
        return kind in self.mlps

    def require(self, kind: str) -> None:
        if kind not in KINDS:
            raise RelaxSpecError(f"unknown survival kind {kind!r}; choose from {', '.join(KINDS)}")
        if kind not in self.mlps:
            where = f" at {self.path}" if self.path else ""
            raise RelaxSpecError(
                f"the survival model{where} has no trained {kind} predictor; run `relaxspec train survival`"
            )

    def standardise(self, hidden: torch.Tensor, scalars: torch.Tensor) -> torch.Tensor:
        """[N, H], [N, F] -> standardised inputs [N, H+F]."""
        if hidden.shape[-1] != self.config.hidden_size:
            raise RelaxSpecError(
                f"the survival predictor expects drafter hidden states of size {self.config.hidden_size}, "
                f"got {hidden.shape[-1]}: it was trained for another drafter"
            )
        x = torch.cat([hidden.float(), scalars.float()], dim=-1)
        return (x - self.mean) / self.std

    @torch.no_grad()
    def probabilities(self, kind: str, hidden: torch.Tensor, scalars: torch.Tensor) -> torch.Tensor:
        """Per-position probabilities ``[N]`` (marginal ``P(L≥j)`` or conditional ``P(L≥j|L≥j−1)``)."""
        self.require(kind)
        return torch.sigmoid(self.mlps[kind](self.standardise(hidden, scalars)))

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        tensors = {"input_mean": self.mean.contiguous(), "input_std": self.std.contiguous()}
        for kind, mlp in self.mlps.items():
            tensors.update({f"{kind}.{k}": v.contiguous() for k, v in mlp.state_dict().items()})
        save_file(tensors, str(out / "model.safetensors"))
        cfg = asdict(self.config) | {"format": FORMAT, "trained": sorted(self.mlps)}
        (out / "config.json").write_text(json.dumps(cfg, indent=1))
        return out

    @classmethod
    def load(cls, path: str | Path) -> SurvivalPredictor:
        """Load a directory written by :meth:`save`; one clear error if missing or corrupt."""
        p = Path(path)
        hint = "train one with `relaxspec train survival`"
        if not (p / "config.json").is_file() or not (p / "model.safetensors").is_file():
            raise RelaxSpecError(
                f"{p} is not a survival model directory (needs config.json and model.safetensors); {hint}"
            )
        try:
            raw = json.loads((p / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise RelaxSpecError(f"corrupt survival model {p}: config.json: {err}") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise RelaxSpecError(
                f"{p} is not a survival model directory (config.json format is not {FORMAT!r}); {hint}"
            )
        try:
            config = SurvivalConfig(
                hidden_size=int(raw["hidden_size"]),
                mlp_hidden=tuple(raw["mlp_hidden"]),
                scalar_features=tuple(raw["scalar_features"]),
                trained=tuple(raw["trained"]),
                meta=raw.get("meta", {}),
            )
            if config.scalar_features != SCALAR_FEATURES:
                raise ValueError("it was trained on another feature set")
            tensors = load_file(str(p / "model.safetensors"))
            mlps = {}
            for kind in config.trained:
                mlp = SurvivalMLP(config.in_dim, config.mlp_hidden)
                prefix = kind + "."
                mlp.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
                mlps[kind] = mlp
            mean, std = tensors["input_mean"], tensors["input_std"]
        except Exception as err:
            raise RelaxSpecError(f"corrupt survival model {p}: {type(err).__name__}: {err}") from None
        return cls(config, mlps, mean, std, path=p)


# ---------------------------------------------------------------------------------------------
# Signals (plug into ConfidenceSkip)
# ---------------------------------------------------------------------------------------------


def marginal_prefix(m: torch.Tensor) -> torch.Tensor:
    """``C_k = min_{j≤k} m_j`` from marginal survival probabilities ``m[K]``."""
    return torch.cummin(m, dim=0).values


def conditional_prefix(c: torch.Tensor) -> torch.Tensor:
    """``C_k = Π_{j≤k} c_j`` from conditional survival probabilities ``c[K]``."""
    return torch.cumprod(c, dim=0)


@dataclass(frozen=True)
class MarginalSurvival:
    """Signal: learned ``P(L ≥ k)``, made non-increasing by a running min (VS §4)."""

    predictor: SurvivalPredictor
    name: str = "marginal"

    def __post_init__(self) -> None:
        self.predictor.require("marginal")

    def prefix_scores(self, proposal: Proposal) -> torch.Tensor:
        return marginal_prefix(self.predictor.probabilities("marginal", *block_inputs(proposal)))


@dataclass(frozen=True)
class ConditionalSurvival:
    """Signal: product of learned ``P(L ≥ j | L ≥ j−1)`` over the prefix (VS §4)."""

    predictor: SurvivalPredictor
    name: str = "conditional"

    def __post_init__(self) -> None:
        self.predictor.require("conditional")

    def prefix_scores(self, proposal: Proposal) -> torch.Tensor:
        return conditional_prefix(self.predictor.probabilities("conditional", *block_inputs(proposal)))


# ---------------------------------------------------------------------------------------------
# Labels and metrics (pure)
# ---------------------------------------------------------------------------------------------


def survival_labels(accepted: torch.Tensor, k: torch.Tensor, gamma: int) -> dict[str, torch.Tensor]:
    """Targets of N blocks: ``accepted[N]`` = L, ``k[N]`` = drafted length K ≤ γ.

    Returns ``[N, γ]`` tensors (column j−1 is position j): ``label`` = 1{L ≥ j}; ``marginal``
    (valid for the marginal target: j ≤ K); ``conditional`` (valid for the conditional target:
    j ≤ K and L ≥ j − 1).
    """
    j = torch.arange(1, gamma + 1)[None, :]
    L, K = accepted[:, None], k[:, None]
    return {
        "label": (j <= L).float(),
        "marginal": j <= K,
        "conditional": (j <= K) & (j - 1 <= L),
    }


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (Mann–Whitney, ties count 1/2); NaN if one class is absent."""
    scores, labels = scores.flatten().double(), labels.flatten().bool()
    n1 = int(labels.sum())
    n0 = labels.numel() - n1
    if n1 == 0 or n0 == 0:
        return math.nan
    order = scores.argsort()
    _, inverse, counts = torch.unique_consecutive(scores[order], return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    avg_rank = ends - (counts.double() - 1) / 2  # 1-based average rank of each tie group
    ranks = torch.empty_like(scores)
    ranks[order] = avg_rank[inverse]
    return float((ranks[labels].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def bce(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean binary cross-entropy of probabilities (clamped away from 0 and 1)."""
    if probs.numel() == 0:
        return math.nan
    return float(F.binary_cross_entropy(probs.double().clamp(1e-7, 1 - 1e-7), labels.double()))


# ---------------------------------------------------------------------------------------------
# Diagnostics (VS §4-5)
# ---------------------------------------------------------------------------------------------


def feasible_prefix_lengths(scores: torch.Tensor, tau: float, aggregate: str = "min") -> torch.Tensor:
    """Longest prefix whose prefix score passes τ, per block: ``scores[N, K] -> LongTensor[N]``.

    aggregate: ``"min"`` (raw confidence, marginal survival: ``C_k = min_{j≤k} s_j``) or
    ``"product"`` (conditional survival: ``C_k = Π_{j≤k} s_j``).
    """
    if aggregate == "min":
        prefix = torch.cummin(scores, dim=1).values
    elif aggregate == "product":
        prefix = torch.cumprod(scores, dim=1)
    else:
        raise RelaxSpecError(f"aggregate must be 'min' or 'product', got {aggregate!r}")
    return torch.cumprod((prefix >= tau).long(), dim=1).sum(dim=1)


def permutation_test(
    scores: torch.Tensor,
    labels: torch.Tensor,
    tau: float,
    aggregate: str = "min",
    generator: torch.Generator | None = None,
) -> dict:
    """VS §5 diagnostic: break cross-position dependence, keep every position's (score, label) law.

    scores, labels: ``[N, K]`` per-position scores and survival labels ``1{L ≥ j}`` of N full
    blocks. Column j's (score, label) pairs are shuffled jointly across blocks, independently per
    column. Per-position AUROC is unchanged by construction; the mean feasible prefix length
    (under τ) collapses when high scores co-occur within blocks in the original data.
    """
    N, K = scores.shape
    perm_scores, perm_labels = scores.clone(), labels.clone()
    for j in range(K):
        perm = torch.randperm(N, generator=generator)
        perm_scores[:, j], perm_labels[:, j] = scores[perm, j], labels[perm, j]
    orig = feasible_prefix_lengths(scores, tau, aggregate).double()
    shuf = feasible_prefix_lengths(perm_scores, tau, aggregate).double()

    def nonzero_mean(x: torch.Tensor) -> float:
        return float(x[x > 0].mean()) if (x > 0).any() else 0.0

    return {
        "tau": tau,
        "blocks": N,
        "feasible_mean": float(orig.mean()),
        "permuted_feasible_mean": float(shuf.mean()),
        "feasible_mean_nonzero": nonzero_mean(orig),
        "permuted_feasible_mean_nonzero": nonzero_mean(shuf),
        "auroc": [auroc(scores[:, j], labels[:, j]) for j in range(K)],
        "permuted_auroc": [auroc(perm_scores[:, j], perm_labels[:, j]) for j in range(K)],
    }


def break_even_skip_length(
    draft_seconds: float,
    verify_seconds: float,
    strict_tokens_per_round: float,
    prefill_seconds_per_token: float = 0.0,
) -> float:
    """K*: the shortest skip that raises local throughput over a strict round (VS §4, H2).

    A strict round costs ``c_d + c_v`` and emits ``τ_s`` tokens; a skip of K tokens costs ``c_d``
    now plus ``K·c_p`` later (the verifier prefills skipped tokens at its next call). The skip
    wins iff ``K / (c_d + K·c_p) > τ_s / (c_d + c_v)``, i.e. ``K > K* = c_d / ((c_d + c_v)/τ_s − c_p)``.
    Returns ``inf`` if no skip length wins.
    """
    for name, x in (
        ("draft_seconds", draft_seconds),
        ("verify_seconds", verify_seconds),
        ("prefill_seconds_per_token", prefill_seconds_per_token),
    ):
        if not (math.isfinite(x) and x >= 0):
            raise RelaxSpecError(f"{name} must be a finite number >= 0, got {x!r}")
    if not (math.isfinite(strict_tokens_per_round) and strict_tokens_per_round > 0):
        raise RelaxSpecError(f"strict_tokens_per_round must be > 0, got {strict_tokens_per_round!r}")
    rate = (draft_seconds + verify_seconds) / strict_tokens_per_round - prefill_seconds_per_token
    return draft_seconds / rate if rate > 0 else math.inf


def break_even_from_stats(stats: object, prefill_seconds_per_token: float = 0.0) -> float:
    """K* from a *strict* run's :class:`~relaxspec.engine.stats.GenerationStats` (merged over prompts).

    ``c_d`` = draft seconds per round, ``c_v`` = verify seconds per verifier call, ``τ_s`` = tokens
    per strict round (τ). Measure on Strict SDD with the same (γ, S) as the skipping run.
    """
    cycles, calls = stats.cycles, stats.verifier_calls
    if stats.skipped_rounds or not cycles or not calls:
        raise RelaxSpecError("K* needs the stats of a strict run (no skipped rounds, at least one cycle)")
    return break_even_skip_length(
        stats.draft_seconds / cycles,
        stats.verify_seconds / calls,
        stats.new_tokens / calls,
        prefill_seconds_per_token,
    )
