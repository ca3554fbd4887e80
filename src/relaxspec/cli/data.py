"""``relaxspec data``: build the offline training corpus."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from relaxspec.cli.common import (
    data_app,
)


@data_app.command("build")
def data_build(
    out: Annotated[Path, typer.Option(help="corpus directory")] = Path("data/corpus"),
    n_math_train: int = 200_000,
    n_math_eval: int = 1_000,
    n_synthcode_train: Annotated[
        int | None, typer.Option(help="synthetic code tasks for training (default n_math_train / 2)")
    ] = None,
    n_math_broad_train: Annotated[
        int | None, typer.Option(help="broadened math problems for training (default n_math_train / 2)")
    ] = None,
) -> None:
    """Build the offline corpus (stdlib Python + synthetic math and code tasks) deterministically."""
    from relaxspec.data.corpus import CorpusConfig, build_corpus

    config = CorpusConfig(
        n_math_train=n_math_train,
        n_math_eval=n_math_eval,
        n_synthcode_train=n_synthcode_train,
        n_math_broad_train=n_math_broad_train,
    )
    manifest = build_corpus(out, config)
    print(json.dumps({k: v for k, v in manifest.items() if k != "heldout_modules"}, indent=1))
