#!/usr/bin/env bash
# Download the pinned llama-cpp-python sdist from PyPI and trim it to what a CUDA
# build needs, so it can travel to the GPU machine (at most 64 MiB of carried files).
#
#   scripts/cuda/fetch-sdist.sh [OUT.tgz]    default: .device/llama-cpp-python-cuda-src.tgz
#
# Dropped: .git/ (a 38 MB pack), vendor/llama.cpp/{docs,benches,media}, and every
# vocabulary GGUF except ggml-vocab-llama-bpe.gguf (the Llama 3 tokenizer, which
# bench/gpu_model.py copies into its benchmark model). The 73 MiB sdist packs to ~14 MB.
set -euo pipefail

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
KEEP_VOCAB=ggml-vocab-llama-bpe.gguf

root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/.device/llama-cpp-python-cuda-src.tgz}
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" -m pip download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$work"
sdist="$work/llama_cpp_python-$VERSION.tar.gz"
echo "$SHA256  $sdist" | sha256sum --check --quiet

tar -xzf "$sdist" -C "$work"
src="$work/llama_cpp_python-$VERSION"
vendor="$src/vendor/llama.cpp"
rm -rf "$src/.git" "$vendor/docs" "$vendor/benches" "$vendor/media"
find "$vendor/models" -name '*.gguf' ! -name "$KEEP_VOCAB" -delete
[ -f "$vendor/models/$KEEP_VOCAB" ] || { echo "no $KEEP_VOCAB in the sdist" >&2; exit 1; }

mkdir -p "$(dirname "$out")"
tar -czf "$out" -C "$work" "llama_cpp_python-$VERSION"
size=$(stat -c %s "$out")
echo "$out: $((size / 1024 / 1024)) MiB ($size bytes), llama-cpp-python $VERSION"
if [ "$size" -ge $((48 * 1024 * 1024)) ]; then
    echo "too large to carry beside the wheels (limit 64 MiB in all)" >&2
    exit 1
fi
