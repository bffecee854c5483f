"""TLS, mTLS and bearer tokens accept the right callers and refuse the rest.

Health and reflection stay open to probes; `--health-listen` serves health in
plaintext beside a TLS port.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from tests.certificates import Pki, make_pki
from tests.conftest import RunningServer, make_settings, serving

TOKEN = "s3cret-token"
FAST = 10  # seconds: a refused call must not hang


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_channel(target: str, pki: Pki, *, client_cert: bool = False) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca.cert_bytes(),
        private_key=pki.client.key_bytes() if client_cert else None,
        certificate_chain=pki.client.cert_bytes() if client_cert else None,
    )
    return grpc.secure_channel(target, credentials)


def list_models(
    channel: grpc.Channel, metadata: list[tuple[str, str]] | None = None
) -> pb.ListModelsResponse:
    stub = pb_grpc.InferenceStub(channel)
    reply: pb.ListModelsResponse = stub.ListModels(
        pb.ListModelsRequest(), timeout=FAST, metadata=metadata
    )
    return reply


def health(channel: grpc.Channel, service: str = "") -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=FAST)
    return int(reply.status)


# --- TLS -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[RunningServer]:
    settings = make_settings(tls_cert=pki.server.cert, tls_key=pki.server.key)
    with serving(settings) as (running, _):
        yield running


def test_tls_serves_a_client_that_trusts_the_ca(tls_server: RunningServer, pki: Pki) -> None:
    with tls_channel(tls_server.target, pki) as channel:
        assert list_models(channel).default_model
        stream = pb_grpc.InferenceStub(channel).Generate(
            pb.GenerateRequest(prompt="Hi", max_tokens=2, temperature=0), timeout=60
        )
        assert list(stream)[-1].WhichOneof("event") == "finished"


def test_tls_refuses_plaintext_and_an_untrusted_ca(
    tls_server: RunningServer, tmp_path: Path
) -> None:
    with grpc.insecure_channel(tls_server.target) as channel, pytest.raises(grpc.RpcError) as plain:
        list_models(channel)
    assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
    stranger = make_pki(tmp_path, ca_name="another CA")
    with tls_channel(tls_server.target, stranger) as channel, pytest.raises(grpc.RpcError) as bad:
        list_models(channel)
    assert bad.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.fixture(scope="module")
def mtls_server(pki: Pki) -> Iterator[RunningServer]:
    settings = make_settings(
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_client_ca=pki.ca.cert,
        health_listen="127.0.0.1:0",
    )
    with serving(settings) as (running, _):
        yield running


def test_mtls_needs_a_client_certificate(mtls_server: RunningServer, pki: Pki) -> None:
    with tls_channel(mtls_server.target, pki, client_cert=True) as channel:
        assert list_models(channel).default_model
    with tls_channel(mtls_server.target, pki) as channel, pytest.raises(grpc.RpcError) as caught:
        list_models(channel)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_health_port_answers_plaintext_probes_beside_mtls(mtls_server: RunningServer) -> None:
    port = mtls_server.server.health_port
    assert port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        for service in ("", "inference.v1.Inference"):
            assert health(channel, service) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as caught:
            list_models(channel)  # the health port serves nothing else
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


# --- bearer token ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_channel() -> Iterator[grpc.Channel]:
    with (
        serving(make_settings(auth_token=TOKEN)) as (running, _),
        grpc.insecure_channel(running.target) as channel,
    ):
        yield channel


def test_token_accepted(token_channel: grpc.Channel) -> None:
    reply = list_models(token_channel, metadata=[("authorization", f"Bearer {TOKEN}")])
    assert reply.default_model


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ([], "missing"),
        ([("authorization", "Bearer wrong")], "invalid"),
        ([("authorization", TOKEN)], "invalid"),  # no scheme
    ],
)
def test_token_refused(
    token_channel: grpc.Channel, metadata: list[tuple[str, str]], message: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        list_models(token_channel, metadata=metadata)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert message in (caught.value.details() or "")
    stream = pb_grpc.InferenceStub(token_channel).Generate(
        pb.GenerateRequest(prompt="Hi", max_tokens=2), metadata=metadata, timeout=FAST
    )
    with pytest.raises(grpc.RpcError) as streamed:
        list(stream)
    assert streamed.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_health_and_reflection_need_no_token(token_channel: grpc.Channel) -> None:
    assert health(token_channel, "inference.v1.Inference") == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(token_channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (reply,) = stub.ServerReflectionInfo(iter([request]), timeout=FAST)
    names = {service.name for service in reply.list_services_response.service}
    assert "inference.v1.Inference" in names
