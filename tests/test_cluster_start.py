"""The launcher's start-up: a replica that dies before it serves fails the start at
once, and the message names it (rather than a timeout minutes later)."""

from __future__ import annotations

import re
import subprocess
import time

from tests.cluster_process import cluster_command


def test_a_replica_that_exits_at_start_fails_the_cluster_at_once_naming_it() -> None:
    command = cluster_command(replicas=2, server_args=["--no-such-flag"])
    began = time.monotonic()
    finished = subprocess.run(command, capture_output=True, text=True, timeout=110)
    assert finished.returncode != 0
    assert re.search(r"replica \S+ exited with status 2", finished.stderr), finished.stderr[-2000:]
    # START_TIMEOUT is 120 s: failing well inside it means it did not wait for it.
    assert time.monotonic() - began < 100, finished.stderr[-2000:]
