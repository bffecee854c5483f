"""Where the hub's redirects may take the server, and where its token goes (issue 38).

A hub, a mirror, or whoever answers for them could redirect a read to an
internal address (a metadata service on a link-local or loopback address),
down from https to plain http (the token in clear), or to a Location that is
not a URL at all. Each case: what is refused, with which status, and that the
target was never asked (or asked without the token).
"""

from __future__ import annotations

import ipaddress
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import httpcore2
import pytest

from inference.v1 import inference_pb2 as pb
from service.errors import AccessDenied, Unavailable
from service.hub.addresses import AddressPolicy, GuardedBackend, RefusedAddress
from service.hub.client import HubAccess, HubClient
from service.models.embedded import EMBEDDED_MODELS
from tests.certificates import make_pki
from tests.conftest import SMOLLM, make_settings, serving
from tests.fake_hub import FakeHub, FakeRepo, Hostile

SMOLLM_BYTES = EMBEDDED_MODELS[SMOLLM].locate().read_bytes()
NAME = "model.gguf"
TOKEN = "hf_secret"


class Recorder:
    """An HTTP server on `host` that answers 200 and notes what it was asked, and how."""

    def __init__(self, host: str) -> None:
        self.asked: list[tuple[str, str | None]] = []  # (path, Authorization)
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                recorder.asked.append((self.path, self.headers.get("Authorization")))
                body = b"instance-id: i-secret"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def internal() -> Iterator[Recorder]:
    """A service on another loopback address than the hub's: what the hub must not reach."""
    recorder = Recorder("127.0.0.2")
    yield recorder
    recorder.stop()


def _hub_redirecting_to(location: str) -> FakeHub:
    return FakeHub(
        repos={"acme/model": FakeRepo({NAME: SMOLLM_BYTES}, hostile=Hostile(redirect_to=location))}
    ).start()


def _read_through(client: HubClient, hub: FakeHub) -> bytes:
    with client.get(client.url(f"acme/model/resolve/main/{NAME}")) as answer:
        return answer.read()


def test_a_redirect_to_another_loopback_address_is_refused_unasked(internal: Recorder) -> None:
    hub = _hub_redirecting_to(f"{internal.url}/latest/meta-data")
    try:
        with HubClient(HubAccess(hub.url)) as client, pytest.raises(AccessDenied) as caught:
            _read_through(client, hub)
    finally:
        hub.stop()
    assert "a loopback address (127.0.0.2)" in caught.value.message
    assert "--hf-redirect-networks" in caught.value.message
    assert internal.asked == []


def test_an_operator_can_allow_a_network(internal: Recorder) -> None:
    hub = _hub_redirecting_to(f"{internal.url}/files/model.gguf")
    networks = (ipaddress.ip_network("127.0.0.2/32"),)
    try:
        with HubClient(HubAccess(hub.url, redirect_networks=networks)) as client:
            assert _read_through(client, hub) == b"instance-id: i-secret"
    finally:
        hub.stop()
    assert [path for path, _ in internal.asked] == ["/files/model.gguf"]


@pytest.mark.parametrize(
    "location",
    ["ftp://mirror.example/model.gguf", "javascript:alert(1)", "http://[::1", "file:///etc/passwd"],
)
def test_a_location_that_is_not_an_http_url_is_unavailable(location: str) -> None:
    hub = _hub_redirecting_to(location)
    try:
        with HubClient(HubAccess(hub.url)) as client, pytest.raises(Unavailable) as caught:
            _read_through(client, hub)
    finally:
        hub.stop()
    assert "not an http(s) address" in caught.value.message


def test_the_token_goes_to_the_hub_origin_only(internal: Recorder) -> None:
    """The fake hub's CDN redirect goes to `localhost`, another origin: no token there."""
    hub = FakeHub(repos={"acme/model": FakeRepo({NAME: SMOLLM_BYTES}, token=TOKEN)}).start()
    try:
        with HubClient(HubAccess(hub.url, token=TOKEN)) as client:
            assert _read_through(client, hub) == SMOLLM_BYTES
    finally:
        hub.stop()
    assert any(ask.startswith("GET /lfs/") for ask in hub.requests)  # it was redirected
    assert any("/resolve/" in path for path in hub.with_token)
    assert not any(path.startswith("/lfs/") for path in hub.with_token)


@pytest.fixture
def tls_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeHub, Recorder]]:
    """An https hub on localhost that redirects its files to plain http on 127.0.0.1."""
    pki = make_pki(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca.cert))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server.cert, pki.server.key)
    plain = Recorder("127.0.0.1")
    repo = FakeRepo({NAME: SMOLLM_BYTES}, token=TOKEN, hostile=Hostile(redirect_to=plain.url))
    hub = FakeHub(repos={"acme/model": repo}).start(tls=context)
    yield hub, plain
    hub.stop()
    plain.stop()


def test_https_is_never_downgraded_and_the_token_never_sent_in_clear(
    tls_hub: tuple[FakeHub, Recorder],
) -> None:
    hub, plain = tls_hub
    with HubClient(HubAccess(hub.url, token=TOKEN)) as client:
        with client.get(client.url("api/models/acme/model")) as answer:  # TLS works
            assert answer.status_code == 200
        with pytest.raises(AccessDenied) as caught:
            _read_through(client, hub)
    assert "from https to plain http" in caught.value.message
    assert plain.asked == []


def test_a_name_that_resolves_elsewhere_at_connect_time_is_refused() -> None:
    """The check on the URL can be raced by DNS; the one on the connection cannot: the
    backend connects only to addresses it checked, whatever the name said before."""
    policy = AddressPolicy("127.0.0.1", 80)
    backend = GuardedBackend(policy)
    with pytest.raises(RefusedAddress):
        backend.connect_tcp("127.0.0.2", 80, timeout=1)
    with pytest.raises(RefusedAddress):
        backend.connect_tcp("169.254.169.254", 80, timeout=1)
    with pytest.raises(httpcore2.ConnectError):  # the hub's own: tried, nobody listens
        backend.connect_tcp("127.0.0.1", 9, timeout=1)


@pytest.mark.parametrize(
    ("address", "permitted"),
    [
        ("8.8.8.8", True),
        ("2606:4700::1111", True),
        ("127.0.0.1", True),  # the hub's own
        ("127.0.0.2", False),
        ("::1", False),
        ("::ffff:127.0.0.2", False),  # IPv4 written as IPv6 is judged as IPv4
        ("169.254.169.254", False),
        ("fe80::1", False),
        ("10.1.2.3", False),
        ("192.168.0.1", False),
        ("100.64.0.1", False),  # carrier-grade NAT
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        # IPv6 spellings of internal IPv4 addresses (issue 45): judged by what they carry.
        ("::ffff:127.0.0.1", True),  # the hub's own, mapped
        ("::127.0.0.2", False),  # IPv4-compatible
        ("::127.0.0.1", False),  # not the hub's: an IPv6 address nothing routes
        ("::8.8.8.8", False),  # IPv4-compatible is deprecated, routed nowhere
        ("::ffff:0:127.0.0.2", False),  # SIIT, IPv4-translated
        ("::ffff:0:169.254.169.254", False),
        ("64:ff9b::7f00:1", False),  # NAT64, the well-known prefix
        ("64:ff9b::a9fe:a9fe", False),
        ("64:ff9b::c0a8:1", False),
        ("64:ff9b::808:808", True),  # NAT64 of a public address: how IPv6-only hosts reach one
        ("64:ff9b:1::7f00:1", False),  # the local-use NAT64 prefix
        ("64:ff9b:1::808:808", False),
        ("2002:7f00:1::", False),  # 6to4
        ("2002:a9fe:a9fe::1", False),
        ("2002:0a01:0203::1", False),
        ("2002:808:808::1", True),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # Teredo
        ("192.0.0.192", False),  # IETF protocol assignments
        ("192.0.0.8", False),
        ("192.0.0.9", True),  # the two in 192.0.0.0/24 that are global
        ("fec0::1", False),  # site-local, deprecated
        ("3fff::1", False),  # documentation
        ("5f00::1", False),  # SRv6 SIDs
        ("fd00::1", False),
    ],
)
def test_which_addresses_a_redirect_may_reach(address: str, permitted: bool) -> None:
    policy = AddressPolicy("127.0.0.1", 80)
    assert policy.permits(ipaddress.ip_address(address)) is permitted


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("64:ff9b::7f00:1", "an IPv6 spelling of 127.0.0.1, a loopback address"),
        ("2002:a9fe:a9fe::", "an IPv6 spelling of 169.254.169.254, a link-local address"),
        ("::1", "a loopback address"),
    ],
)
def test_a_refusal_names_the_address_a_spelling_carries(address: str, says: str) -> None:
    policy = AddressPolicy("127.0.0.1", 80)
    refusal = policy.refusal(f"[{address}]", [ipaddress.ip_address(address)])
    assert refusal is not None
    assert says in refusal.message


def test_a_network_the_operator_names_is_permitted() -> None:
    policy = AddressPolicy("127.0.0.1", 80, [ipaddress.ip_network("10.0.0.0/8")])
    assert policy.permits(ipaddress.ip_address("10.1.2.3"))
    assert not policy.permits(ipaddress.ip_address("192.168.0.1"))


def test_admit_through_a_hub_that_redirects_inside_is_permission_denied(
    internal: Recorder,
) -> None:
    """End to end: the status and message a client sees, and the server still serves."""
    hub = _hub_redirecting_to(f"{internal.url}/latest/meta-data")
    settings = make_settings(hf_offline=False, hf_endpoint=hub.url, hf_token=None)
    try:
        with serving(settings) as (_, stub):
            with pytest.raises(grpc.RpcError) as caught:
                stub.Admit(pb.AdmitRequest(model="acme/model"))
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "127.0.0.2" in str(caught.value.details())
            assert stub.ListModels(pb.ListModelsRequest()).models
    finally:
        hub.stop()
    assert internal.asked == []


def test_the_redirect_networks_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="not-a-network"):
        make_settings(hf_redirect_networks="10.0.0.0/8,not-a-network")
    assert make_settings(hf_redirect_networks="10.0.0.0/8, fd00::/8").hf_redirect_networks
