"""Every size and count a request carries is bounded (issue 27).

Tool descriptions of 15 MB, ids and names of 12 MB, 200,000 tool calls in one
message, 15 MB image prompts, guidance of +inf and unbounded health Watch
streams were all accepted before.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.front.limits import (
    MAX_NAME_CHARS,
    MAX_TOOL_CALLS_PER_MESSAGE,
    MAX_TOOL_DESCRIPTION_CHARS,
)
from tests.conftest import RunningServer, make_settings, serving


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    settings = make_settings(
        max_prompt_bytes=4096, max_health_watches=6, max_health_watches_per_connection=4
    )
    with serving(settings) as running:
        yield running


def _call(index: int) -> pb.ToolCall:
    return pb.ToolCall(id=f"call{index}", name="f", arguments_json="{}")


TOOL = pb.Tool(name="f", parameters_json='{"type": "object"}')
CASES = {
    "tool description": pb.GenerateRequest(
        prompt="hi", tools=[pb.Tool(name="f", description="d" * (MAX_TOOL_DESCRIPTION_CHARS + 1))]
    ),
    "tool calls": pb.GenerateRequest(
        messages=[
            pb.ChatMessage(role="user", content="hi"),
            pb.ChatMessage(
                role="assistant",
                tool_calls=[_call(i) for i in range(MAX_TOOL_CALLS_PER_MESSAGE + 1)],
            ),
        ],
        tools=[TOOL],
    ),
    "tool call id": pb.GenerateRequest(
        messages=[pb.ChatMessage(role="tool", content="1", tool_call_id="i" * (MAX_NAME_CHARS + 1))]
    ),
    "name": pb.GenerateRequest(
        messages=[pb.ChatMessage(role="user", content="hi", name="n" * (MAX_NAME_CHARS + 1))]
    ),
    # Within every count, but the schema reaches the template: the prompt limit sees it.
    "tool schema in the prompt": pb.GenerateRequest(
        prompt="hi",
        tools=[pb.Tool(name="f", parameters_json='{"description": "' + "x" * 5000 + '"}')],
    ),
}
SAYS = {
    "tool description": f"at most {MAX_TOOL_DESCRIPTION_CHARS}",
    "tool calls": f"at most {MAX_TOOL_CALLS_PER_MESSAGE}",
    "tool call id": f"over {MAX_NAME_CHARS} characters",
    "name": f"over {MAX_NAME_CHARS} characters",
    "tool schema in the prompt": "at most 4096",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_oversized_parts_of_a_request_are_invalid(
    server: tuple[RunningServer, pb_grpc.InferenceStub], case: str
) -> None:
    _, stub = server
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(CASES[case]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert SAYS[case] in str(caught.value.details())


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"prompt": "p" * 8193}, "at most 8192"),
        ({"prompt": "a cat", "negative_prompt": "n" * 8193}, "negative_prompt is 8193"),
        ({"prompt": "a cat", "guidance": math.inf}, "guidance must be a number in [0, 50]"),
        ({"prompt": "a cat", "guidance": 1e38}, "guidance must be a number in [0, 50]"),
        ({"prompt": "a cat", "guidance": math.nan}, "guidance must be a number in [0, 50]"),
    ],
)
def test_image_prompts_and_guidance_are_bounded(
    server: tuple[RunningServer, pb_grpc.InferenceStub], fields: dict[str, object], says: str
) -> None:
    _, stub = server
    request = pb.GenerateImageRequest(model="any-image-model", **fields)  # type: ignore[arg-type]
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.GenerateImage(request))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in str(caught.value.details())


def _watch(channel: grpc.Channel) -> Any:
    """An open Watch stream that has sent its first status."""
    stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
    assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
    return stream


def test_health_watch_streams_are_capped_per_connection_and_in_all(
    server: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, _ = server
    # A subchannel pool of their own: two connections, not one shared.
    own = [("grpc.use_local_subchannel_pool", 1)]
    first = grpc.insecure_channel(running.target, options=own)
    second = grpc.insecure_channel(running.target, options=own)
    try:
        held = [_watch(first) for _ in range(4)]
        with pytest.raises(grpc.RpcError) as caught:
            _watch(first)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "per connection" in str(caught.value.details())
        held += [_watch(second) for _ in range(2)]  # six in all: the server's cap
        with pytest.raises(grpc.RpcError) as caught:
            _watch(second)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-health-watches" in str(caught.value.details())
        for stream in held:
            stream.cancel()
        # Closed streams give their places back.
        _wait_for(lambda: running.server.health.watching == 0, "the watches to close")
        _watch(second)
    finally:
        first.close()
        second.close()


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
