"""--address-file: a server asked for port 0 says which ports it bound, in a file a
supervisor can wait for (the cluster launcher does, so that no port it probed and let
go can be taken before the replica binds it)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import grpc

from tests.server_process import server_process, wait_until_serving


def wait_for_file(path: Path, timeout: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} was never written"
    addresses = json.loads(path.read_text())
    assert isinstance(addresses, dict)
    return addresses


def test_the_file_names_the_ports_the_server_bound(tmp_path: Path) -> None:
    address_file = tmp_path / "addresses.json"
    arguments = ["--http-listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0"]
    arguments += ["--address-file", str(address_file)]
    with server_process(arguments) as server:
        logged = server.wait_for_address()
        addresses = wait_for_file(address_file)
        assert set(addresses) == {"grpc", "http", "health"}
        assert addresses["grpc"] == logged
        assert all(not value.endswith(":0") for value in addresses.values())
        assert len(set(addresses.values())) == 3
        with grpc.insecure_channel(addresses["health"]) as channel:
            wait_until_serving(channel)
        with urllib.request.urlopen(f"http://{addresses['http']}/v1/models", timeout=30) as r:
            assert r.status == 200
        assert not list(tmp_path.glob("*.partial"))
