"""The committed stubs in inference/v1/ are exactly what `make protos` generates."""

from __future__ import annotations

from pathlib import Path

import pytest
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = "inference/v1/inference.proto"
GENERATED = ["inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py"]


def test_committed_stubs_match_the_contract(tmp_path: Path) -> None:
    exit_code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{ROOT / 'protos'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(ROOT / "protos" / PROTO),
        ]
    )
    assert exit_code == 0
    for name in GENERATED:
        fresh = (tmp_path / "inference" / "v1" / name).read_text()
        committed = (ROOT / "inference" / "v1" / name).read_text()
        if fresh != committed:
            pytest.fail(f"inference/v1/{name} is stale: run `make protos` and commit the result")
