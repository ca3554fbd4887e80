#!/bin/bash
# Contention benchmark (docs/performance.md §8): `ar` with no neighbour and beside one busy process
# pinned to a CPU, with the default threads/wait policy and with the old behaviour (2 spinning
# threads). Prints tok/s per run; REPEATS (default 2) rounds, interleaved.
set -u
RS=${RELAXSPEC:-relaxspec}
OUT=${OUT:-$(mktemp -d)}
run() {  # label, neighbours, env...
  local label=$1 bn=$2; shift 2
  local out=$OUT/$label-$RANDOM
  if ! env "$@" $RS bench --methods ar --dataset math --limit 4 --peers none --no-progress \
      --busy-neighbour "$bn" --out "$out" >/dev/null 2>"$out.err"; then
    echo "$label FAILED: $(tail -1 "$out.err")"; return
  fi
  python3 - "$label" "$out" <<'PY'
import json, sys
label, out = sys.argv[1], sys.argv[2]
rows = [r for r in map(json.loads, open(out + "/records.jsonl")) if "seconds" in r]
tokens = sum(r.get("new_tokens") or len(r.get("tokens", [])) for r in rows)
print(f"{label} {tokens / sum(r['seconds'] for r in rows):.1f} tok/s ({tokens} tokens)", flush=True)
PY
}
for rep in $(seq "${REPEATS:-2}"); do
  echo "round $rep, $(uptime | sed 's/.*load/load/')"
  run new-idle 0
  run new-busy1 1
  run old-idle 0 OMP_WAIT_POLICY=ACTIVE RELAXSPEC_THREADS=2
  run old-busy1 1 OMP_WAIT_POLICY=ACTIVE RELAXSPEC_THREADS=2
done
