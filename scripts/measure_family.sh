#!/usr/bin/env bash
# The must-show measurements of issue 29 on a candidate family (a target and a draft distilled
# into it), every claim from one bench run with the same prompts across its rows, n prompts each
# (default 200), 95 % intervals, speed ratios from cells interleaved per prompt in the same run:
#   competence  greedy AR of the target on every held-out variant split, and of the draft on the
#               held-out code combinations and math seeds (the draft must sit >= 0.30 below);
#   t1-code     T = 1, top-p 0.95 on held-out code combinations: plain top-p AR, exact SD and NSD
#               over a theta sweep, with the papers' diagnostics (share of SD-rejected drafts in
#               the target's 0.95-nucleus; the issue asks >= 30 %);
#   greedy      greedy AR, SD and NSD (theta sweep) on held-out code combinations and math seeds.
# Usage: scripts/measure_family.sh TARGET DRAFT OUT [N (200)] [K (4)] [STAGES (competence,t1-code,greedy)]
# Every bench resumes when re-run with the same OUT; pin it to one core (taskset -c 0) and give it
# RELAXSPEC_THREADS=1 when anything else runs, and read its speed columns only from a quiet core.
set -euo pipefail
target=${1:?target model directory}
draft=${2:?draft model directory}
out=${3:?output directory}
n=${4:-200}
k=${5:-4}
stages=${6:-competence,t1-code,greedy}
thetas=0.5,0.8,0.95
common=(--peers none --target "$target" --draft "$draft" --limit "$n" --max-new-tokens 160)
mkdir -p "$out"
if [[ ,$stages, == *,competence,* ]]; then
    relaxspec bench --methods ar --dataset codevar,codevar-combos,codevar-phrasing,mathvar,mathvar-phrasing \
        "${common[@]}" --out "$out/competence-target"
    relaxspec bench --methods ar --dataset codevar-combos,mathvar --peers none --target "$draft" \
        --draft "$draft" --limit "$n" --max-new-tokens 160 --out "$out/competence-draft"
fi
if [[ ,$stages, == *,t1-code,* ]]; then
    relaxspec bench --methods ar,sd,nsd --set k="$k" --set nsd.theta="$thetas" --dataset codevar-combos \
        --temperature 1.0 --top-p 0.95 --diagnostics "${common[@]}" --out "$out/t1-code"
fi
if [[ ,$stages, == *,greedy,* ]]; then
    relaxspec bench --methods ar,sd,nsd --set k="$k" --set nsd.theta="$thetas" --dataset codevar-combos,mathvar \
        --diagnostics "${common[@]}" --out "$out/greedy"
fi
for d in "$out"/*/; do [ -f "$d/results.json" ] && python -m relaxspec.eval.regime "$d"; done
