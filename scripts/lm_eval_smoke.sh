#!/usr/bin/env bash
# lm-evaluation-harness against `relaxspec serve` (issue 36): its `local-completions` model runs a
# loglikelihood (multiple-choice) task and a generate_until task from scripts/lm_eval/ on the
# bundled models, with --batch_size 4 (four prompts per request), and prints the scores.
#
#   scripts/lm_eval_smoke.sh                 # METHOD=nsd by default; METHOD=ar|sd|... to compare
#
# lm-eval lives in a virtual environment of its own (never the project's): by default /tmp/lmeval,
#   python -m venv /tmp/lmeval && /tmp/lmeval/bin/pip install torch==2.13.0 'lm-eval[api]' transformers
# Nothing is fetched: the tasks read the local JSONL (dataset_path: json) and the tokenizer is
# models/target's; the hub is switched off.
set -euo pipefail
cd "$(dirname "$0")/.."

LMEVAL=${LMEVAL:-/tmp/lmeval}
RELAXSPEC=${RELAXSPEC:-relaxspec}  # the command (split on spaces), e.g. "python -m relaxspec.cli"
METHOD=${METHOD:-nsd}
PORT=${PORT:-8736}
LIMIT=${LIMIT:-}  # e.g. LIMIT=5: the first five documents of each task
OUT=${OUT:-results/lm_eval}

if [ ! -x "$LMEVAL/bin/lm-eval" ]; then
  echo "no lm-eval in $LMEVAL: python -m venv $LMEVAL && $LMEVAL/bin/pip install torch==2.13.0 'lm-eval[api]' transformers" >&2
  exit 2
fi

$RELAXSPEC serve --method "$METHOD" --port "$PORT" --log-level warning &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" 2>/dev/null; then
    break
  fi
  kill -0 "$server" 2>/dev/null || { echo "the server did not start" >&2; exit 1; }
  sleep 1
done

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_TRUST_REMOTE_CODE=0
args=(
  --model local-completions
  --model_args "model=relaxspec,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer_backend=huggingface,tokenizer=models/target,max_length=1024,max_retries=1"
  --tasks relaxspec_math_mc,relaxspec_math_gen
  --include_path scripts/lm_eval
  --batch_size 4
  --output_path "$OUT"
)
[ -n "$LIMIT" ] && args+=(--limit "$LIMIT")
echo "lm-eval $("$LMEVAL/bin/python" -c 'import importlib.metadata as m; print(m.version("lm-eval"))'), method $METHOD"
"$LMEVAL/bin/lm-eval" run "${args[@]}"
