#!/usr/bin/env bash
# ON the CUDA machine, after build-wheel.sh and model.sh: quantize the benchmark
# model to Q4_K_M (once), then measure the service against raw llama-cpp-python
# with every layer on the GPU, in both KV cache layouts, and llama-bench and
# llama-batched-bench where they were built, the real-traffic runs of issue 28
# beside llama-server, and the compute buffer CUDA reserves. About 8 minutes.
#
#   scripts/cuda/bench.sh [bench.generate flags]
#   scripts/cuda/bench.sh sampling     # issue 39's rows alone (see below)
#
# Figures go to stdout and, where the device tool gives one, to $OUT.
# MODEL_TYPE picks another llama.cpp file type (default Q4_K_M); BENCH_TOOLS=0 skips
# llama-bench and llama-batched-bench; RUNS (5) sets the medians' runs; KV_LAYOUTS
# ("unified per-sequence") and STREAM_INTERVALS ("1", e.g. "1 4") pick the service
# configurations, each run once. MIXED=0 skips the mixed-traffic run (issue 28's 3x,
# about 3 minutes with llama-server).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/cuda/env.sh
. "$root/scripts/cuda/env.sh"  # includes the libstdc++ LD_PRELOAD workaround
cd "$root"
python=${PYTHON:-python3}
type=${MODEL_TYPE:-Q4_K_M}
f16=$CUDA_DIR/models/llama-1b-f16.gguf
model=$CUDA_DIR/models/llama-1b-${type,,}.gguf
out=${OUT:-$CUDA_DIR/results}
mkdir -p "$out"

if [ ! -f "$model" ]; then
    [ -f "$f16" ] || { echo "no $f16: run scripts/cuda/model.sh first" >&2; exit 1; }
    "$python" -m bench.gpu_model "$model" --from "$f16" --type "$type" 2>"$out/quantize.log" \
        || { tail -20 "$out/quantize.log"; exit 1; }
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
echo "LD_PRELOAD=${LD_PRELOAD:-}"
"$python" -c 'from service.backends.llama_cpp import log as llama_log; print("llama.cpp log filter:", llama_log.FILTER)'
# The compute buffer CUDA reserves at the GPU's default step (1,024 tokens), beside the
# service's estimate of it (MemoryEstimate.compute_bytes: 4 bytes x vocabulary x step).
"$python" - "$model" <<'PY' 2>&1 | grep -E "compute buffer size|estimate" || true
import sys
from pathlib import Path
import llama_cpp
from service.admission.describe import describe_gguf
from service.backends.names import GPU_BATCH_SIZE
estimate = describe_gguf(Path(sys.argv[1])).compute_bytes(GPU_BATCH_SIZE)
print(f"the service's estimate: {estimate / 2**20:.1f} MiB")
llama_cpp.Llama(sys.argv[1], n_gpu_layers=-1, n_ctx=4096, n_batch=GPU_BATCH_SIZE,
                n_ubatch=GPU_BATCH_SIZE, verbose=True)
PY

tools_dir=$CUDA_DIR/build
[ "${BENCH_TOOLS:-1}" = 0 ] && tools_dir=/nonexistent
server=$(find "$CUDA_DIR/build" -name llama-server -type f -perm -u+x 2>/dev/null | head -1 || true)
batched_bench=$(find "$tools_dir" -name llama-batched-bench -type f -perm -u+x 2>/dev/null | head -1 || true)

# `bench.sh sampling`: every row of issue 39 (sampling in llama.cpp's graph), alone,
# about 9 minutes. The ceiling is llama-batched-bench in the service's GPU layout (a
# cache per sequence) at the same lengths; then the service with --parallel-sequences
# 128 at 1, 32 and 128 streams of distinct ~155-token prompts and 128-token answers,
# greedy and sampled (T 0.8, top_p 0.95), with the draw in the graph and on the host,
# two rounds each (about 3 minutes); then mixed traffic beside llama-server without
# -kvu and with -kvu and its own backend sampling (about 6; four llama-server
# configurations did not fit a 10-minute call). SAMPLING_STREAMS=" " runs the mixed
# traffic alone; MIXED=0 leaves it out.
if [ "${1:-}" = sampling ]; then
    status=0
    for streams in ${SAMPLING_STREAMS:-1 32 128}; do
        prompts=$((streams * 2)); [ "$streams" = 1 ] && prompts=4
        timeout 420 "$python" -m bench.serving --model-path "$model" --gpu-layers -1 \
            --input-len 155 --output-len 128 --num-prompts "$prompts" --concurrency "$streams" \
            --parallel-sequences 128 --samplings greedy,sampled --sample-in-graph on,off \
            ${batched_bench:+--batched-bench "$batched_bench"} --out "$out/sampling-$streams" \
            2>"$out/sampling-$streams.err" | tee "$out/sampling-$streams.txt" \
            || { tail -20 "$out/sampling-$streams.err"; status=1; }
    done
    if [ "${MIXED:-1}" != 0 ]; then
        timeout 560 "$python" -m bench.serving --model-path "$model" --gpu-layers -1 \
            --input-len 100:2000 --output-len 32:512 --num-prompts 300 --concurrency 64 \
            --request-rate 14 --sample-in-graph on,off \
            ${server:+--llama-server "$server" --llama-server-variants "no-kvu;kvu+backend-sampling"} \
            --out "$out/sampling-mixed" 2>"$out/sampling-mixed.err" | tee "$out/sampling-mixed.txt" \
            || { tail -20 "$out/sampling-mixed.err"; status=1; }
    fi
    exit $status
fi
llama_bench=$(find "$tools_dir" -name llama-bench -type f -perm -u+x 2>/dev/null | head -1 || true)
if [ -n "$llama_bench" ]; then
    timeout 120 "$llama_bench" -m "$model" -ngl 99 -p 512 -n 128 -r 3 -o md 2>/dev/null \
        | tee "$out/llama-bench.md" || echo "llama-bench failed" >&2
fi

# llama.cpp's own batched decode loop in C++ (no sampling, nothing but llama_decode),
# with one KV cache shared by every sequence (-kvu, what the service uses) and with a
# cache of its own per sequence (-no-kvu): the ceiling for the concurrent-streams rows.
if [ -n "$batched_bench" ]; then
    for layout in -kvu -no-kvu; do
        echo "llama-batched-bench $layout"
        timeout 120 "$batched_bench" -m "$model" -ngl 99 -fa on -c 32768 -b 2048 -ub 512 \
            -npp 128 -ntg 128 -npl "${BATCHED_BENCH_STREAMS:-1,8,32,64,128}" "$layout" 2>"$out/batched-bench$layout.err" \
            | tee "$out/batched-bench$layout.md" || echo "llama-batched-bench $layout failed" >&2
    done
fi

# The service against raw llama-cpp-python, once per KV cache layout. Unified: one
# cache for every stream. Per-sequence: 2048 cells for each of the 128 + 4 sequences
# (about 8.5 GiB for this model).
if [ $# -gt 0 ]; then
    timeout 420 "$python" -m bench.generate --model-path "$model" "$@" \
        2>"$out/bench-generate.err" | tee "$out/bench-generate.txt" \
        || { tail -30 "$out/bench-generate.err"; exit 1; }
    exit 0
fi
status=0
for interval in ${STREAM_INTERVALS:-1}; do
    for layout in ${KV_LAYOUTS:-unified per-sequence}; do
        context=32768
        [ "$layout" = per-sequence ] && context=2048
        run=$out/$layout-interval$interval
        mkdir -p "$run"
        timeout 240 "$python" -m bench.generate --model-path "$model" --gpu-layers -1 \
            --runs "${RUNS:-5}" --max-tokens 128 --streams 1,8,32,64,128 --stream-tokens 128 \
            --bandwidth-gbs 4800 --kv-layout "$layout" --context-size "$context" \
            --stream-interval "$interval" --out "$run" \
            2>"$run/bench-generate.err" | tee "$run/bench-generate.txt" \
            || { tail -30 "$run/bench-generate.err"; status=1; }
    done
done
# llama.cpp's own server on the same model and prompts, greedy and sampled: the peer row
# (built when CUDA_CMAKE_ARGS has -DLLAMA_BUILD_SERVER=ON and LLAMA_TOOLS is ON).
if [ -n "$server" ]; then
    timeout 300 "$python" -m bench.llama_server --binary "$server" --model-path "$model" \
        --streams 1,8,32,64,128 --stream-tokens 128 --runs "${RUNS:-5}" \
        2>"$out/llama-server.err" | tee "$out/llama-server.txt" \
        || { tail -20 "$out/llama-server.err"; status=1; }
fi
# Real traffic (issue 28): distinct ~155-token prompts and 128-token answers at 32 and
# 128 streams through the service and llama-server, default settings apart from the
# sequence count and context (so a KV cache per sequence, as llama-server's slots
# without -kvu), then llama.cpp's batched loop at the same lengths in both layouts: the
# ceilings the service is measured against.
for streams in ${SERVING_STREAMS:-32 128}; do
    timeout 300 "$python" -m bench.serving --model-path "$model" --gpu-layers -1 \
        --input-len 155 --output-len 128 --num-prompts $((streams * 2)) --concurrency "$streams" \
        ${server:+--llama-server "$server"} ${batched_bench:+--batched-bench "$batched_bench"} \
        --out "$out/serving-$streams" \
        2>"$out/serving-$streams.err" | tee "$out/serving-$streams.txt" \
        || { tail -20 "$out/serving-$streams.err"; status=1; }
done
if [ -n "$batched_bench" ]; then
    for layout in -kvu -no-kvu; do
        timeout 120 "$batched_bench" -m "$model" -ngl 99 -fa on -c 65536 -b 2048 -ub 512 "$layout" \
            -npp 155 -ntg 128 -npl "${SERVING_STREAMS_LIST:-32,128}" \
            2>"$out/batched-bench-serving$layout.err" | tee "$out/batched-bench-serving$layout.md" \
            || echo "llama-batched-bench $layout (serving) failed" >&2
    done
fi
# Mixed traffic past saturation (prompts 100-2,000 tokens, answers 32-512, 64 in flight,
# 14 requests/s), both servers: issue 28's 3x llama-server, side by side.
if [ "${MIXED:-1}" != 0 ]; then
    timeout 420 "$python" -m bench.serving --model-path "$model" --gpu-layers -1 \
        --input-len 100:2000 --output-len 32:512 --num-prompts 400 --concurrency 64 \
        --request-rate 14 ${server:+--llama-server "$server"} --out "$out/serving-mixed" \
        2>"$out/serving-mixed.err" | tee "$out/serving-mixed.txt" \
        || { tail -20 "$out/serving-mixed.err"; status=1; }
fi
exit $status
