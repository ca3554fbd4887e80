"""Relaxed rules at T = 1 against exact SD at lower temperatures, in ONE interleaved bench run.

A relaxed rule that sharpens the target's law (``relaxspec calibrate``) gains T = 1 quality the way
a lower temperature does; this runs the T = 1 grid (AR, exact SD, the rules) and adds AR and exact SD
at each lower temperature as extra cells of the same run, so every speed ratio between them comes
from the same interleaved timings (docs/relaxed-rules.md, "The sharpening rules against exact SD at
a lower temperature"). Resumable like any bench run; read it with ``relaxspec report OUT``,
``relaxspec calibrate OUT --law-temperature 1``, or the summary this script prints.

Usage (one thread on an otherwise idle core):
  RELAXSPEC_THREADS=1 taskset -c 0 python scripts/rules_vs_lower_temperature.py \\
      --temperatures 0.9 --out results/rules-vs-T   [--limit 200 --seed 0 --drafter eagle --k 8]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from relaxspec.eval import rows as R
from relaxspec.eval.bench import BenchConfig, plan, run_bench
from relaxspec.eval.records import load_records

RULES = ["threshold", "topk-delta"]
RULE_SETS = ["threshold.single=0.3", "topk-delta.delta=0.05"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--temperatures", default="0.9", help="lower temperatures for AR and exact SD")
    ap.add_argument("--dataset", default="codevar-combos")
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--drafter", default="eagle")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    temps = [float(t) for t in args.temperatures.split(",")]
    config = BenchConfig(
        methods=["sd", *RULES], datasets=[args.dataset], limit=args.limit, temperature=1.0, top_p=0.95,
        seeds=[args.seed], max_new_tokens=160, peers=[], progress=False, out=args.out,
        sets=[f"drafter={args.drafter}", f"k={args.k}", *RULE_SETS],
        command=f"python scripts/rules_vs_lower_temperature.py --temperatures {args.temperatures} ...",
    )  # fmt: skip
    cells = plan(config)
    extra = [
        replace(c, sampling={**c.sampling, "temperature": t})
        for t in temps
        for c in cells
        if c.method in ("ar", "sd")
    ]
    run_bench(config, extra_cells=extra)
    summarize(args.out, min(temps))


def summarize(out: str, reference: float) -> None:
    """Each row's throughput, τ and pass@1, and its speed and Δ pass@1 against exact SD at ``reference``."""
    recs = [r for r in load_records(out) if r.get("type") == "record"]
    cells, by_cell, _ = R.records_by_cell(recs)
    names = {k: f"{R.label(c.method, {})} T={c.sampling['temperature']:g}" for k, c in cells.items()}
    base = next(k for k, n in names.items() if n == f"sd T={reference:g}")
    times = {k: R.timings(v) for k, v in by_cell.items()}
    figures = {k: R.per_prompt(v, {}) for k, v in by_cell.items()}
    for k, name in names.items():
        q = R.figure_interval(figures[k]["quality"], True)
        tau = R.merged_stats(r["stats"] for r in by_cell[k]).tau
        line = f"{name:<18} τ {tau:5.2f}  pass@1 {q['estimate']:.3f} [{q['low']:.3f}–{q['high']:.3f}]"
        if k != base:
            sp = R.speed_interval(times[k], times[base])
            d = R.paired_figures(figures[k], figures[base], "sd")["quality"]
            speed = f"{sp['estimate']:.3f}× [{sp['low']:.3f}–{sp['high']:.3f}]"
            delta = f"{d['delta']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
            line += f"  vs sd T={reference:g}: speed {speed}, Δ pass@1 {delta}"
        print(line)


if __name__ == "__main__":
    main()
