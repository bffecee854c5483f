# Source on the CUDA machine, from the repository root: `. scripts/cuda/env.sh`.
# Puts the CUDA build of llama-cpp-python and the carried wheels (installed by
# build-wheel.sh into $CUDA_SITE) and this repository on PYTHONPATH, and works
# around the libstdc++ clash of docs/gpu.md: libggml-cuda.so exports about 3,400
# libstdc++ symbols of its own, and once protobuf's generated module is imported,
# loading a model segfaults in llama_model::print_info() unless the system
# libstdc++ is preloaded. Anything that starts the service or bench.generate
# needs it.

CUDA_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export CUDA_DIR=${CUDA_DIR:-$CUDA_ROOT/.device/cuda}
export CUDA_SITE=$CUDA_DIR/site
export PYTHONPATH=$CUDA_SITE:$CUDA_ROOT${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1

cuda_libstdcxx() {
    local candidate
    for candidate in /lib/x86_64-linux-gnu/libstdc++.so.6 /usr/lib64/libstdc++.so.6; do
        [ -e "$candidate" ] && { echo "$candidate"; return; }
    done
    /sbin/ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}'
}
CUDA_LIBSTDCXX=$(cuda_libstdcxx)
if [ -n "$CUDA_LIBSTDCXX" ]; then
    case ":${LD_PRELOAD:-}:" in
        *":$CUDA_LIBSTDCXX:"*) ;;
        *) export LD_PRELOAD=$CUDA_LIBSTDCXX${LD_PRELOAD:+:$LD_PRELOAD} ;;
    esac
else
    echo "env.sh: no system libstdc++.so.6 found; loading a model may segfault" >&2
fi
