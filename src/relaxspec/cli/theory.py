"""``relaxspec theory``: NSD's quantities (docs/design.md §3) for two distributions or along a
model pair's generation."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from relaxspec.cli.common import (
    DraftOpt,
    TargetOpt,
    app,
    role_dir,
)
from relaxspec.errors import RelaxSpecError


@app.command()
def theory(
    p: Annotated[str | None, typer.Option(help="target distribution, comma-separated")] = None,
    q: Annotated[str | None, typer.Option(help="proposal distribution, comma-separated")] = None,
    theta: float = 0.95,
    prompt: Annotated[
        str | None, typer.Option(help="with a model pair: analyse a generation of this prompt")
    ] = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    eps: Annotated[float | None, typer.Option(help="per-step TV bound ε for the certified horizon")] = None,
    delta_horizon: Annotated[float, typer.Option("--delta", help="coupling failure probability δ")] = 0.05,
) -> None:
    """NSD theory (docs/design.md §3): R, ES, TV, acceptance for p and q, or along a model-pair generation."""
    from relaxspec.eval.theory_report import theory_for_distributions, theory_for_models

    if prompt is not None:
        report = theory_for_models(
            role_dir(target, "target"),
            role_dir(draft, "draft"),
            prompt,
            theta,
            max_new_tokens,
            temperature,
            delta_horizon,
        )
    elif p is not None and q is not None:
        report = theory_for_distributions(p, q, theta, eps, delta_horizon)
    else:
        raise RelaxSpecError("give --p and --q (distributions), or --prompt (with a model pair)")
    print(json.dumps(report, indent=1))
