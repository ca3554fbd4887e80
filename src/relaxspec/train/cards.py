"""Model cards: the ``README.md`` next to every bundled model's weights (DESIGN §5).

A card records what a user needs to trust and reproduce a model: its architecture and size, the
data and tokens it saw, the wall time and the exact command, and the measured metrics with the
commands that measured them. The training facts come from the ``training.json`` each export
writes; the metrics are passed in by whoever measured them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _table(rows: dict[str, Any]) -> list[str]:
    lines = ["| | |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in rows.items()]
    return lines


def write_card(
    model_dir: str | Path,
    title: str,
    summary: str,
    commands: list[str],
    metrics: dict[str, Any] | None = None,
    metric_commands: list[str] | None = None,
    notes: str = "",
) -> Path:
    """Write ``model_dir/README.md`` from its ``training.json`` plus the given metrics."""
    d = Path(model_dir)
    record = json.loads((d / "training.json").read_text()) if (d / "training.json").is_file() else {}
    config = json.loads((d / "config.json").read_text())
    arch = {
        k: config[k]
        for k in (
            "model_type",
            "hidden_size",
            "num_hidden_layers",
            "intermediate_size",
            "num_attention_heads",
            "vocab_size",
            "max_position_embeddings",
        )
        if k in config
    }
    train = {
        "parameters": f"{record['parameters'] / 1e6:.2f}M" if "parameters" in record else "?",
        "tokens seen": f"{record['tokens_seen'] / 1e6:.2f}M" if "tokens_seen" in record else "?",
        "wall time": f"{record['wall_seconds'] / 60:.0f} min" if "wall_seconds" in record else "?",
        "optimizer steps": record.get("checkpoint_step", "?"),
        "training complete": record.get("complete", "?"),
        "data mixture": record.get("mixture", "?"),
    }
    if "train_config" in record:
        tc = record["train_config"]
        train["batch × seq_len"] = (
            f"{tc.get('batch_size')} × {tc.get('seq_len')} (grad accum {tc.get('grad_accum')})"
        )
        train["lr schedule"] = (
            f"AdamW lr {tc.get('lr')}, warmup {tc.get('warmup')}, cosine to ×{tc.get('min_lr_ratio')}"
        )
    lines = [
        f"# {title}",
        "",
        summary,
        "",
        "## Architecture",
        "",
        *_table(arch),
        "",
        "## Training",
        "",
        *_table(train),
        "",
        "Command:",
        "",
        "```bash",
        *commands,
        "```",
        "",
    ]
    if metrics:
        lines += ["## Metrics", "", *_table(metrics), ""]
        if metric_commands:
            lines += ["Measured with:", "", "```bash", *metric_commands, "```", ""]
    history = record.get("history") or []
    if history:
        keys = [k for k in history[-1] if k not in ("step", "tokens")]
        lines += [
            "## Held-out loss during training",
            "",
            "| step | tokens | " + " | ".join(keys) + " |",
            "|---|---|" + "---|" * len(keys),
        ]
        lines += [
            f"| {h['step']} | {h['tokens'] / 1e6:.1f}M | "
            + " | ".join(_fmt(h.get(k, "")) for k in keys)
            + " |"
            for h in history
        ]
        lines.append("")
    if notes:
        lines += ["## Notes", "", notes, ""]
    out = d / "README.md"
    out.write_text("\n".join(lines))
    return out
