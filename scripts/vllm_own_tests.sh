#!/usr/bin/env bash
# vLLM's own rejection-sampler tests, with and without relaxspec's plugin (issue 33).
#
# Downloads the vLLM 0.32.0 source distribution from PyPI (sha256-checked, cached in
# $VLLM_SRC_DIR, default /tmp/vllm-src; vLLM's code is never copied into this repository), then runs
# its tests/v1/sample/test_rejection_sampler.py twice in the installed vLLM:
#   stock:  VLLM_PLUGINS=none, i.e. the plugin not loaded;
#   plugin: vLLM's load_general_plugins(), which loads relaxspec (and any other installed plugin).
# Both runs first do what every vLLM CPU worker does at start (register the CPU kernel overrides);
# on GPU machines that is a no-op. It prints both pass counts and the tests whose outcome differs.
#
#   scripts/vllm_own_tests.sh                 # PYTHON=... to pick the interpreter
#   scripts/vllm_own_tests.sh -k synthetic    # extra arguments go to pytest (both runs)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
VERSION=0.32.0
URL=https://files.pythonhosted.org/packages/d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/vllm-$VERSION.tar.gz
SHA256=d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad
SRC=${VLLM_SRC_DIR:-/tmp/vllm-src}
TEST=tests/v1/sample/test_rejection_sampler.py

installed=$("$PYTHON" -c "import vllm; print(vllm.__version__)")
case "$installed" in
    "$VERSION"*) ;;
    *) echo "installed vLLM is $installed; these are vLLM $VERSION's tests" >&2; exit 2 ;;
esac

mkdir -p "$SRC"
archive="$SRC/vllm-$VERSION.tar.gz"
if ! echo "$SHA256  $archive" | sha256sum -c --quiet - 2>/dev/null; then
    # pip download would build vLLM's metadata (and its build dependencies) first; the file is enough
    curl -fsSL --retry 3 -o "$archive.part" "$URL"
    echo "$SHA256  $archive.part" | sha256sum -c --quiet -
    mv "$archive.part" "$archive"
fi
root="$SRC/vllm-$VERSION"
[ -f "$root/$TEST" ] || tar -xzf "$archive" -C "$SRC" "vllm-$VERSION/tests" "vllm-$VERSION/pyproject.toml"

# A pytest plugin that sets the process up like a vLLM worker (the test file builds vLLM's sampler
# directly, so nothing else would load plugins or the CPU kernel overrides).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/vllm_worker_setup.py" <<'EOF'
def pytest_configure(config):
    from vllm.platforms import current_platform
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # what a worker does first; VLLM_PLUGINS=none loads nothing
    current_platform.register_triton_kernel_overrides()
EOF

run() {  # run NAME [ENV=VALUE...]: results in $work/NAME.txt
    local name=$1
    shift
    (cd "$root" && env "$@" PYTHONPATH="$work:${PYTHONPATH:-}" "$PYTHON" -m pytest "$TEST" \
        --noconftest -p vllm_worker_setup -p no:cacheprovider -q -rA --tb=line "${PYTEST_ARGS[@]}") \
        >"$work/$name.log" 2>&1 || true
    grep -E '^(PASSED|FAILED|ERROR) ' "$work/$name.log" | sort >"$work/$name.txt" || true
    tail -1 "$work/$name.log"
}

PYTEST_ARGS=("$@")
echo "vLLM $installed, $TEST from the $VERSION sdist"
echo -n "stock  (VLLM_PLUGINS=none): "
run stock VLLM_PLUGINS=none
echo -n "plugin (relaxspec loaded):  "
run plugin -u VLLM_PLUGINS -u RELAXSPEC_VLLM_DISABLE
loaded=$(cd "$root" && PYTHONPATH="$work:${PYTHONPATH:-}" "$PYTHON" -c \
    "from vllm.plugins import load_general_plugins; load_general_plugins(); \
from relaxspec.integrations import vllm as p; print(p.is_registered())" 2>/dev/null | tail -1)
echo "relaxspec registered in the plugin run: $loaded"
for name in stock plugin; do
    echo "$name: $(grep -c '^PASSED' "$work/$name.txt" || true) passed, $(grep -c -E '^(FAILED|ERROR)' "$work/$name.txt" || true) failed"
done
echo "outcome differs (stock -> plugin):"
join -j 2 <(awk '{print $1, $2}' "$work/stock.txt" | sort -k2) <(awk '{print $1, $2}' "$work/plugin.txt" | sort -k2) |
    awk '$2 != $3 {print "  " $1 ": " $2 " -> " $3; n++} END {if (!n) print "  none"}'
[ -z "${KEEP_LOGS:-}" ] || cp "$work"/*.log "$KEEP_LOGS"/
