"""Hub-shaped names the hub library refuses are INVALID_ARGUMENT, naming the rule (issue 45).

`a--b/c`, `a/b.`, `a/b..c` or a 100-character name looked like a hub repo to the
parser, and huggingface_hub's validator refused them further in: INTERNAL on Generate,
Admit and Pull, 500 on the HTTP port. The check is now where a reference becomes a
`HubReference`, with the library's own validator; here at that seam, and on a real
server through the generated stubs and the HTTP port.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx2
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.errors import InvalidRequest
from service.model_source import HubReference, check_repo_id
from service.models.sources import SourceResolver, hub_reference
from tests.conftest import RunningServer, make_settings, serving
from tests.fake_hub import FakeHub

REFUSED = {
    "a--b/c": "may not hold '--' or '..'",
    "a/b..c": "may not hold '--' or '..'",
    "a/b.": "neither starts nor ends with '-' or '.'",
    "a/b-": "neither starts nor ends with '-' or '.'",
    "a/b.git": "may not end in '.git'",
    "o/" + "n" * 98: "at most 96 characters each (not 98)",
    "o" * 100 + "/n": "at most 96 characters each (not 100)",
}


@pytest.mark.parametrize(("name", "rule"), REFUSED.items())
def test_the_parser_refuses_what_the_hub_library_refuses(name: str, rule: str) -> None:
    for make in (
        lambda: HubReference(name),
        lambda: hub_reference(name),
        lambda: hub_reference(f"{name}@main:model.gguf"),
        lambda: SourceResolver([], Path("/nonexistent-hub-cache")).resolve(name),
    ):
        with pytest.raises(InvalidRequest) as refused:
            make()
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "is not a Hugging Face repo id" in refused.value.message
        assert rule in refused.value.message
        assert len(refused.value.message) < 300  # the name shown cut, not whole


@pytest.mark.parametrize("name", ["acme/x", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "a_b/c.d-e"])
def test_names_the_hub_accepts_pass(name: str) -> None:
    assert check_repo_id(name) == name
    assert HubReference(name).repo_id == name


# --- on a real server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    hub = FakeHub().start()  # never asked: the names are refused before
    settings = make_settings(
        hf_cache_dir=tmp_path_factory.mktemp("hub-cache"),
        hf_offline=False,
        hf_endpoint=hub.url,
        hf_token=None,
        allow_pull=True,
        http_listen="127.0.0.1:0",
    )
    try:
        with serving(settings) as (server, _):
            yield server
    finally:
        assert hub.requests == []
        hub.stop()


@pytest.fixture(scope="module")
def stub(running: RunningServer) -> Iterator[pb_grpc.InferenceStub]:
    with grpc.insecure_channel(running.target) as channel:
        yield pb_grpc.InferenceStub(channel)


def _calls(stub: pb_grpc.InferenceStub, name: str) -> dict[str, object]:
    return {
        "Generate": lambda: list(
            stub.Generate(pb.GenerateRequest(model=name, prompt="Hi", max_tokens=1))
        ),
        "Admit": lambda: stub.Admit(pb.AdmitRequest(model=name)),
        "Pull": lambda: list(stub.Pull(pb.PullRequest(model=name))),
        "DeleteCached": lambda: stub.DeleteCached(pb.DeleteCachedRequest(model=name)),
    }


@pytest.mark.parametrize(("name", "rule"), REFUSED.items())
@pytest.mark.parametrize("rpc", ["Generate", "Admit", "Pull", "DeleteCached"])
def test_each_rpc_answers_invalid_argument_naming_the_rule(
    stub: pb_grpc.InferenceStub, rpc: str, name: str, rule: str
) -> None:
    call = _calls(stub, name)[rpc]
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert rule in str(caught.value.details())


@pytest.mark.parametrize("name", list(REFUSED))
def test_the_http_model_field_is_a_400_naming_the_rule(running: RunningServer, name: str) -> None:
    assert running.server.http is not None
    url = f"http://127.0.0.1:{running.server.http.port}/v1/chat/completions"
    body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    answer = httpx2.post(url, json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert REFUSED[name] in error["message"]
    assert error.get("param") == "model"
