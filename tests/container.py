"""The container tier's prerequisites: an engine that runs containers, and the base image.

No test installs them (`make container-prerequisites` does, as root: podman from
Debian's packages, and the debootstrap base). Where one is missing the container tests
are skipped with the reason, outside CI; in CI (the environment variable CI set, as
`.ci/run` sets it) they fail instead, so that CI cannot pass without having run them.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

BASE = "localhost/inference-test-base:bookworm"
PREREQUISITES = "make container-prerequisites (as root) installs podman and makes the base image"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def missing(reason: str) -> None:
    """Skip the test, or fail it in CI, for a prerequisite that is not there."""
    message = f"{reason}; {PREREQUISITES}"
    if in_ci():
        pytest.fail(f"CI runs the container tier: {message}", pytrace=False)
    pytest.skip(message)


def container_engine() -> str:
    """podman, or docker with a daemon to talk to, that can run containers here."""
    found = [path for path in map(shutil.which, ("podman", "docker")) if path]
    for engine in found:
        if subprocess.run([engine, "info"], capture_output=True, check=False).returncode == 0:
            return engine
    if not found:
        missing("neither podman nor docker is installed")
    missing(f"{', '.join(found)} cannot run containers here (docker: is its daemon running?)")
    raise AssertionError("unreachable")  # missing() skips or fails


def base_image(engine: str) -> str:
    """The Debian bookworm base with Python that `make container-prerequisites` made."""
    probe = [engine, "image", "inspect", BASE]
    if subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        missing(f"the base image {BASE} is not there")
    return BASE
