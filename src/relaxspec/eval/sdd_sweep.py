"""The SDD operating-point sweep (``relaxspec train diffusion-sweep``; VS paper §5): strict-SDD τ
and throughput for every (γ, S) against AR in the same run, on prompts from the *training* splits
(:func:`training_prompts`, also used for the survival trajectories).
"""

from __future__ import annotations

import time
from pathlib import Path

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine import Engine, GenerationStats
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ModelSet, build_engine
from relaxspec.models import LoadedModel

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
    total = GenerationStats()
    for prompt in prompts:
        total = total.merge(engine.generate(prompt, params).stats)
    return {
        "tokens": total.new_tokens,
        "seconds": total.total_seconds,
        "tokens_per_s": total.new_tokens / max(total.total_seconds, 1e-9),
        "tau": total.tau,
        "draft_calls_per_token": total.draft_calls / max(total.new_tokens, 1),
    }


def sweep_operating_points(
    target: LoadedModel,
    diffusion: LoadedModel,
    gammas: list[int],
    steps: list[int],
    prompts: list[str],
    max_new_tokens: int = 128,
    progress: bool = True,
) -> dict:
    """Strict-SDD (greedy) τ and throughput for every (γ, S) with S ≤ γ, vs AR in the same run.

    Chooses the fastest point (ties: higher τ); :func:`relaxspec.train.diffusion.record_sweep`
    stores it as the drafter's operating point.
    """
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
    return result
