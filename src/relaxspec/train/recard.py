"""``relaxspec train card``: record later metrics and rewrite any bundled model's card with the
writer of its kind (AR, block proposer, diffusion drafter). The only module that knows them all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from relaxspec.errors import RelaxSpecError
from relaxspec.train import ar, block, diffusion
from relaxspec.train.cards import record_metrics


def rewrite_card(
    model_dir: str | Path, metrics: dict[str, Any] | None = None, commands: list[str] | None = None
) -> Path:
    """Record ``metrics`` and rewrite the card with the writer of the model's kind (AR, block, diffusion)."""
    d = Path(model_dir)
    if not (d / "config.json").is_file():
        raise RelaxSpecError(f"{d} is not a model directory (no config.json)")
    record_metrics(d, metrics, commands)
    config = json.loads((d / "config.json").read_text())
    if "mars_block_size" in config:
        return block.write_model_card(d)
    if "diffusion_format" in config:
        return diffusion.write_card(d)
    return ar.write_model_card(d)
