"""Speculative diffusion decoding presets (VS paper; DESIGN §4): ``sdd``, ``sdd-skip``, ``sdd-periodic``.

All three draft with :class:`~relaxspec.proposers.diffusion.DiffusionProposer` (γ-token blocks in
S denoising steps) and verify with the target:

- ``sdd`` — Strict SDD: verify every block. ``accept`` picks the rule: ``exact`` (lossless;
  greedy = argmax match), ``lenience`` (ℓ; greedy variant ``p(x) ≥ ℓ·max p``), ``topk``
  (accept_k), ``nucleus`` (θ). The VS paper's lenience and top-k baselines are ``sdd`` with
  ``accept=lenience`` / ``accept=topk``.
- ``sdd-skip`` — :class:`~relaxspec.schedulers.ConfidenceSkip` on top: commit the longest prefix
  passing the local gate ``min_{j≤k} conf_j ≥ τ`` and the signal's prefix gate (``raw``,
  ``marginal`` or ``conditional`` survival), only if it has ≥ k_min tokens and the unverified run
  is < s_max. Paper defaults: γ = 32, k_min = 6, s_max = 64.
- ``sdd-periodic`` — attempt a ``skip_k``-token skip every ``period`` rounds (baseline).

``shadow=True`` audits skipped rounds with the target (strict agreement, full-prefix acceptance;
excluded from timing and call counts). γ and S default to the drafter's bundled operating point
(``relaxspec train diffusion-sweep``).

Also here: :func:`training_prompts` (prompts from the *training* splits, for the sweep and the
survival trajectories) and :func:`sweep_operating_points`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from relaxspec.acceptance import Exact, Greedy, Lenience, Nucleus, Rule, TopK
from relaxspec.engine import Engine
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ROLE_LOADERS, MethodSpec, ModelSet, register
from relaxspec.models import LoadedModel, check_compatible, check_same_tokenizer
from relaxspec.proposers.diffusion import (
    CFG_GAMMA,
    CFG_STEPS,
    REVEAL_ORDERS,
    DiffusionProposer,
    load_diffusion,
)
from relaxspec.sampling import SamplingParams
from relaxspec.schedulers import ConfidenceSkip, Periodic, RawConfidence, Scheduler, Signal, Strict
from relaxspec.survival import ConditionalSurvival, MarginalSurvival, SurvivalPredictor

ACCEPT_RULES = ("exact", "lenience", "topk", "nucleus")
SIGNALS = ("raw", "marginal", "conditional")

ROLE_LOADERS["diffusion"] = load_diffusion
ROLE_LOADERS["survival"] = SurvivalPredictor.load

BASE_PARAMS: dict[str, Any] = {
    "gamma": None,  # None: the drafter's operating point
    "steps": None,
    "reveal": "auto",
    "accept": "exact",
    "ell": 0.5,
    "accept_k": 2,
    "theta": 0.95,
    "shadow": False,
}
SKIP_PARAMS: dict[str, Any] = {
    "signal": "raw",
    "tau": 0.9,
    "signal_tau": None,
    "k_min": 6,
    "s_max": 64,
}
PERIODIC_PARAMS: dict[str, Any] = {"period": 4, "skip_k": 6}


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def sdd_rules(p: dict[str, Any]) -> tuple[Rule, Rule]:
    """(sampling rule, greedy rule) for ``accept``; constructing them validates ℓ, k, θ."""
    accept = p["accept"]
    if accept == "exact":
        return Exact(), Greedy()
    if accept == "lenience":
        return Lenience(p["ell"]), Lenience(p["ell"], greedy=True)
    if accept == "topk":
        return TopK(p["accept_k"]), TopK(p["accept_k"], greedy=True)
    if accept == "nucleus":
        return Nucleus(p["theta"]), Nucleus(p["theta"], greedy=True)
    raise RelaxSpecError(f"accept must be one of {', '.join(ACCEPT_RULES)}, got {accept!r}")


def _validate_base(p: dict[str, Any]) -> None:
    gamma, steps = p["gamma"], p["steps"]
    if gamma is not None and (not _is_int(gamma) or gamma < 1):
        raise RelaxSpecError(f"gamma (diffusion block length) must be an integer >= 1, got {gamma!r}")
    if steps is not None and (not _is_int(steps) or steps < 1 or (gamma is not None and steps > gamma)):
        bound = f"[1, gamma={gamma}]" if gamma is not None else ">= 1"
        raise RelaxSpecError(f"steps (denoising steps) must be an integer in {bound}, got {steps!r}")
    if p["reveal"] not in REVEAL_ORDERS:
        raise RelaxSpecError(f"reveal must be one of {', '.join(REVEAL_ORDERS)}, got {p['reveal']!r}")
    if not isinstance(p["shadow"], bool):
        raise RelaxSpecError(f"shadow must be true or false, got {p['shadow']!r}")
    sdd_rules(p)


def _check_k_min(k_min: Any, gamma: int | None) -> None:
    if gamma is not None and _is_int(k_min) and k_min > gamma:
        raise RelaxSpecError(f"k_min ({k_min}) cannot exceed gamma ({gamma}): no skip could ever qualify")


def _validate_skip(p: dict[str, Any]) -> None:
    _validate_base(p)
    if p["signal"] not in SIGNALS:
        raise RelaxSpecError(f"signal must be one of {', '.join(SIGNALS)}, got {p['signal']!r}")
    _check_k_min(p["k_min"], p["gamma"])
    if not _is_int(p["s_max"]):
        raise RelaxSpecError(f"s_max must be an integer, got {p['s_max']!r}")
    ConfidenceSkip(p["tau"], k_min=p["k_min"], s_max=p["s_max"], signal_tau=p["signal_tau"])


def _validate_periodic(p: dict[str, Any]) -> None:
    _validate_base(p)
    if p["gamma"] is not None and _is_int(p["skip_k"]) and p["skip_k"] > p["gamma"]:
        raise RelaxSpecError(f"skip_k ({p['skip_k']}) cannot exceed gamma ({p['gamma']})")
    Periodic(p["period"], p["skip_k"])


def make_signal(name: str, survival: SurvivalPredictor | None, method: str = "sdd-skip") -> Signal:
    """The prefix-gate signal ``name``; learned signals need a trained survival predictor."""
    if name == "raw":
        return RawConfidence()
    if survival is None:
        raise RelaxSpecError(
            f"signal {name!r} of method {method!r} needs a trained survival predictor: run "
            "`relaxspec train survival` or pass --survival DIR"
        )
    return MarginalSurvival(survival) if name == "marginal" else ConditionalSurvival(survival)


def build_sdd(models: ModelSet, p: dict[str, Any], scheduler: Scheduler, method: str = "sdd") -> Engine:
    """An SDD engine: diffusion proposer, target verifier, ``accept`` rules, ``scheduler``."""
    target, diffusion = models.require("target", method), models.require("diffusion", method)
    check_compatible(target.model, diffusion.model, "diffusion drafter")
    check_same_tokenizer(target.tokenizer, diffusion.tokenizer, "diffusion drafter")
    proposer = DiffusionProposer(diffusion.model, p["gamma"], p["steps"], p["reveal"])
    rule, greedy_rule = sdd_rules(p)
    return Engine(
        target.model,
        target.tokenizer,
        proposer=proposer,
        rule=rule,
        greedy_rule=greedy_rule,
        scheduler=scheduler,
        k=proposer.gamma,
        shadow=target.model if p["shadow"] else None,
    )


def _build_skip(models: ModelSet, p: dict[str, Any]) -> Engine:
    signal = make_signal(p["signal"], models.survival)
    scheduler = ConfidenceSkip(
        p["tau"], k_min=p["k_min"], s_max=p["s_max"], signal=signal, signal_tau=p["signal_tau"]
    )
    engine = build_sdd(models, p, scheduler, "sdd-skip")
    _check_k_min(p["k_min"], engine.proposer.gamma)
    if p["signal"] != "raw":
        hidden = engine.proposer.lm.model.config.hidden_size
        if models.survival.config.hidden_size != hidden:
            raise RelaxSpecError(
                f"the survival predictor was trained on drafter hidden states of size "
                f"{models.survival.config.hidden_size}, this drafter has {hidden}"
            )
    return engine


def _build_periodic(models: ModelSet, p: dict[str, Any]) -> Engine:
    engine = build_sdd(models, p, Periodic(p["period"], p["skip_k"]), "sdd-periodic")
    if p["skip_k"] > engine.proposer.gamma:
        raise RelaxSpecError(f"skip_k ({p['skip_k']}) cannot exceed gamma ({engine.proposer.gamma})")
    return engine


register(
    MethodSpec(
        "sdd",
        "Strict speculative diffusion decoding: diffusion-drafted blocks, every block verified",
        ("target", "diffusion"),
        dict(BASE_PARAMS),
        lambda models, p: build_sdd(models, p, Strict()),
        _validate_base,
    )
)
register(
    MethodSpec(
        "sdd-skip",
        "SDD with confidence-guided verifier skipping (signal raw | marginal | conditional)",
        ("target", "diffusion"),
        {**BASE_PARAMS, **SKIP_PARAMS},
        _build_skip,
        _validate_skip,
        optional=("survival",),
    )
)
register(
    MethodSpec(
        "sdd-periodic",
        "SDD that commits skip_k draft tokens unverified every period rounds (baseline)",
        ("target", "diffusion"),
        {**BASE_PARAMS, **PERIODIC_PARAMS},
        _build_periodic,
        _validate_periodic,
    )
)


# ---------------------------------------------------------------------------------------------
# Training prompts and the operating-point sweep
# ---------------------------------------------------------------------------------------------

SWEEP_MATH_START = 150_000  # math training seeds used for prompts (inside the training range)
STOP = ("\nQuestion:",)  # as in the math evaluation: stop before the model invents a new problem


def training_prompts(
    corpus_dir: str | Path,
    n_math: int,
    n_code: int,
    math_start: int = SWEEP_MATH_START,
    code_chars: int = 600,
) -> list[str]:
    """Prompts from the *training* splits only: math training seeds and code training modules.

    Never the evaluation sets (held-out seed range, held-out modules, HumanEval).
    """
    from relaxspec.data.corpus import read_jsonl
    from relaxspec.data.mathgen import train_problems

    if n_math < 0 or n_code < 0 or n_math + n_code < 1:
        raise RelaxSpecError("ask for at least one training prompt (n_math, n_code >= 0)")
    prompts = [p.prompt for p in train_problems(n_math, start=math_start)] if n_math else []
    if n_code:
        rows = read_jsonl(Path(corpus_dir) / "code_train.jsonl")
        rows = [r for r in rows if len(r["text"]) >= 2 * code_chars]
        step = max(1, len(rows) // n_code)
        for r in rows[::step][:n_code]:
            cut = r["text"][:code_chars]
            prompts.append(cut[: cut.rfind("\n") + 1] or cut)
    return prompts


def _run(engine: Engine, prompts: list[str], params: SamplingParams) -> dict[str, float]:
    tokens = calls = draft_calls = 0
    seconds = 0.0
    for prompt in prompts:
        s = engine.generate(prompt, params).stats
        tokens += s.new_tokens
        calls += s.verifier_calls
        draft_calls += s.draft_calls
        seconds += s.total_seconds
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / max(seconds, 1e-9),
        "tau": tokens / max(calls, 1),
        "draft_calls_per_token": draft_calls / max(tokens, 1),
    }


def sweep_operating_points(
    target: LoadedModel,
    diffusion: LoadedModel,
    gammas: list[int],
    steps: list[int],
    prompts: list[str],
    max_new_tokens: int = 128,
    write_to: str | Path | None = None,
    progress: bool = True,
) -> dict:
    """Strict-SDD (greedy) τ and throughput for every (γ, S) with S ≤ γ, vs AR in the same run.

    Chooses the fastest point (ties: higher τ). With ``write_to`` (the drafter's directory) it
    writes ``sweep.json``, sets ``diffusion_gamma``/``diffusion_steps`` in its config.json (the
    presets' defaults) and rewrites the model card.
    """
    from relaxspec.methods import build_engine

    if not prompts:
        raise RelaxSpecError("the sweep needs at least one prompt")
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, seed=0, stop=STOP)
    models = ModelSet(target=target, diffusion=diffusion)
    ar = build_engine("ar", models)
    ar.generate(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=8))  # warm-up
    started = time.perf_counter()
    ar_stats = _run(ar, prompts, params)
    rows = []
    for gamma in gammas:
        for s in steps:
            if s > gamma:
                continue
            engine = build_engine("sdd", models, gamma=gamma, steps=s)
            row = {"gamma": gamma, "steps": s, **_run(engine, prompts, params)}
            row["speedup"] = row["tokens_per_s"] / ar_stats["tokens_per_s"]
            rows.append(row)
            if progress:
                print(
                    f"gamma={gamma:3d} S={s:2d}  tau={row['tau']:.2f}  {row['tokens_per_s']:.1f} tok/s  "
                    f"speedup={row['speedup']:.2f}",
                    flush=True,
                )
    if not rows:
        raise RelaxSpecError("no (gamma, steps) pair with steps <= gamma to sweep")
    best = max(rows, key=lambda r: (r["tokens_per_s"], r["tau"]))
    result = {
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "ar_tokens_per_s": ar_stats["tokens_per_s"],
        "rows": rows,
        "chosen": {"gamma": best["gamma"], "steps": best["steps"]},
        "criterion": "highest strict-SDD throughput (ties: higher tau)",
        "wall_seconds": time.perf_counter() - started,
    }
    if write_to is not None:
        from relaxspec.train.diffusion import write_card

        out = Path(write_to)
        (out / "sweep.json").write_text(json.dumps(result, indent=1))
        cfg_path = out / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg[CFG_GAMMA], cfg[CFG_STEPS] = best["gamma"], best["steps"]
        cfg_path.write_text(json.dumps(cfg, indent=2))
        write_card(out)
    return result
