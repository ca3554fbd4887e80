#!/usr/bin/env bash
# llama.cpp as a bench peer (issue 32; docs/performance.md, "llama.cpp beside us"): build its
# llama-server from the llama-cpp-python source distribution (PyPI is the only network needed) and
# convert the bundled target and draft to GGUF (bf16 and Q8_0), into DIR (default runs/llamacpp):
#
#   DIR/bin/llama-server   DIR/gguf/{target,draft}-{bf16,q8_0}.gguf
#
# Then, e.g. (one thread, pinned; our rows and llama.cpp's prompt by prompt in the same run):
#   taskset -c 0 relaxspec bench --threads 1 --methods sd --peers llamacpp-ar,llamacpp-sd \
#     --set llamacpp-ar.weights=bf16,q8_0 --dataset math --limit 40
#
# Building takes ~30 min on 2 cores (JOBS=2; one core: JOBS=1). Not part of CI. Rerunning skips
# what exists; MODELS=DIR converts other models (a target/ and draft/ inside).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-runs/llamacpp}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
JOBS=${JOBS:-2}
MODELS=${MODELS:-models}
mkdir -p "$DIR/src" "$DIR/bin" "$DIR/gguf"
SRC="$DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp"

if [ ! -x "$DIR/bin/llama-server" ]; then
  if [ ! -d "$SRC" ]; then
    python -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$DIR/src"
    tar xzf "$DIR/src/llama_cpp_python-$VERSION.tar.gz" -C "$DIR/src"
  fi
  # Not GGML_NATIVE: -march=native turns on AMX where the CPU lists it, and a VM that lists AMX
  # without enabling its tile state kills llama-server with SIGILL in the Q8_0 kernels
  # (tilezero in tinygemm_kernel_amx, found with gdb on this machine). AVX-512 where it exists.
  isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
  if grep -q avx512f /proc/cpuinfo; then
    isa+=(-DGGML_AVX512=ON)
    for f in vbmi vnni bf16; do grep -q "avx512_\?$f" /proc/cpuinfo && isa+=("-DGGML_AVX512_${f^^}=ON"); done
  fi
  grep -q avx_vnni /proc/cpuinfo && isa+=(-DGGML_AVX_VNNI=ON)
  cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF
  cmake --build "$SRC/build" --target llama-server -j "$JOBS"
  cp "$SRC/build/bin/llama-server" "$DIR/bin/"  # static: it runs from anywhere
fi

for role in target draft; do
  for weights in bf16 q8_0; do
    out="$DIR/gguf/$role-$weights.gguf"
    [ -f "$out" ] || python scripts/llamacpp_convert.py "$SRC" "$MODELS/$role" --outtype "$weights" --outfile "$out"
  done
done
echo "llama.cpp peer ready in $DIR: $(ls "$DIR/gguf" | tr '\n' ' ')"
