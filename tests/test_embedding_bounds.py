"""One legal embeddings request no longer gets its engine killed (issue 45, item 9).

A real server with the embedded all-MiniLM-L6-v2 in an engine process, its stuck-engine
watchdog at 3 s (`--engine-stall-seconds`) and one input per batch: a request that
evaluated as one call longer than that was killed with its engine. Here 2,048 inputs of
480 words (4.9 MB, OpenAI's most inputs) are refused at once past the request token
budget, over gRPC and HTTP; a request of several times the stall limit's work finishes,
with a short request answered meanwhile; the engine is the same process throughout. In
process, a request whose deadline passes or whose HTTP client leaves is evaluated no
further.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx2 as httpx
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.engine.base import Engine
from service.engine.local import LocalEngine
from service.models.embedded import MINILM_NAME
from tests.conftest import RunningServer, eventually, make_settings, serving

# Words the model reads as one token each: an input of WORDS words is WORDS + 2 tokens
# ([CLS] and [SEP]), within the model's window of 512.
_COMMON_WORDS = (
    "the of and to in is was for on that with as by at from it his an were are which this "
    "be or has had not but first one their its new after who they have two her she been "
    "other when there all during into school time may years more most only over city some "
    "world would where later up such used many can state about national out known "
    "university united then made"
)
_VOCABULARY = _COMMON_WORDS.split()
WORDS = 480
STALL_SECONDS = 3.0
LONG = 40


def _texts(count: int, seed: int = 45) -> list[str]:
    draw = random.Random(seed)
    return [" ".join(draw.choices(_VOCABULARY, k=WORDS)) for _ in range(count)]


def _request(texts: list[str]) -> pb.EmbedRequest:
    return pb.EmbedRequest(model=MINILM_NAME, inputs=[pb.EmbedInput(text=text) for text in texts])


def _engine(running: RunningServer) -> Engine:
    return next(m for m in running.server.pool.loaded() if m.name == MINILM_NAME).engine


def _root(running: RunningServer) -> str:
    assert running.server.http is not None
    return f"http://127.0.0.1:{running.server.http.port}"


@pytest.fixture(scope="module")
def watched() -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    """Batches of one input (the batch is never narrower than the window: 512 tokens),
    about 0.35 s each on one thread of this machine's CPU, well inside the 3 s limit."""
    settings = make_settings(
        http_listen="127.0.0.1:0", engine_stall_seconds=STALL_SECONDS, embed_batch_tokens=1
    )
    with serving(settings) as pair:
        pair[1].Embed(_request(["warm"]))  # loads the model
        yield pair


def test_2048_long_inputs_are_refused_up_front_naming_the_budget(
    watched: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = watched
    engine = _engine(running)
    texts = _texts(2048)
    assert 4_500_000 < sum(map(len, texts)) < 5_500_000  # the 4.9 MB
    with pytest.raises(grpc.RpcError) as caught:
        stub.Embed(_request(texts), timeout=120)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = str(caught.value.details())
    assert "request token budget of 300,000 (--request-token-budget)" in details
    answer = httpx.post(
        _root(running) + "/v1/embeddings", json={"model": MINILM_NAME, "input": texts}, timeout=120
    )
    assert answer.status_code == 400, answer.text
    assert "--request-token-budget" in answer.json()["error"]["message"]
    # The engine was never killed: the same process serves the next request.
    assert len(stub.Embed(_request(["still here"])).embeddings) == 1
    assert _engine(running) is engine
    assert engine.pid is not None


def test_work_several_times_the_stall_limit_finishes_and_others_get_a_turn(
    watched: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    """LONG inputs of 482 tokens: about 9 s of evaluation on one thread of this machine,
    three times the stall limit, in one call that the watchdog killed before there were
    batches; a short request sent meanwhile is answered before it."""
    running, stub = watched
    engine, pid = _engine(running), _engine(running).pid
    texts = _texts(LONG, seed=9)
    short_done = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(stub.Embed, _request(texts), timeout=300)
        assert eventually(lambda: engine.waiting > 0 or long.done())
        short = stub.Embed(_request(["a short one"]), timeout=60)
        short_done.set()
        assert not long.done(), "the short request waited for the whole long one"
        reply = long.result()
    assert len(short.embeddings) == 1
    assert len(reply.embeddings) == LONG
    assert all(item.tokens == WORDS + 2 for item in reply.embeddings)
    assert _engine(running) is engine
    assert engine.pid == pid
    assert len(stub.Embed(_request(["after"])).embeddings) == 1


@pytest.fixture(scope="module")
def in_process() -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    settings = make_settings(
        http_listen="127.0.0.1:0", engine_mode="in-process", embed_batch_tokens=1
    )
    with serving(settings) as pair:
        pair[1].Embed(_request(["warm"]))
        yield pair


INPUTS = 60  # one per batch: about 20 s of evaluation


def _evaluated_after(running: RunningServer, leave: Callable[[], None]) -> int:
    """How many batches the queue evaluated for a request of INPUTS inputs that its
    client left, by `leave()`, two seconds in."""
    engine = _engine(running)
    assert isinstance(engine, LocalEngine)
    queue = engine.core.embeddings
    assert queue is not None
    before = queue.evaluations
    leave()
    assert eventually(lambda: queue.waiting == 0)
    return queue.evaluations - before


def test_a_passed_deadline_stops_the_remaining_batches(
    in_process: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = in_process

    def leave() -> None:
        with pytest.raises(grpc.RpcError) as caught:
            stub.Embed(_request(_texts(INPUTS, seed=1)), timeout=2)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    assert 0 < _evaluated_after(running, leave) < INPUTS
    assert len(stub.Embed(_request(["after the deadline"])).embeddings) == 1


def test_an_http_client_that_leaves_stops_the_remaining_batches(
    in_process: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = in_process
    body = {"model": MINILM_NAME, "input": _texts(INPUTS, seed=2)}

    def leave() -> None:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(_root(running) + "/v1/embeddings", json=body, timeout=2)

    assert 0 < _evaluated_after(running, leave) < INPUTS
    assert len(stub.Embed(_request(["after the client left"])).embeddings) == 1


def test_tokenize_has_the_same_budget(
    watched: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    """The default text model (SmolLM2) reads a digit as one token: 310,000 digits (within
    --max-prompt-bytes) are past the budget, a thousand are not."""
    _, stub = watched
    with pytest.raises(grpc.RpcError) as caught:
        stub.Tokenize(pb.TokenizeRequest(prompt="7" * 310_000), timeout=120)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = str(caught.value.details())
    assert "the prompt is 310,000 tokens" in details
    assert "request token budget of 300,000 (--request-token-budget)" in details
    assert len(stub.Tokenize(pb.TokenizeRequest(prompt="7" * 1000)).token_ids) == 1000
