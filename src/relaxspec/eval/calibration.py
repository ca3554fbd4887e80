"""Does a row sample the target's law? A calibration check of bench records (docs/results.md).

If a method is lossless at temperature T > 0, each token x_t it emits is a draw from p_t, the
target's processed law (temperature, top-k, top-p) given the prefix committed before it. Two
martingale differences of every emitted position then have mean zero given the past:

    D_t = 1{x_t = argmax p_t} − m_t,     Var_t = m_t (1 − m_t),           m_t = max_x p_t(x)
    E_t = p_t(x_t) − Σ_x p_t(x)²,        Var_t = Σ_x p_t(x)³ − (Σ_x p_t(x)²)²

Summed over the positions of independent generations (the bench gives each prompt its own sampler
seed, :func:`relaxspec.eval.bench.example_seed`), z = ΣD / √ΣVar is ≈ N(0, 1) for a lossless row
(martingale central limit theorem); a small two-sided p is evidence that the row does not sample
the target's law, and a token outside the law's support is proof. A relaxed rule is expected to
fail: ΣD / n is then how much more often than the target it emits the target's top token, a
distortion measured without any task checker. p_t comes from one teacher-forced forward of the
run's own target on its own kernels. A generation that ended at EOS gets its EOS back (it was
drawn); stop strings and token budgets are stopping times and need nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from relaxspec import atomic
from relaxspec.core.sampling import SamplingParams, processed_probs
from relaxspec.engine.kv import model_logits, new_cache
from relaxspec.engine.loop import default_eos_ids
from relaxspec.engine.packed import KERNELS
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.bench import progress_bar
from relaxspec.eval.datasets import Example, load_examples
from relaxspec.eval.records import load_manifest, load_records, model_fingerprint
from relaxspec.eval.rows import Cell, display_labels, records_by_cell
from relaxspec.methods import load_role
from relaxspec.models import LoadedModel

BINS = 5  # reliability table: positions by the target's top probability m_t, in fifths
ALPHA = 0.001  # a row departs from the target's law when either statistic's two-sided p is below
# Top-p mass a token may lie past the boundary and still count as inside the support: the run's
# incremental forwards and this check's one teacher-forced forward round differently (bf16 kernels)
SUPPORT_SLACK = 0.05


def _zeros() -> list[float]:
    return [0.0] * BINS


@dataclass
class Sums:
    """Running sums of one row's martingale terms over its emitted positions (add with ``+``)."""

    positions: int = 0
    argmax: float = 0.0  # Σ D_t
    argmax_var: float = 0.0  # Σ m_t (1 − m_t)
    mass: float = 0.0  # Σ E_t
    mass_var: float = 0.0  # Σ (Σ p³ − (Σ p²)²)
    outside: int = 0  # emitted tokens outside the support a lossless row may emit from
    bin_positions: list[float] = field(default_factory=_zeros)
    bin_hits: list[float] = field(default_factory=_zeros)  # Σ 1{x_t = argmax p_t} per bin of m_t
    bin_expected: list[float] = field(default_factory=_zeros)  # Σ m_t per bin

    def __add__(self, other: Sums) -> Sums:
        return Sums(
            self.positions + other.positions,
            self.argmax + other.argmax,
            self.argmax_var + other.argmax_var,
            self.mass + other.mass,
            self.mass_var + other.mass_var,
            self.outside + other.outside,
            [a + b for a, b in zip(self.bin_positions, other.bin_positions, strict=True)],
            [a + b for a, b in zip(self.bin_hits, other.bin_hits, strict=True)],
            [a + b for a, b in zip(self.bin_expected, other.bin_expected, strict=True)],
        )


def position_sums(probs: torch.Tensor, tokens: torch.Tensor, support: torch.Tensor | None = None) -> Sums:
    """The martingale terms of G positions: laws ``probs`` ``FloatTensor[G, V]``, emitted
    ``tokens`` ``LongTensor[G]`` (module docstring: D_t, E_t and their conditional variances).
    ``support`` ``BoolTensor[G, V]``: what a lossless row may emit (default ``probs > 0``)."""
    if probs.dim() != 2 or tokens.shape != probs.shape[:1]:
        raise RelaxSpecError(
            f"need probs [G, V] and tokens [G], got {tuple(probs.shape)} and {tuple(tokens.shape)}"
        )
    p = probs.double()
    support = probs > 0 if support is None else support
    m, top = p.max(dim=-1)
    hit = (tokens == top).double()
    px = p.gather(-1, tokens[:, None]).squeeze(-1)
    s2, s3 = (p * p).sum(-1), (p * p * p).sum(-1)
    which = torch.clamp((m * BINS).long(), max=BINS - 1)
    return Sums(
        positions=int(tokens.numel()),
        argmax=float((hit - m).sum()),
        argmax_var=float((m * (1 - m)).sum()),
        mass=float((px - s2).sum()),
        mass_var=float((s3 - s2 * s2).clamp(min=0).sum()),
        outside=int((~support.gather(-1, tokens[:, None])).sum()),
        bin_positions=torch.bincount(which, minlength=BINS).double().tolist(),
        bin_hits=torch.bincount(which, weights=hit, minlength=BINS).tolist(),
        bin_expected=torch.bincount(which, weights=m, minlength=BINS).tolist(),
    )


def _z_and_p(total: float, variance: float) -> tuple[float | None, float | None]:
    if variance <= 0:
        return None, None
    z = total / math.sqrt(variance)
    return z, math.erfc(abs(z) / math.sqrt(2))  # two-sided normal p


def summary(sums: Sums) -> dict[str, Any]:
    """The reported figures of one row: per-token excesses, z, two-sided p and a verdict."""
    n = max(sums.positions, 1)
    z_argmax, p_argmax = _z_and_p(sums.argmax, sums.argmax_var)
    z_mass, p_mass = _z_and_p(sums.mass, sums.mass_var)
    ps = [p for p in (p_argmax, p_mass) if p is not None]
    departs = sums.outside > 0 or any(p < ALPHA for p in ps)
    bins = [
        {"m_low": i / BINS, "m_high": (i + 1) / BINS, "positions": int(c),
         "argmax_share": h / c if c else None, "expected": e / c if c else None}
        for i, (c, h, e) in enumerate(zip(sums.bin_positions, sums.bin_hits, sums.bin_expected, strict=True))
    ]  # fmt: skip
    return {
        "positions": sums.positions,
        "argmax_excess": sums.argmax / n,
        "z_argmax": z_argmax,
        "p_argmax": p_argmax,
        "mass_excess": sums.mass / n,
        "z_mass": z_mass,
        "p_mass": p_mass,
        "outside_support": sums.outside,
        "verdict": "departs" if departs else ("consistent" if ps else "no sampled positions"),
        "bins": bins,
        "sums": asdict(sums),
    }


@torch.inference_mode()
def generation_logits(
    model: PreTrainedModel, prompt_ids: Sequence[int], tokens: Sequence[int]
) -> torch.Tensor:
    """``FloatTensor[G + 1, V]``: the target's logits after the prompt and after each of the G
    emitted ``tokens``, from one teacher-forced forward over ``[prompt | tokens]`` (row t scores
    ``tokens[t]``; row G a closing EOS)."""
    ids = torch.tensor([[*prompt_ids, *tokens]], dtype=torch.long)
    return model_logits(model, ids, new_cache(model), logits_to_keep=len(tokens) + 1)[0].cpu()


def record_sums(
    target: LoadedModel, prompt: str, record: dict[str, Any], against: float | None = None
) -> Sums:
    """The terms of one bench record's emitted tokens under ``target``'s law at the record's
    sampling settings (at temperature ``against`` instead of the record's, if given). A record
    that ended at EOS gets it back as its last drawn token (with several EOS ids, the one the
    target finds likeliest there). A token counts as outside the law's support only past the
    top-p boundary widened by :data:`SUPPORT_SLACK`."""
    sampling = record["cell"]["sampling"]
    params = SamplingParams(
        temperature=float(sampling["temperature"]) if against is None else against,
        top_k=int(sampling.get("top_k", 0)),
        top_p=float(sampling.get("top_p", 1.0)),
    )
    tokens = [int(t) for t in record["tokens"]]
    logits = generation_logits(target.model, target.tokenizer(prompt)["input_ids"], tokens)
    if (record.get("stats") or {}).get("finish_reason") == "eos":
        eos = default_eos_ids(target.model, target.tokenizer)
        if eos:
            tokens.append(max(eos, key=lambda i: float(logits[-1, i])))
    logits = logits[: len(tokens)]
    wide = replace(params, top_p=min(1.0, params.top_p + SUPPORT_SLACK))
    support = processed_probs(logits, wide) > 0
    return position_sums(processed_probs(logits, params), torch.tensor(tokens, dtype=torch.long), support)


# ---------------------------------------------------------------------------------------------
# A results directory


def _examples(dataset: str, ids: set[str]) -> dict[str, Example]:
    """The examples of ``dataset`` with these ids (a bench's first prompts, some maybe skipped)."""
    n = len(ids)
    while True:
        found = {ex.id: ex for ex in load_examples(dataset, n)}
        missing = sorted(ids - found.keys())
        if not missing:
            return found
        if len(found) < n or n > 4 * len(ids) + 1024:
            raise RelaxSpecError(
                f"dataset {dataset!r} does not hold example {missing[0]!r} of these results "
                f"({len(missing)} missing): were they written from another version of it?"
            )
        n *= 2


def _target(results_dir: Path, manifest: dict[str, Any], target_dir: Path | None) -> LoadedModel:
    """The run's target on the run's kernels; a model other than the run's is refused."""
    info = manifest["models"].get("target")
    if not info:
        raise RelaxSpecError(f"{results_dir}: the manifest names no target model")
    path = Path(target_dir or info["path"])
    if not path.is_dir():
        raise RelaxSpecError(f"target model {path} not found (pass --target where it is now)")
    if model_fingerprint(path) != info["fingerprint"]:
        raise RelaxSpecError(
            f"{path} is not the target these results were measured with (fingerprint differs)"
        )
    kernels = info.get("kernels") if info.get("kernels") in KERNELS else "auto"
    return load_role("target", path, kernels)


def sampled_records(results_dir: Path) -> tuple[dict[str, Cell], dict[str, list[dict[str, Any]]]]:
    """The sampling rows (T > 0) of a results directory, seeds pooled (:func:`records_by_cell`):
    their cells and latest error-free records, by pooled cell key."""
    cells, by_cell, _ = records_by_cell(load_records(results_dir), combine_seeds=True)
    rows = {
        key: [r for r in records if not r.get("error")]
        for key, records in by_cell.items()
        if float(cells[key].sampling.get("temperature", 0)) > 0
    }
    rows = {key: records for key, records in rows.items() if records}
    if not rows:
        raise RelaxSpecError(
            f"{results_dir}: no sampling rows (T > 0) to check; greedy rows are checked by agreement"
        )
    return {key: cells[key] for key in rows}, rows


def calibration_path(results_dir: str | Path, against: float | None = None) -> Path:
    """Where :func:`calibrate` writes its rows: one file per reference temperature."""
    name = "calibration.json" if against is None else f"calibration-at-T{against:g}.json"
    return Path(results_dir) / name


def calibrate(
    results_dir: str | Path,
    target_dir: Path | None = None,
    progress: bool = False,
    against: float | None = None,
) -> list[dict[str, Any]]:
    """Check every sampling row of a bench results directory against its target's law; the rows
    (module docstring) are returned and written to ``<results>/calibration.json``. ``against``:
    check every row against the law at that temperature instead of its own (same top-k / top-p),
    e.g. to express rows sampled at several temperatures as departures from one reference law;
    written to ``<results>/calibration-at-T<against>.json``."""
    if against is not None and not (isinstance(against, int | float) and 0 < against < math.inf):
        raise RelaxSpecError(f"the reference temperature must be a number > 0, got {against!r}")
    results_dir = Path(results_dir)
    cells, rows = sampled_records(results_dir)
    target = _target(results_dir, load_manifest(results_dir), target_dir)
    datasets = {r["cell"]["dataset"] for recs in rows.values() for r in recs}
    prompts = {
        d: _examples(d, {r["example"] for recs in rows.values() for r in recs if r["cell"]["dataset"] == d})
        for d in datasets
    }
    labels = display_labels(cells.values())
    out = []
    with progress_bar(progress) as bar:
        task = bar.add_task("calibration", total=sum(len(r) for r in rows.values()), cell="")
        for key, recs in rows.items():
            cell, sums = cells[key], Sums()
            for record in recs:
                bar.update(task, advance=1, cell=labels[cell.key])
                prompt = prompts[cell.dataset][record["example"]].prompt
                sums = sums + record_sums(target, prompt, record, against)
            out.append({**_row(cell, labels[cell.key], recs, sums), "law_temperature": against})
    atomic.write_json(calibration_path(results_dir, against), {"rows": out})
    return out


def _row(cell: Cell, label: str, records: Sequence[dict[str, Any]], sums: Sums) -> dict[str, Any]:
    return {
        "label": label,
        "method": cell.method,
        "params": cell.params,
        "dataset": cell.dataset,
        "sampling": cell.sampling,
        "generations": len(records),
        "seeds": sorted({int(r["cell"]["seed"]) for r in records}),
        **summary(sums),
    }


def calibration_table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table: one line per row, the two statistics and the verdict."""

    def z(v: float | None) -> str:
        return "–" if v is None else f"{v:+.2f}"

    w = max([3, *(len(r["label"]) for r in rows)])
    d = max([7, *(len(Path(r["dataset"]).name) for r in rows)])
    lines = [
        f"{'row':<{w}} {'dataset':<{d}} {'T':>4} {'law T':>5} {'top-p':>5} {'tokens':>7} "
        f"{'argmax excess':>13} {'z':>6} {'p(x) excess':>11} {'z':>6} {'outside':>7}  verdict"
    ]
    for r in rows:
        s, name = r["sampling"], Path(r["dataset"]).name
        law_t = s["temperature"] if r.get("law_temperature") is None else r["law_temperature"]
        lines.append(
            f"{r['label']:<{w}} {name:<{d}} {s['temperature']:>4g} {law_t:>5g} {s.get('top_p', 1.0):>5g} "
            f"{r['positions']:>7} {r['argmax_excess']:>+13.4f} {z(r['z_argmax']):>6} "
            f"{r['mass_excess']:>+11.4f} {z(r['z_mass']):>6} {r['outside_support']:>7}  {r['verdict']}"
        )
    lines.append(
        "(excess: per emitted token, over what the target's own law gives. For a lossless row each z "
        "is a standard normal draw and no token lies outside the law's support; 'departs' = a "
        f"two-sided p < {ALPHA:g} or a token outside it; 'consistent' = no departure measurable at this n)"
    )
    return "\n".join(lines)
