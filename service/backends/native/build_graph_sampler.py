"""Build graph_sampler.c against the llama.cpp that llama-cpp-python installed.

    python -m service.backends.native.build_graph_sampler

It needs llama.h, ggml.h and libllama from that install, which setuptools' build of
the package (isolated, before the dependencies exist) cannot see, so `make install`
runs this after `pip install`, and scripts/cuda/build-wheel.sh after its CUDA build.
The library lands beside this file; where it cannot be built the step's sampling
stays on the host (service.backends.native.graph_sampler.available() is False).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "graph_sampler.c"
TARGET = HERE / "_graph_sampler.so"


def llama_paths() -> tuple[Path, Path]:
    """(the headers' folder, the libraries' folder) of the installed llama-cpp-python."""
    import llama_cpp

    package = Path(llama_cpp.__file__).resolve().parent
    return package.parent / "include", package / "lib"


def build() -> Path:
    include, libraries = llama_paths()
    if not (include / "llama.h").is_file():
        raise FileNotFoundError(f"llama.h is not in {include}: llama-cpp-python installed none")
    compiler = os.environ.get("CC") or shutil.which("cc") or "gcc"
    command = [
        compiler,
        "-O2",
        "-shared",
        "-fPIC",
        f"-I{include}",
        str(SOURCE),
        f"-L{libraries}",
        "-lllama",
        "-lggml-base",
        "-ldl",
        f"-Wl,-rpath,{libraries}",
        "-o",
        str(TARGET),
    ]
    subprocess.run(command, check=True)
    return TARGET


def main() -> int:
    try:
        print(f"built {build()}")
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"graph_sampler.c not built ({exc}): sampling stays on the host", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
