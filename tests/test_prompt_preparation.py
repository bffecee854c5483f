"""A long prompt is prepared beside the decode steps, not between them (issue 28).

Rendering and tokenizing ran on the model's worker thread, so a large prompt held up
every stream of that model for as long as its tokenizer took. Here a stream decodes
while another request's ~150 KB prompt is tokenized (Gemma's tokenizer takes seconds
over it, then the prompt is refused for the context window): the stream's tokens keep
coming meanwhile.
"""

from __future__ import annotations

import contextlib
import threading
import time

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from tests.conftest import GEMMA, collect, make_settings, serving

HTML = "<div class='note'><b>item</b> <i>value</i></div>\n" * 3000  # ~150 KB


def test_a_long_prompts_preparation_does_not_hold_up_other_streams() -> None:
    settings = make_settings(max_prompt_bytes=1 << 20)
    with serving(settings) as (_, stub):
        collect(stub.Generate(pb.GenerateRequest(model=GEMMA, prompt="Hi", max_tokens=1)))
        arrivals: list[float] = []
        long_stream = stub.Generate(
            pb.GenerateRequest(model=GEMMA, prompt="Once upon a time", max_tokens=900)
        )

        def read() -> None:
            with contextlib.suppress(grpc.RpcError):  # cancelled at the end
                for event in long_stream:
                    if event.WhichOneof("event") == "delta":
                        arrivals.append(time.monotonic())

        reader = threading.Thread(target=read)
        reader.start()
        while len(arrivals) < 3:  # decoding
            time.sleep(0.01)
        sent = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            collect(stub.Generate(pb.GenerateRequest(model=GEMMA, prompt=HTML, max_tokens=8)))
        refused = time.monotonic()
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # too long, once read
        long_stream.cancel()
        reader.join()
        during = [t for t in arrivals if sent < t < refused]
        # Tokens kept coming while the long prompt was prepared: the stream's usual pace,
        # not one token (or none) after the tokenizer let go.
        assert len(during) >= 3, (len(during), refused - sent)
