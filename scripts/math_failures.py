"""Why a bench run's math answers are wrong (relaxspec.eval.math_failures), per method and dataset.

Usage: python scripts/math_failures.py RESULTS_DIR [RESULTS_DIR ...]
(directories that ``relaxspec bench --out`` wrote)
"""

from __future__ import annotations

import sys

from relaxspec.eval.math_failures import KINDS, bench_failures
from relaxspec.eval.records import load_records


def main(paths: list[str]) -> None:
    if not paths:
        sys.exit(__doc__)
    print(f"{'results':<28} {'method':<10} {'dataset':<18} {'wrong':>9}  " + "  ".join(KINDS))
    for path in paths:
        for (method, dataset), c in sorted(bench_failures(load_records(path)).items()):
            kinds = "  ".join(f"{c[k]:>{len(k)}}" for k in KINDS)
            print(f"{path[-28:]:<28} {method:<10} {dataset:<18} {c['wrong']:>4}/{c['total']:<4}  {kinds}")


if __name__ == "__main__":
    main(sys.argv[1:])
