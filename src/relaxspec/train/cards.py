"""Model cards: the ``README.md`` next to every bundled model's weights (docs/design.md §5).

A card records what a user needs to trust and reproduce a model: its architecture and size, the
data and tokens it saw, the wall time and the exact command, and the measured metrics with the
commands that measured them. The training facts come from the ``training.json`` each export
writes; metrics measured later (``relaxspec eval``, ``bench``) are merged into that record, so
rewriting a card never loses them. Every model kind (AR, block proposer, diffusion drafter) writes
its card with :func:`write_card`, adding its own sections.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from relaxspec import atomic
from relaxspec.errors import RelaxSpecError

Section = tuple[str, list[str]]  # (heading, markdown lines)

_ARCH_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "vocab_size",
    "max_position_embeddings",
)


def fmt(value: Any) -> str:
    """Numbers to 4 significant digits, anything else as text."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(rows: dict[str, Any]) -> list[str]:
    """A two-column Markdown table."""
    return ["| | |", "|---|---|", *(f"| {k} | {fmt(v)} |" for k, v in rows.items())]


def training_rows(record: dict[str, Any]) -> dict[str, Any]:
    """The training facts of an export record (``training.json``)."""
    tc = record.get("train_config", {})
    steps = record.get("checkpoint_step", record.get("steps_done", "?"))
    rows: dict[str, Any] = {
        "parameters": f"{record['parameters'] / 1e6:.2f}M" if "parameters" in record else "?",
        "tokens seen": f"{record['tokens_seen'] / 1e6:.2f}M" if "tokens_seen" in record else "?",
        "wall time": f"{record['wall_seconds'] / 60:.0f} min" if "wall_seconds" in record else "?",
        "optimizer steps": f"{steps} of {tc.get('steps', '?')}",
        "data mixture": record.get("mixture", "?"),
    }
    if tc:
        rows["batch × seq_len"] = (
            f"{tc.get('batch_size')} × {tc.get('seq_len')} (grad accum {tc.get('grad_accum')})"
        )
        rows["optimizer"] = (
            f"AdamW lr {tc.get('lr')}, warmup {tc.get('warmup')}, cosine to ×{tc.get('min_lr_ratio')}"
            f", {tc.get('mixed_precision')} autocast"
        )
    return rows


def history_lines(history: list[dict[str, Any]]) -> list[str]:
    """Held-out evaluations during training as a table."""
    if not history:
        return []
    keys = [k for k in history[-1] if k not in ("step", "tokens")]
    lines = ["| step | tokens | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    lines += [
        f"| {h['step']} | {h.get('tokens', 0) / 1e6:.1f}M | "
        + " | ".join(fmt(h.get(k, "")) for k in keys)
        + " |"
        for h in history
    ]
    return lines


def read_record(path: Path) -> dict[str, Any]:
    """A model directory's ``training.json``; a corrupt one is one clear error."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        record = None
    if not isinstance(record, dict):
        raise RelaxSpecError(f"corrupted training record {path} (not a JSON object): restore or delete it")
    return record


def record_metrics(
    model_dir: str | Path, metrics: dict[str, Any] | None = None, commands: list[str] | None = None
) -> dict[str, Any]:
    """Merge ``metrics`` (and the ``commands`` that measured them) into ``training.json``."""
    record_path = Path(model_dir) / "training.json"
    record = read_record(record_path) if record_path.is_file() else {}
    if metrics or commands:
        record["metrics"] = {**record.get("metrics", {}), **(metrics or {})}
        record["metric_commands"] = list(
            dict.fromkeys([*record.get("metric_commands", []), *(commands or [])])
        )
        atomic.write_json(record_path, record)
    return record


def write_card(
    model_dir: str | Path,
    title: str,
    summary: str,
    sections: list[Section] | None = None,
    metrics: dict[str, Any] | None = None,
    metric_commands: list[str] | None = None,
) -> Path:
    """(Re)write ``model_dir/README.md``; ``metrics`` are merged into ``training.json`` first."""
    d = Path(model_dir)
    if not (d / "config.json").is_file():
        raise RelaxSpecError(f"{d} is not a model directory (no config.json)")
    record = record_metrics(d, metrics, metric_commands)
    config = json.loads((d / "config.json").read_text())
    lines = [
        f"# {title}",
        "",
        summary,
        "",
        "## Architecture",
        "",
        *table({k: config[k] for k in _ARCH_KEYS if k in config}),
        "",
        "## Training",
        "",
        *table(training_rows(record)),
        "",
    ]
    if record.get("command"):
        lines += ["Command:", "", "```bash", record["command"], "```", ""]
    for heading, body in sections or []:
        lines += [f"## {heading}", "", *body, ""]
    if record.get("metrics"):
        lines += ["## Metrics", "", *table(record["metrics"]), ""]
        if record.get("metric_commands"):
            lines += ["Measured with:", "", "```bash", *record["metric_commands"], "```", ""]
    if record.get("history"):
        lines += ["## Held-out loss during training", "", *history_lines(record["history"]), ""]
    out = d / "README.md"
    atomic.write_text(out, "\n".join(lines))
    return out
