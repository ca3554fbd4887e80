"""``relaxspec theory``: the NSD identities (docs/design.md §3) for given distributions or a model pair."""

from __future__ import annotations

from pathlib import Path

import torch

from relaxspec.core.acceptance import Nucleus
from relaxspec.core.sampling import SamplingParams, processed_probs
from relaxspec.core.theory import certified_horizon, coupling_bound, emitted_distribution, position_report
from relaxspec.errors import RelaxSpecError

# How far from 1 a typed distribution may sum (rounded decimals such as 0.33,0.33,0.34 are fine);
# it is renormalised exactly. Further off is a typo, not a distribution.
SUM_TOLERANCE = 1e-2


def _parse_distribution(text: str, name: str) -> torch.Tensor:
    """``--p``/``--q``: comma-separated probabilities summing to 1 -> [V] float64, renormalised."""
    if not text.strip():
        raise RelaxSpecError(f"--{name} is empty")
    try:
        values = [float(x) for x in text.split(",")]  # an empty field ("0.5,,0.5") is an error
    except ValueError:
        raise RelaxSpecError(f"--{name} must be comma-separated numbers, got {text!r}") from None
    t = torch.tensor(values, dtype=torch.float64)
    if (t < 0).any() or not torch.isfinite(t).all() or t.sum() <= 0:
        raise RelaxSpecError(f"--{name} must be non-negative finite numbers with a positive sum")
    if abs(float(t.sum()) - 1.0) > SUM_TOLERANCE:
        raise RelaxSpecError(
            f"--{name} must be a probability distribution summing to 1, got sum {float(t.sum()):g}"
        )
    return t / t.sum()


def theory_for_distributions(p_text: str, q_text: str, theta: float, eps: float | None, delta: float) -> dict:
    """R, ES, TV(e, p), acceptance (SD and NSD) and the emitted law for one pair p, q."""
    p, q = _parse_distribution(p_text, "p"), _parse_distribution(q_text, "q")
    if p.shape != q.shape:
        raise RelaxSpecError(f"--p and --q must have the same length ({p.numel()} vs {q.numel()})")
    rep = {k: v.item() for k, v in position_report(p, q, theta).items()}
    rep["emitted_nsd"] = emitted_distribution(Nucleus(theta), p, q).tolist()
    eps = rep["total_variation"] if eps is None else eps
    rep["certified_horizon"] = _json_number(certified_horizon(eps, delta)) if eps < 1 else 0
    rep["coupling_bound_32"] = coupling_bound([eps] * 32)
    return {"theta": theta, "epsilon": eps, **rep}


def _json_number(x: float | int) -> float | int | str:
    return "inf" if x == float("inf") else x


def theory_for_models(
    target_dir: Path,
    draft_dir: Path,
    prompt: str,
    theta: float,
    max_new_tokens: int,
    temperature: float,
    delta: float,
) -> dict:
    """Per-position R, ES and TV along a target-sampled continuation of ``prompt``.

    The continuation is sampled from the target (seed 0); at each position ``p`` and ``q`` are the
    target's and the draft's processed next-token laws given the same prefix.
    """
    from relaxspec.methods import build_engine
    from relaxspec.models import load_model

    target, draft = load_model(target_dir), load_model(draft_dir)
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=0)
    result = build_engine("ar", target).generate(prompt, params)
    engine = build_engine("nsd", target, draft, theta=theta)
    ids = torch.cat([engine.encode(prompt), torch.tensor([result.tokens], dtype=torch.long)], dim=1)
    with torch.inference_mode():
        p = processed_probs(target.model(ids).logits[0, -len(result.tokens) - 1 : -1], params)
        q = processed_probs(draft.model(ids).logits[0, -len(result.tokens) - 1 : -1], params)
    rep = position_report(p.double(), q.double(), theta)
    tv = rep["total_variation"]
    return {
        "prompt": prompt,
        "theta": theta,
        "temperature": temperature,
        "text": result.text,
        "positions": [
            {k: v[i].item() for k, v in rep.items()} | {"token": result.tokens[i]}
            for i in range(len(result.tokens))
        ],
        "mean": {k: v.double().mean().item() for k, v in rep.items()},
        "coupling_bound": coupling_bound(tv.tolist()),
        "certified_horizon_at_max_tv": _json_number(
            certified_horizon(min(tv.max().item(), 1 - 1e-12), delta)
        ),
    }
