"""The committed clients are exactly what `make protos` generates from the contract."""

from __future__ import annotations

from pathlib import Path

import pytest
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "protos" / "inference" / "v1" / "inference.proto"
TS_CLIENT = ROOT / "clients" / "node"
TS_PLUGIN = TS_CLIENT / "node_modules" / ".bin" / "protoc-gen-es"


def generate(out: Path, *flags: str) -> None:
    assert protoc.main(["grpc_tools.protoc", f"-I{ROOT / 'protos'}", *flags, str(PROTO)]) == 0


def assert_same(fresh_root: Path, committed_root: Path, names: list[str]) -> None:
    for name in names:
        fresh = (fresh_root / name).read_text()
        if fresh != (committed_root / name).read_text():
            pytest.fail(
                f"{committed_root / name} is stale: run `make protos` and commit the result"
            )


def test_committed_python_stubs_match_the_contract(tmp_path: Path) -> None:
    generate(
        tmp_path,
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
    )
    names = ["inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py"]
    assert_same(tmp_path / "inference" / "v1", ROOT / "inference" / "v1", names)


@pytest.mark.skipif(
    not TS_PLUGIN.exists(), reason="the Node.js client's npm packages are not installed"
)
def test_committed_node_client_matches_the_contract(tmp_path: Path) -> None:
    generate(
        tmp_path,
        f"--plugin=protoc-gen-es={TS_PLUGIN}",
        f"--es_out={tmp_path}",
        "--es_opt=target=js+dts,import_extension=js",
    )
    names = ["inference_pb.js", "inference_pb.d.ts"]
    assert_same(
        tmp_path / "inference" / "v1", TS_CLIENT / "src" / "gen" / "inference" / "v1", names
    )
