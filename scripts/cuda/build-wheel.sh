#!/usr/bin/env bash
# ON the CUDA machine (no network): install the carried wheels, unpack the trimmed
# llama-cpp-python sdist, and build and install llama-cpp-python with CUDA, all
# into .device/cuda/site (a --target directory: the machine's python3 may lack
# venv). About 5 minutes with 16 cores; fits one 10-minute command.
#
#   scripts/cuda/build-wheel.sh [--deps-only]
#
# Needs, carried from here: .device/llama-cpp-python-cuda-src.tgz (fetch-sdist.sh)
# and .device/cuda-wheels/ (fetch-wheels.sh). Needs there: nvcc, cmake, ninja,
# scikit-build-core and numpy. A second run reuses the installed build.
# Overrides: CUDA_ARCHITECTURES (default 90, Hopper), LLAMA_TOOLS (ON: also
# llama-bench and llama-quantize), CUDA_CMAKE_ARGS (appended), FORCE=1 (rebuild).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/cuda/env.sh
. "$root/scripts/cuda/env.sh"
python=${PYTHON:-python3}
tarball=${LLAMA_SRC_TGZ:-$root/.device/llama-cpp-python-cuda-src.tgz}
wheels=${CUDA_WHEELS:-$root/.device/cuda-wheels}
src=$CUDA_DIR/src
log=$CUDA_DIR/build.log
start=$SECONDS
say() { echo "[build-wheel $((SECONDS - start))s] $*"; }

install_deps() {
    [ -f "$tarball" ] || { echo "missing $tarball: run scripts/cuda/fetch-sdist.sh here and carry it" >&2; exit 1; }
    compgen -G "$wheels/*.whl" >/dev/null || { echo "no wheels in $wheels: run scripts/cuda/fetch-wheels.sh and carry it" >&2; exit 1; }
    "$python" -c 'import numpy' || { echo "$python has no numpy (fetch-wheels.sh: WITH_NUMPY=1)" >&2; exit 1; }
    mkdir -p "$CUDA_SITE"
    if [ ! -f "$CUDA_SITE/.deps-installed" ]; then
        "$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$CUDA_SITE" "$wheels"/*.whl
        touch "$CUDA_SITE/.deps-installed"
    fi
    if [ ! -f "$src/pyproject.toml" ]; then
        rm -rf "$src" && mkdir -p "$src"
        tar -xzf "$tarball" -C "$src" --strip-components=1
    fi
    say "wheels installed in $CUDA_SITE; sources in $src"
}

has_cuda_llama() {
    "$python" -c 'import sys, llama_cpp; sys.exit(not llama_cpp.llama_supports_gpu_offload())' 2>/dev/null
}

build() {
    command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
    nvcc --version | tail -1
    local cmake_args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-90}"
    cmake_args+=" -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF"
    cmake_args+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF"
    cmake_args+=" -DLLAMA_BUILD_TOOLS=${LLAMA_TOOLS:-ON} ${CUDA_CMAKE_ARGS:-}"
    say "pip wheel, CMAKE_ARGS=$cmake_args"
    rm -rf "$CUDA_DIR/dist"
    if ! (cd "$src" && CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        timeout "${BUILD_TIMEOUT:-560}" "$python" -m pip wheel --no-deps --no-build-isolation \
        -C build-dir="$CUDA_DIR/build" -w "$CUDA_DIR/dist" . >"$log" 2>&1); then
        tail -40 "$log"
        [ -n "${OUT:-}" ] && cp "$log" "$OUT/"
        echo "build failed; the whole log is $log" >&2
        exit 1
    fi
    "$python" -m pip install --quiet --no-index --no-deps --no-compile --upgrade \
        --target "$CUDA_SITE" "$CUDA_DIR"/dist/llama_cpp_python-*.whl
    rm -rf "$CUDA_DIR/dist"  # 267 MB, and installed now
    say "built and installed"
}

# The C helpers in service/backends/native/ (llama.cpp's log filter, the batched
# sampler's draw), which `pip install` builds elsewhere; here the service runs from
# the tree, so compile them in place, as setup.py would.
build_native() {
    local suffix native=$root/service/backends/native
    suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
    cc -O2 -shared -fPIC -o "$native/_log_filter$suffix" "$native/log_filter.c"
    cc -O3 -ffp-contract=off -shared -fPIC -o "$native/_sampler$suffix" "$native/sampler.c" -lm
}

install_deps
build_native
[ "${1:-}" = "--deps-only" ] && exit 0
if [ "${FORCE:-0}" != 1 ] && has_cuda_llama; then
    say "a CUDA llama-cpp-python is already installed in $CUDA_SITE (FORCE=1 rebuilds)"
else
    build
fi
has_cuda_llama || { echo "llama_cpp imports but cannot offload to a GPU" >&2; exit 1; }
# Sampling inside llama.cpp's graph: against the CUDA build's own llama.h and libllama.
PYTHONPATH=$CUDA_SITE:$root "$python" -m service.backends.native.build_graph_sampler
"$python" -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__, "from", llama_cpp.__file__)'
ls "$CUDA_DIR/build/bin" 2>/dev/null | grep -E '^llama-(bench|quantize)$' || true
echo "start the service with:  . scripts/cuda/env.sh && python3 -m service.front --gpu-layers -1 ..."
