"""Every hostile grammar and schema is accepted or refused, and the process lives.

The cases run in a child process (`python -m tests.hostile_grammars`), so that
a native crash or a stall fails this test instead of killing pytest: the child
writes a line before and after each case, and the last one it started names
the culprit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM
from tests.hostile_grammars import named_cases

REPO = Path(__file__).resolve().parent.parent
# Outcomes that keep the server whole: INVALID_ARGUMENT, before or at sequence start.
SAFE = {"accepted", "refused", "refused at sequence start"}


def run_child(
    seed: int, count: int
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, str]]]:
    command = [sys.executable, "-m", "tests.hostile_grammars", "--seed", str(seed)]
    command += ["--count", str(count), "--vocab", str(EMBEDDED_MODELS[SMOLLM].locate())]
    # A hang is a failure too: the timeout raises, naming the command.
    child = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    return child, lines


@pytest.mark.slow  # a campaign of hostile grammars, in a child process
def test_every_case_is_accepted_or_refused_and_the_child_lives() -> None:
    child, lines = run_child(seed=15, count=200)
    started = [line["start"] for line in lines if "start" in line]
    assert child.returncode == 0, f"the child died ({child.returncode}) in case {started[-1:]}"
    outcomes = {line["case"]: line["outcome"] for line in lines if "case" in line}
    assert len(outcomes) == len(started)
    unsafe = {name: outcome for name, outcome in outcomes.items() if outcome not in SAFE}
    assert not unsafe
    assert {case.name for case in named_cases()} <= set(outcomes)
    tally = Counter(outcomes.values())
    assert tally["accepted"] > 20  # the cases reach both sides
    assert tally["refused"] > 100
    assert outcomes["issue: pattern a{0,100000}"] == "refused"
    assert outcomes["issue: 32000 nested groups"] == "refused"
