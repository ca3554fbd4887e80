#!/usr/bin/env bash
# GPU readiness in one go (issue 33, item 6): what a GPU machine runs whenever one is lent.
#
#   bash scripts/gpu_check.sh                  # OUT=results/gpu LIMIT=40 PYTHON=python
#
# 1. the machine (torch's device, vLLM's platform);
# 2. vLLM 0.32's own rejection-sampler tests with and without the plugin (scripts/vllm_own_tests.sh;
#    on GPU stock vLLM passes all of them, so the plugin must too);
# 3. plugin exactness and speed inside vLLM, greedy: `sd` and `nsd` beside stock vLLM AR and SD on
#    the bench's math prompts; exit 1 if greedy `sd` gives AR's text on fewer prompts than stock
#    vLLM SD does (the `= AR` column; both are exact, only near-ties of the numerics may differ)
#    or `nsd`'s τ is below `sd`'s;
# 4. the same at T = 1 with top-p 0.95 (speed and τ; no exactness check: sampling).
# Everything lands under $OUT (records, tables, JSON); the summary is the last lines printed.
# On a CPU-only machine it runs too (slowly): set LIMIT=4 to try it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-results/gpu}
LIMIT=${LIMIT:-40}
mkdir -p "$OUT"

echo "== 1. machine"
"$PYTHON" - <<'PY'
import torch
print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
from vllm.platforms import current_platform
print("vLLM platform:", current_platform.device_name)
PY

echo "== 2. vLLM's own rejection-sampler tests, with and without the plugin"
PYTHON="$PYTHON" bash scripts/vllm_own_tests.sh 2>&1 | tee "$OUT/vllm_own_tests.txt" | tail -8

bench() {  # name, extra args...
    local name=$1; shift
    "$PYTHON" -m relaxspec.cli bench --engine vllm --methods sd,nsd --peers vllm-ar,vllm-sd \
        --dataset math --limit "$LIMIT" --no-progress --out "$OUT/$name" "$@" \
        >"$OUT/$name.log" 2>&1 || { tail -20 "$OUT/$name.log"; exit 1; }
}
echo "== 3. greedy inside vLLM: exactness and speed ($LIMIT math prompts)"
bench greedy
echo "== 4. T = 1, top-p 0.95"
bench sampled --temperature 1 --top-p 0.95

"$PYTHON" - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
failed = []
for name in ("greedy", "sampled"):
    rows = {r["label"]: r for r in json.load(open(f"{out}/{name}/results.json"))["rows"]}
    print(f"{name}:")
    for label, r in rows.items():
        speed = f"{r['speedup']:.2f}x" if r.get("speedup") else "-"
        tau = f"{r['tau']:.2f}" if r.get("tau") else "-"
        same = f"{r['ar_identical']:.2f}" if r.get("ar_identical") is not None else "-"
        print(f"  {label:14s} {r['tokens_per_second']:8.1f} tok/s  {speed:>7s} vs AR  tau {tau:>5s}  = AR {same}")
    if name == "greedy":
        sd = next(r for label, r in rows.items() if label.startswith("sd"))
        nsd = next(r for label, r in rows.items() if label.startswith("nsd"))
        stock = next(r for label, r in rows.items() if label.startswith("vllm-sd"))
        # exact up to the numerics: never less often AR's text than stock vLLM's own SD
        if (sd.get("ar_identical") or 0) < (stock.get("ar_identical") or 0):
            failed.append(f"greedy sd = AR on {sd.get('ar_identical')}, stock SD on {stock.get('ar_identical')}")
        if (nsd.get("tau") or 0) < (sd.get("tau") or 0):
            failed.append(f"nsd's tau {nsd.get('tau')} is below sd's {sd.get('tau')}")
print("GPU check:", "PASSED" if not failed else "FAILED: " + "; ".join(failed))
sys.exit(1 if failed else 0)
PY
