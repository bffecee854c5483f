"""Several tokens per streamed message (--stream-interval): same text, fewer messages."""

from __future__ import annotations

from inference.v1 import inference_pb2 as pb
from service.decode.chunking import StreamChunker, merged
from service.text.requests import Delta, Finished, FinishReason, Timing, TokenLogprob, Usage
from tests.conftest import collect, finished_of, make_settings, serving, text_of


def delta(text: str, *ids: int) -> Delta:
    return Delta(text, ids)


def finished() -> Finished:
    return Finished(
        finish_reason=FinishReason.LENGTH,
        stop_sequence="",
        usage=Usage(prompt_tokens=1, completion_tokens=5, cached_prompt_tokens=0),
        timing=Timing(ttft_ms=1.0, decode_tokens_per_second=1.0, total_ms=2.0, queue_ms=0.0),
        seed=1,
    )


def test_the_first_delta_goes_alone_then_groups_of_interval_tokens() -> None:
    chunker = StreamChunker(3)
    sent = [chunker.push(delta(c, i)) for i, c in enumerate("abcde")]
    assert sent[0] == [delta("a", 0)]
    assert sent[1:3] == [[], []]
    assert sent[3] == [delta("bcd", 1, 2, 3)]
    assert sent[4] == []
    end = finished()
    assert chunker.push(end) == [delta("e", 4), end]  # the end flushes what is held


def test_an_interval_of_one_sends_every_delta() -> None:
    chunker = StreamChunker(1)
    assert [chunker.push(delta(c, i)) for i, c in enumerate("ab")] == [
        [delta("a", 0)],
        [delta("b", 1)],
    ]


def test_merging_keeps_text_ids_and_logprobs_in_order() -> None:
    first, second, third = (TokenLogprob(i, b"t", -float(i)) for i in (1, 2, 3))
    together = merged([Delta("x", (1,), (first,)), Delta("yz", (2, 3), (second, third))])
    assert together == Delta("xyz", (1, 2, 3), (first, second, third))


def test_a_server_with_an_interval_streams_the_same_text_in_fewer_messages() -> None:
    prompt = "The three primary colours are"
    request = pb.GenerateRequest(prompt=prompt, max_tokens=13, temperature=0)
    with serving(make_settings()) as (_, stub):
        every_token = collect(stub.Generate(request))
    with serving(make_settings(stream_interval=4)) as (_, stub):
        grouped = collect(stub.Generate(request))
    deltas = [e.delta for e in grouped if e.WhichOneof("event") == "delta"]
    assert text_of(grouped) == text_of(every_token)
    assert [t for d in deltas for t in d.token_ids] == [
        t for e in every_token if e.WhichOneof("event") == "delta" for t in e.delta.token_ids
    ]
    assert len(deltas[0].token_ids) == 1  # time to first token is not traded away
    assert all(len(d.token_ids) <= 4 for d in deltas)
    assert len(deltas) < finished_of(every_token).usage.completion_tokens
    assert finished_of(grouped).usage == finished_of(every_token).usage
