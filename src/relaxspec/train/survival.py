"""``relaxspec train survival``: learned survival signals from Strict-SDD trajectories (VS App. A.7).

1. :func:`collect_trajectories` runs Strict SDD (greedy, the paper's setting) on *training* prompts
   (math training seeds and code training modules, :func:`relaxspec.eval.sdd_sweep.training_prompts`) and
   records, per verified block, the per-position drafter features and the strict accepted length L.
2. :func:`fit_predictor` trains the marginal (``1{L ≥ j}`` on every drafted position) and the
   conditional (``1{L ≥ j}`` on positions with ``L ≥ j − 1``) MLPs with BCE through the shared
   training loop (:func:`relaxspec.train.loop.train`).
3. :func:`evaluate_predictor` reports per-position BCE against a position-only baseline (the
   training base rate of each position) and AUROC against raw confidence, on held-out prompts.
4. The predictor is saved as a ``survival`` model directory (safetensors + config.json + card).
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine import CycleRecord, Engine
from relaxspec.engine.survival import (
    KINDS,
    SurvivalConfig,
    SurvivalMLP,
    SurvivalPredictor,
    auroc,
    bce,
    block_inputs,
    survival_labels,
)
from relaxspec.errors import RelaxSpecError
from relaxspec.train.loop import TrainConfig, train


@dataclass
class Trajectories:
    """Strict-SDD blocks: M blocks of up to γ positions (zero-padded beyond ``k``).

    hidden: HalfTensor[M, γ, H]; scalars: FloatTensor[M, γ, F]; raw: FloatTensor[M, γ] (raw
    confidence); accepted: LongTensor[M] (strict length L); k: LongTensor[M] (drafted length);
    prompt: LongTensor[M] (index of the prompt the block came from).
    """

    hidden: torch.Tensor
    scalars: torch.Tensor
    raw: torch.Tensor
    accepted: torch.Tensor
    k: torch.Tensor
    prompt: torch.Tensor

    @property
    def gamma(self) -> int:
        return int(self.raw.shape[1])

    def __len__(self) -> int:
        return int(self.accepted.shape[0])

    def subset(self, rows: torch.Tensor) -> Trajectories:
        return Trajectories(*(getattr(self, f)[rows] for f in self.__dataclass_fields__))

    def save(self, path: str | Path) -> None:
        torch.save({f: getattr(self, f) for f in self.__dataclass_fields__}, path)

    @classmethod
    def load(cls, path: str | Path) -> Trajectories:
        return cls(**torch.load(path, weights_only=True))


def collect_trajectories(
    engine: Engine, prompts: list[str], params: SamplingParams, progress: bool = True
) -> Trajectories:
    """Run ``engine`` (Strict SDD) on ``prompts`` and record every verified block."""
    gamma = engine.proposer.gamma
    rows: dict[str, list[torch.Tensor]] = {f: [] for f in Trajectories.__dataclass_fields__}

    def on_cycle(record: CycleRecord, index: int) -> None:
        if record.proposal is None or record.verdict is None:
            return
        hidden, scalars = block_inputs(record.proposal)
        k = hidden.shape[0]
        pad = gamma - k
        rows["hidden"].append(F.pad(hidden, (0, 0, 0, pad)).half())
        rows["scalars"].append(F.pad(scalars, (0, 0, 0, pad)))
        rows["raw"].append(F.pad(record.proposal.confidence[0].float(), (0, pad)))
        rows["accepted"].append(record.verdict.accepted[0].clone())
        rows["k"].append(torch.tensor(k))
        rows["prompt"].append(torch.tensor(index))

    for i, prompt in enumerate(prompts):
        engine.generate(prompt, params, on_cycle=lambda r, i=i: on_cycle(r, i))
        if progress:
            print(
                f"\rtrajectories: prompt {i + 1}/{len(prompts)}, {len(rows['k'])} blocks", end="", flush=True
            )
    if progress:
        print()
    if not rows["k"]:
        raise RelaxSpecError(
            "no verified draft blocks were collected; use longer generations or more prompts"
        )
    return Trajectories(**{f: torch.stack(v) for f, v in rows.items()})


def position_dataset(traj: Trajectories, kind: str) -> dict[str, torch.Tensor]:
    """Flatten the valid positions of ``kind`` (marginal | conditional) into training rows.

    Returns ``hidden[N, H]``, ``scalars[N, F]``, ``y[N]`` (1{L ≥ j}), ``position[N]`` (j − 1),
    ``raw[N]`` (confidence at j) and ``raw_prefix[N]`` (min confidence over positions ≤ j).
    """
    if kind not in KINDS:
        raise RelaxSpecError(f"unknown survival kind {kind!r}; choose from {', '.join(KINDS)}")
    labels = survival_labels(traj.accepted, traj.k, traj.gamma)
    valid = labels[kind]
    position = torch.arange(traj.gamma).expand_as(valid)
    raw_prefix = torch.cummin(traj.raw, dim=1).values
    return {
        "hidden": traj.hidden[valid].float(),
        "scalars": traj.scalars[valid],
        "y": labels["label"][valid],
        "position": position[valid],
        "raw": traj.raw[valid],
        "raw_prefix": raw_prefix[valid],
    }


@dataclass
class FitConfig:
    kinds: tuple[str, ...] = KINDS
    mlp_hidden: tuple[int, ...] = (256, 256)
    epochs: float = 15.0
    batch_size: int = 4096  # positions per step (VS App. A.7)
    lr: float = 1e-3
    seed: int = 0


def fit_predictor(
    traj: Trajectories,
    config: FitConfig,
    run_dir: str | Path,
    meta: dict | None = None,
    progress: bool = True,
) -> SurvivalPredictor:
    """Train one MLP per kind on ``traj`` with BCE, through the shared training loop."""
    hidden_size = traj.hidden.shape[-1]
    cfg = SurvivalConfig(hidden_size=hidden_size, mlp_hidden=tuple(config.mlp_hidden), meta=meta or {})
    everything = position_dataset(traj, "marginal")
    x_all = torch.cat([everything["hidden"], everything["scalars"]], dim=1)
    mean, std = x_all.mean(0), x_all.std(0).clamp_min(1e-6)
    mlps = {}
    for kind in config.kinds:
        data = position_dataset(traj, kind)
        n = data["y"].shape[0]
        if n == 0 or data["y"].min() == data["y"].max():
            raise RelaxSpecError(
                f"the {kind} survival data has {n} rows and a single class; collect more blocks"
            )
        x = (torch.cat([data["hidden"], data["scalars"]], dim=1) - mean) / std
        y = data["y"]
        batch = min(config.batch_size, n)
        steps = max(1, math.ceil(config.epochs * n / batch))
        torch.manual_seed(config.seed)
        mlp = SurvivalMLP(cfg.in_dim, cfg.mlp_hidden)

        def batch_fn(step: int, micro: int, x=x, y=y, n=n, batch=batch) -> dict[str, torch.Tensor]:
            gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
            idx = torch.randint(0, n, (batch,), generator=gen)
            return {"x": x[idx], "y": y[idx]}

        train_config = TrainConfig(
            out_dir=str(Path(run_dir) / kind),
            steps=steps,
            batch_size=batch,
            seq_len=2,
            lr=config.lr,
            warmup=min(20, steps // 10),
            weight_decay=0.0,
            eval_every=10**9,
            ckpt_every=steps,
            keep_checkpoints=1,
            seed=config.seed,  # default precision: one process shares one Accelerate state
        )
        mlp, _ = train(
            mlp,
            train_config,
            batch_fn,
            lambda m, b: F.binary_cross_entropy_with_logits(m(b["x"]), b["y"]),
            resume=False,
            progress=progress,
        )
        # a fresh module: Accelerate leaves an autocast wrapper on the trained one's forward
        clean = SurvivalMLP(cfg.in_dim, cfg.mlp_hidden)
        clean.load_state_dict({k: v.float() for k, v in mlp.state_dict().items()})
        mlps[kind] = clean.eval()
    return SurvivalPredictor(cfg, mlps, mean, std)


def evaluate_predictor(predictor: SurvivalPredictor, train: Trajectories, val: Trajectories) -> dict:
    """Per-position and pooled BCE / AUROC of each trained kind on ``val``.

    Baselines: position-only (each position's base rate on ``train``: its BCE; pooled AUROC) and
    raw confidence (AUROC; the marginal target is compared with the raw prefix score
    ``min_{i≤j} conf_i``, the conditional one with ``conf_j``).
    """
    out: dict = {}
    gamma = train.gamma
    for kind in KINDS:
        if not predictor.has(kind):
            continue
        tr, va = position_dataset(train, kind), position_dataset(val, kind)
        base = torch.full((gamma,), 0.5)
        for j in range(gamma):
            sel = tr["position"] == j
            if sel.any():
                base[j] = tr["y"][sel].mean().clamp(1e-4, 1 - 1e-4)
        probs = predictor.probabilities(kind, va["hidden"], va["scalars"])
        raw = va["raw_prefix"] if kind == "marginal" else va["raw"]
        pos_only = base[va["position"]]
        rows = []
        for j in range(gamma):
            sel = va["position"] == j
            if not sel.any():
                continue
            rows.append(
                {
                    "position": j + 1,
                    "n": int(sel.sum()),
                    "positive_rate": float(va["y"][sel].mean()),
                    "bce": bce(probs[sel], va["y"][sel]),
                    "bce_position_only": bce(pos_only[sel], va["y"][sel]),
                    "auroc": auroc(probs[sel], va["y"][sel]),
                    "auroc_raw": auroc(raw[sel], va["y"][sel]),
                }
            )
        out[kind] = {
            "rows_train": int(tr["y"].numel()),
            "rows_val": int(va["y"].numel()),
            "bce": bce(probs, va["y"]),
            "bce_position_only": bce(pos_only, va["y"]),
            "auroc": auroc(probs, va["y"]),
            "auroc_position_only": auroc(pos_only, va["y"]),
            "auroc_raw": auroc(raw, va["y"]),
            "per_position": rows,
        }
    return out


def split_by_prompt(traj: Trajectories, val_fraction: float) -> tuple[Trajectories, Trajectories]:
    """Train / validation blocks, split by prompt: every ``1/val_fraction``-th prompt validates.

    A stride rather than the last prompts, because prompts come grouped by source (math, then
    code): a tail split would validate on code only and measure a distribution shift instead.
    """
    if not 0 < val_fraction < 1:
        raise RelaxSpecError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    stride = max(2, round(1 / val_fraction))
    is_val = traj.prompt % stride == stride - 1
    if is_val.all() or not is_val.any():
        raise RelaxSpecError("need blocks from at least two prompts to split train / validation")
    return traj.subset(~is_val), traj.subset(is_val)


def _fmt(x: float) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def write_card(out_dir: str | Path, meta: dict, metrics: dict) -> Path:
    """README.md of a survival model: data, training, per-position BCE / AUROC tables."""
    lines = [
        "# survival — learned survival signals for verifier skipping (relaxspec)",
        "",
        "Per-position MLPs on diffusion-drafter features (hidden state at reveal + scalars), trained with",
        "BCE on Strict-SDD trajectories from training prompts (VS paper §4, App. A.7). `marginal` predicts",
        "P(L ≥ j), `conditional` P(L ≥ j | L ≥ j−1); use with `--method sdd-skip --set signal=marginal`.",
        "",
        "## Data and training",
        "",
        *[f"- {k}: {v}" for k, v in meta.items()],
    ]
    for kind, m in metrics.items():
        lines += [
            "",
            f"## {kind} (validation prompts)",
            "",
            f"Pooled: BCE {_fmt(m['bce'])} (position-only {_fmt(m['bce_position_only'])}); AUROC "
            f"{_fmt(m['auroc'])} (position-only {_fmt(m['auroc_position_only'])}, raw confidence "
            f"{_fmt(m['auroc_raw'])}); {m['rows_train']} train / {m['rows_val']} validation rows.",
            "",
            "| j | n | P(L≥j) | BCE | BCE pos-only | AUROC | AUROC raw |",
            "|---|---|---|---|---|---|---|",
            *[
                f"| {r['position']} | {r['n']} | {_fmt(r['positive_rate'])} | {_fmt(r['bce'])} | "
                f"{_fmt(r['bce_position_only'])} | {_fmt(r['auroc'])} | {_fmt(r['auroc_raw'])} |"
                for r in m["per_position"]
            ],
        ]
    path = Path(out_dir) / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class SurvivalRun:
    """Options of ``relaxspec train survival``."""

    n_math: int = 240
    n_code: int = 60
    max_new_tokens: int = 128
    gamma: int | None = None
    steps: int | None = None
    val_fraction: float = 0.2
    fit: FitConfig = field(default_factory=FitConfig)


def train_survival(
    target_dir: str | Path,
    diffusion_dir: str | Path,
    corpus_dir: str | Path,
    out_dir: str | Path,
    run_dir: str | Path,
    run: SurvivalRun | None = None,
    progress: bool = True,
    command: str | None = None,
) -> dict:
    """Collect trajectories (cached in ``run_dir``), fit, evaluate and export a survival model."""
    from relaxspec.engine.proposers.diffusion import load_diffusion
    from relaxspec.eval.sdd_sweep import STOP, training_prompts
    from relaxspec.methods import ModelSet, build_engine
    from relaxspec.models import load_model

    run = run or SurvivalRun()
    run_path = Path(run_dir)
    run_path.mkdir(parents=True, exist_ok=True)
    models = ModelSet(target=load_model(target_dir), diffusion=load_diffusion(diffusion_dir))
    engine = build_engine("sdd", models, gamma=run.gamma, steps=run.steps)
    settings = {
        "target": str(target_dir),
        "diffusion": str(diffusion_dir),
        "gamma": engine.proposer.gamma,
        "steps": engine.proposer.steps,
        "n_math": run.n_math,
        "n_code": run.n_code,
        "max_new_tokens": run.max_new_tokens,
    }
    cache = run_path / "trajectories.pt"
    settings_file = run_path / "trajectories.json"
    if cache.is_file() and settings_file.is_file() and json.loads(settings_file.read_text()) == settings:
        traj = Trajectories.load(cache)
    else:
        prompts = training_prompts(corpus_dir, run.n_math, run.n_code)
        params = SamplingParams(temperature=0.0, max_new_tokens=run.max_new_tokens, seed=0, stop=STOP)
        traj = collect_trajectories(engine, prompts, params, progress)
        traj.save(cache)
        settings_file.write_text(json.dumps(settings, indent=1))
    train_traj, val_traj = split_by_prompt(traj, run.val_fraction)
    meta = {
        **settings,
        "blocks": len(traj),
        "train_blocks": len(train_traj),
        "val_blocks": len(val_traj),
        "mean_strict_length": float(traj.accepted.float().mean()),
        "command": command or shlex.join(["relaxspec", *sys.argv[1:]]),
        "fit": asdict(run.fit),
    }
    predictor = fit_predictor(train_traj, run.fit, run_path / "fit", meta, progress)
    metrics = evaluate_predictor(predictor, train_traj, val_traj)
    predictor.save(out_dir)
    (Path(out_dir) / "metrics.json").write_text(json.dumps(metrics, indent=1))
    write_card(out_dir, meta, metrics)
    return metrics
