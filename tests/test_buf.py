"""buf guards the contract: `make lint` fails on lint errors and on breaking changes.

buf is the binary make install puts in tools/buf (npm); buf.yaml configures it, and
protos/baseline/inference-v1.binpb is the released contract a change is compared with.
A breaking edit is made on a copy of protos/, never on the real one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUF = ROOT / "tools" / "buf" / "node_modules" / ".bin" / "buf"
BASELINE = ROOT / "protos" / "baseline" / "inference-v1.binpb"
CONTRACT = Path("protos") / "inference" / "v1" / "inference.proto"

pytestmark = pytest.mark.skipif(
    not BUF.exists(), reason="buf is not installed (make install installs it where npm exists)"
)


def buf(workspace: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BUF), *arguments], cwd=workspace, capture_output=True, text=True, timeout=60
    )


def edited_copy(tmp_path: Path, pattern: str, replacement: str) -> Path:
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    shutil.copytree(ROOT / "protos", tmp_path / "protos", ignore=shutil.ignore_patterns("*.binpb"))
    proto = tmp_path / CONTRACT
    text, count = re.subn(pattern, replacement, proto.read_text(), count=1, flags=re.M)
    assert count == 1, f"the edit {pattern!r} found nothing to change"
    proto.write_text(text)
    return tmp_path


def test_buf_lint_passes_on_the_protos() -> None:
    done = buf(ROOT, "lint")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_protos_do_not_break_the_released_contract() -> None:
    done = buf(ROOT, "breaking", "--against", str(BASELINE))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("pattern", "replacement", "complaint"),
    [
        # Renumbered: old clients' field 2 would land nowhere.
        (r"^  string prompt = 2;", "  string prompt = 22;", "prompt"),
        # Removed without reserving its number.
        (r"^  uint32 completion_tokens = 2;\n", "", "completion_tokens"),
        # Renamed: a wire-compatible change, but JSON and every generated client break.
        (r"^  string default_model = 2;", "  string default_model_name = 2;", "default_model"),
        # A file option: every generated Go import path changes.
        (r'^option go_package = "[^"]*";', 'option go_package = "example.com/x;x";', "go_package"),
    ],
)
def test_a_breaking_change_fails_the_check(
    tmp_path: Path, pattern: str, replacement: str, complaint: str
) -> None:
    workspace = edited_copy(tmp_path, pattern, replacement)
    done = buf(workspace, "breaking", "--against", str(BASELINE))
    assert done.returncode != 0, "buf breaking accepted a breaking change"
    assert complaint in done.stdout + done.stderr


def test_adding_a_field_is_not_breaking(tmp_path: Path) -> None:
    # What the contract's own comment asks for: new fields, never renumbered ones.
    workspace = edited_copy(tmp_path, r"^(message HubFile \{\n)", r"\1  string sha256 = 3;\n")
    done = buf(workspace, "breaking", "--against", str(BASELINE))
    assert done.returncode == 0, done.stdout + done.stderr
