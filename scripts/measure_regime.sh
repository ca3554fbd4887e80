#!/usr/bin/env bash
# Is a target in the regime relaxed verification is for (issue 29)? On a model directory, or on the
# newest checkpoint of a training run directory (exported first), measure:
#   1. the regime: greedy-draft SD at T = 1 (top-p 0.95) on held-out code combinations with the
#      papers' diagnostics — share of SD-rejected tokens in the target's 0.95-nucleus and top 10,
#      extra acceptances by rank, target entropy — and the T = 1 pass@1 of AR beside it;
#   2. competence: the target's greedy pass@1 / exact match on every held-out variant split.
# Usage: scripts/measure_regime.sh MODEL_OR_RUN_DIR OUT_DIR [N_PROMPTS (default 40)] [DRAFT_DIR]
# Each bench resumes if re-run with the same OUT_DIR; run it pinned to one core (taskset -c 0).
set -euo pipefail
src=${1:?model directory or run directory}
out=${2:?output directory}
n=${3:-40}
draft=${4:-models/draft}
mkdir -p "$out"
if [ -d "$src/checkpoints" ]; then  # a run directory: export its newest checkpoint
    relaxspec train export --config target --run-dir "$src" --out "$out/model"
    src="$out/model"
fi
relaxspec bench --methods sd --set k=8 --dataset codevar-combos --limit "$n" --temperature 1.0 --top-p 0.95 \
    --diagnostics --peers none --max-new-tokens 160 --target "$src" --draft "$draft" --out "$out/regime-code-t1"
relaxspec bench --methods ar --dataset codevar,codevar-combos,codevar-phrasing,mathvar,mathvar-phrasing \
    --limit "$n" --peers none --max-new-tokens 200 --target "$src" --draft "$draft" --out "$out/quality-greedy"
python -m relaxspec.eval.regime "$out/regime-code-t1" "$out/quality-greedy"
