#!/usr/bin/env bash
# ON the CUDA machine: write the Llama-3.2-1B-shaped benchmark model (random F16
# weights, Llama 3's vocabulary from the sdist) to .device/cuda/models/, once.
# Needs only the carried wheels (gguf, numpy), so it can run beside the build:
# `make -j2 cuda-llama cuda-model`. About 30 s and 2.5 GB. MODEL_SHAPE=tiny
# writes a 40 MB stand-in under the same name, for a smoke test of the scripts.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/cuda/env.sh
. "$root/scripts/cuda/env.sh"
python=${PYTHON:-python3}
f16=$CUDA_DIR/models/llama-1b-f16.gguf
vocab=$CUDA_DIR/src/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf

[ -f "$vocab" ] || { echo "no $vocab: run scripts/cuda/build-wheel.sh --deps-only first" >&2; exit 1; }
mkdir -p "$(dirname "$f16")"
if [ -f "$f16" ]; then
    echo "$f16 is there already"
else
    nice -n 5 "$python" -m bench.gpu_model "$f16.partial" --vocab "$vocab" \
        --shape "${MODEL_SHAPE:-1b}" --type F16
    mv "$f16.partial" "$f16"
fi
