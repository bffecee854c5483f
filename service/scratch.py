"""Scratch files, and the temporary directory the server may not have.

A container with a read-only root has no writable /tmp unless a volume is
mounted there. Serving text and embeddings needs none: what the server writes
for a moment (the probe file llama.cpp loads to say whether it knows an
architecture, the grammar parser's output) lives in memory (`memory_file`,
`memory_path`: a memfd on Linux), and falls back to the temporary directory
only where memfd is missing (macOS). What does need that directory (the
external image command's working folder) says so, naming the folders tried,
why each failed and what to do (`temporary_directory_problem`).

At start the server checks the directory an operator named (TMPDIR, TEMP or
TMP): one it cannot write is a configuration error, said at once, rather than
a silent fall back to /tmp (`check_temporary_directory`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

# The variables tempfile reads, in its order, then the folders it tries.
_VARIABLES = ("TMPDIR", "TEMP", "TMP")
_FOLDERS = ("/tmp", "/var/tmp", "/usr/tmp")
_FIX = (
    "set TMPDIR to a writable directory, or mount a writable volume at /tmp "
    "(in Kubernetes, an emptyDir)"
)


def _memfd(name: str) -> int | None:
    """A memfd, or None where the platform has none (or no /proc to name it by)."""
    create = getattr(os, "memfd_create", None)
    if create is None or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return int(create(name, os.MFD_CLOEXEC))
    except OSError:  # a seccomp profile may forbid it
        return None


def memory_file(name: str) -> BinaryIO:
    """A read-write file in memory, closed (and gone) when closed; a temporary file
    where memory files do not exist."""
    descriptor = _memfd(name)
    if descriptor is None:
        return tempfile.TemporaryFile()
    return os.fdopen(descriptor, "w+b")


@contextlib.contextmanager
def memory_path(name: str) -> Iterator[str]:
    """A path to an empty file in memory that this process may write and read by name
    (/proc/self/fd/N), gone after the block; a file in a temporary directory where
    memory files do not exist."""
    descriptor = _memfd(name)
    if descriptor is None:
        with tempfile.TemporaryDirectory(prefix=f"{name}-") as directory:
            yield os.path.join(directory, name)
        return
    try:
        yield f"/proc/self/fd/{descriptor}"
    finally:
        os.close(descriptor)


def _unusable(directory: str) -> str | None:
    """Why a file cannot be made in `directory`; None if one can."""
    try:
        descriptor, path = tempfile.mkstemp(prefix=".probe-", dir=directory)
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    os.close(descriptor)
    with contextlib.suppress(OSError):
        os.unlink(path)
    return None


def named_temporary_directory_problem() -> str | None:
    """Why the temporary directory an operator named (TMPDIR, else TEMP or TMP, as
    tempfile reads them) cannot be used, with the fix; None if none is named or it
    can be."""
    for variable in _VARIABLES:
        directory = os.environ.get(variable)
        if directory:
            why = _unusable(directory)
            if why is None:
                return None
            return f"the temporary directory {variable}={directory} cannot be used ({why}); {_FIX}"
    return None


def temporary_directory_problem() -> str | None:
    """None when there is a temporary directory to write in; else the folders tried,
    why each failed, and what to do."""
    try:
        tempfile.gettempdir()
        return None
    except FileNotFoundError:  # "No usable temporary directory found in [...]"
        pass
    tried = [(f"{v}={os.environ[v]}", os.environ[v]) for v in _VARIABLES if os.environ.get(v)]
    tried += [(folder, folder) for folder in _FOLDERS]
    with contextlib.suppress(OSError):
        tried.append((f"the working directory {os.getcwd()}", os.getcwd()))
    reasons = [f"{label}: {_unusable(folder) or 'usable now'}" for label, folder in tried]
    return f"no usable temporary directory ({'; '.join(reasons)}); {_FIX}"


def check_temporary_directory() -> str | None:
    """At start: SystemExit when the temporary directory an operator named cannot be
    used; a warning (returned) when there is none at all, which serving text and
    embeddings does not need; None when all is well."""
    named = named_temporary_directory_problem()
    if named is not None:
        raise SystemExit(f"cannot start: {named}")
    return temporary_directory_problem()
