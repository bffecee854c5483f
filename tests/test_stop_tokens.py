"""A delta's token ids and logprobs cover exactly its text, stop sequences included.

The rule under test: joining the bytes of a delta's tokens gives the delta's
text. The one documented exception is the delta cut at a stop, which may end
with text from a token that straddles the start of the stop (stop "\\n\\n",
token ".\\n\\n"): that text is sent without the token's id.
"""

from __future__ import annotations

import codecs
import random
import time
from dataclasses import dataclass
from typing import cast

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.backends.base import SequenceRequest, TextBackend
from service.decode.chunking import StreamChunker
from service.decode.sequence import DecodeEvent, DecodePlan, SequenceDecoder
from service.decode.text import MAX_UNIT_TOKENS, Released, TextAssembler
from service.text.requests import Delta, Finished, FinishReason, SamplingParams, TokenLogprob
from tests.conftest import GEMMA, collect, finished_of, make_settings, serving, text_of

END = -1  # the end-of-generation token of the vocabulary below


class VocabBackend:
    """The two things SequenceDecoder asks of a backend, over a hand-made vocabulary."""

    def __init__(self, vocab: dict[int, bytes]) -> None:
        self.vocab = vocab

    def is_end_of_generation(self, token_id: int) -> bool:
        return token_id == END

    def token_bytes(self, token_id: int) -> bytes:
        return self.vocab[token_id]


@dataclass(frozen=True)
class Stream:
    deltas: list[Delta]
    finished: Finished
    pushed: list[int]  # every token given to the decoder, the end token left out


def plan(stops: tuple[str, ...], max_tokens: int) -> DecodePlan:
    sampling = SamplingParams(temperature=0, top_p=1, top_k=0, min_p=0, repeat_penalty=1, seed=7)
    sequence = SequenceRequest((1,), sampling, max_tokens, top_logprobs=0)
    return DecodePlan(sequence, stops, time_limit_s=None)


def generate(
    vocab: dict[int, bytes],
    ids: list[int],
    stops: tuple[str, ...] = (),
    max_tokens: int = 1000,
    interval: int = 1,
) -> Stream:
    """Feed `ids` (then the end token) through a SequenceDecoder and a chunker."""
    backend = cast(TextBackend, VocabBackend({**vocab, END: b""}))
    decoder = SequenceDecoder(backend, plan(stops, max_tokens), time.monotonic(), 0)
    chunker = StreamChunker(interval)
    events: list[DecodeEvent] = []
    pushed: list[int] = []
    for token in [*ids, END]:
        logprob = TokenLogprob(token, backend.token_bytes(token), -0.5)
        pushed += [] if token == END else [token]
        for event in decoder.push(token, logprob):
            events += chunker.push(event)
        if decoder.done:
            break
    finished = events[-1]
    assert isinstance(finished, Finished)
    return Stream([e for e in events if isinstance(e, Delta)], finished, pushed)


def utf8_decoder() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


def straddle_tail(stream: Stream, vocab: dict[int, bytes]) -> str:
    """Check every delta against its ids and logprobs; return the straddle tail.

    Decoding the bytes of all ids streamed so far gives all the text streamed
    so far, at the end of every delta. A delta ends on a character boundary,
    so its ids alone spell its text, unless MAX_UNIT_TOKENS tokens in a row
    ended inside characters.
    """
    decoder, spelled, text, run = utf8_decoder(), "", "", 0
    stopped = stream.finished.finish_reason is FinishReason.STOP_SEQUENCE
    for index, delta in enumerate(stream.deltas):
        assert [entry.token_id for entry in delta.logprobs] == list(delta.token_ids)
        assert [entry.token for entry in delta.logprobs] == [vocab[t] for t in delta.token_ids]
        for token in delta.token_ids:
            spelled += decoder.decode(vocab[token])
            run = run + 1 if decoder.getstate()[0] else 0
        text += delta.text
        if index < len(stream.deltas) - 1:
            assert (spelled, run == 0 or run >= MAX_UNIT_TOKENS) == (text, True)
        elif stopped:
            assert text.startswith(spelled)
            return text[len(spelled) :]
        else:
            assert spelled + decoder.decode(b"", final=True) == text
    return ""


def first_unit_text(streamed: list[bytes], rest: list[bytes]) -> str:
    """The text the first unstreamed tokens write, up to the first that ends a character."""
    decoder = utf8_decoder()
    decoder.decode(b"".join(streamed))
    text = ""
    for piece in rest:
        text += decoder.decode(piece)
        if decoder.getstate()[0] == b"":
            break
    return text


def check_stream(stream: Stream, vocab: dict[int, bytes]) -> None:
    """The invariant, whatever the tokens and stops."""
    streamed = [t for delta in stream.deltas for t in delta.token_ids]
    assert streamed == stream.pushed[: len(streamed)]  # in order, none skipped
    assert stream.finished.usage.completion_tokens == len(stream.pushed)
    tail = straddle_tail(stream, vocab)
    if stream.finished.finish_reason is not FinishReason.STOP_SEQUENCE:
        assert streamed == stream.pushed  # nothing held back at the end
        return
    rest = [vocab[t] for t in stream.pushed[len(streamed) :]]
    assert rest, "the stop's own tokens are counted in usage and never streamed"
    # Only the text of one token straddling the stop (or of the tokens of one
    # split character) may go out without an id, never a whole token before it.
    unit = first_unit_text([vocab[t] for t in streamed], rest)
    assert unit.startswith(tail)
    assert len(tail) < len(unit) or not tail


def text_and_stop(stream: Stream) -> tuple[str, str]:
    return "".join(d.text for d in stream.deltas), stream.finished.stop_sequence


# --- hand-made cases --------------------------------------------------------------

GEMMA_VOCAB = {9079: b" Paris", 107: b"\n", 236935: b"Q", 236787: b":"}


def test_the_issue_case_streams_the_newline_without_the_stops_q() -> None:
    stream = generate(GEMMA_VOCAB, [9079, 107, 236935, 236787], ("\n\n", "Q:"))
    check_stream(stream, GEMMA_VOCAB)
    assert [(d.text, d.token_ids) for d in stream.deltas] == [(" Paris", (9079,)), ("\n", (107,))]
    assert stream.finished.stop_sequence == "Q:"
    assert stream.finished.usage.completion_tokens == 4  # "Q" and ":" are counted


def test_a_token_straddling_the_stop_sends_its_text_without_its_id() -> None:
    vocab = {1: b"Paris", 2: b".\n\nQ", 3: b"x"}
    stream = generate(vocab, [1, 2, 3], ("\n\n",))
    check_stream(stream, vocab)
    assert [(d.text, d.token_ids) for d in stream.deltas] == [("Paris", (1,)), (".", ())]
    assert stream.deltas[1].logprobs == ()


def test_a_token_partly_like_a_stop_waits_and_goes_out_whole() -> None:
    vocab = {1: b"Paris.\n", 2: b" Next"}
    assembled = generate(vocab, [1, 2], ("\n\n",))
    check_stream(assembled, vocab)
    assert [(d.text, d.token_ids) for d in assembled.deltas] == [("Paris.\n Next", (1, 2))]


def test_a_character_split_across_tokens_before_a_stop_keeps_its_ids() -> None:
    vocab = {1: b"a\xe2", 2: b"\x98\x83", 3: b"\n", 4: b"\n"}
    stream = generate(vocab, [1, 2, 3, 4], ("\n\n",))
    check_stream(stream, vocab)
    assert [(d.text, d.token_ids) for d in stream.deltas] == [("a☃", (1, 2))]
    assert stream.finished.usage.completion_tokens == 4


def test_a_split_character_whose_last_byte_shares_a_token_with_the_stop() -> None:
    vocab = {1: b"a\xe2", 2: b"\x98", 3: b"\x83\n", 4: b"\n"}
    stream = generate(vocab, [1, 2, 3, 4], ("\n\n",))
    check_stream(stream, vocab)
    # Tokens 1 and 2 end inside the snowman, token 3 completes it and starts
    # the stop: together they straddle it, so their text goes without ids.
    assert [(d.text, d.token_ids) for d in stream.deltas] == [("a☃", ())]


def test_a_stop_made_of_a_split_character_drops_all_its_tokens() -> None:
    vocab = {1: b"x", 2: b"\xe2\x98", 3: b"\x83"}
    stream = generate(vocab, [1, 2, 3], ("☃",))
    check_stream(stream, vocab)
    assert [(d.text, d.token_ids) for d in stream.deltas] == [("x", (1,))]


def test_the_end_flushes_held_text_with_all_its_ids() -> None:
    vocab = {1: b"a", 2: b"\n", 3: b"ok\xe2\x98"}
    length = generate(vocab, [1, 2], ("\n\n",), max_tokens=2)
    check_stream(length, vocab)
    assert length.finished.finish_reason is FinishReason.LENGTH
    assert [(d.text, d.token_ids) for d in length.deltas] == [("a", (1,)), ("\n", (2,))]
    cut_off = generate(vocab, [1, 3])  # ends inside a character, then the end token
    check_stream(cut_off, vocab)
    assert cut_off.finished.finish_reason is FinishReason.END_OF_TURN
    assert [(d.text, d.token_ids) for d in cut_off.deltas] == [("a", (1,)), ("ok\ufffd", (3,))]


def test_a_token_without_text_is_still_streamed_with_its_logprob() -> None:
    vocab = {1: b"a", 2: b"", 3: b"b"}
    stream = generate(vocab, [1, 2, 3])
    check_stream(stream, vocab)
    assert [(d.text, d.token_ids) for d in stream.deltas] == [("a", (1,)), ("", (2,)), ("b", (3,))]


def test_a_long_run_of_tokens_inside_characters_is_not_held_to_the_end() -> None:
    snowman = "☃".encode()
    # Every token ends inside a snowman whose last byte opens the next token.
    pieces = [snowman[:2]] + [snowman[2:] + snowman[:2]] * 20 + [snowman[2:]]
    vocab = dict(enumerate(pieces))
    assembler = TextAssembler()
    released = [assembler.push(token, piece) for token, piece in vocab.items()]
    first = next(index for index, r in enumerate(released) if r.text)
    assert first == MAX_UNIT_TOKENS - 1
    run = tuple(range(MAX_UNIT_TOKENS))
    assert released[first] == Released("☃" * (MAX_UNIT_TOKENS - 1), run)
    stream = generate(vocab, list(vocab))
    check_stream(stream, vocab)
    assert "".join(d.text for d in stream.deltas) == "☃" * 21
    # Cut off inside a snowman right after a run was cut: the U+FFFD has no token left.
    cut_off = generate(vocab, list(vocab)[: 2 * MAX_UNIT_TOKENS])
    check_stream(cut_off, vocab)
    assert "".join(d.text for d in cut_off.deltas) == "☃" * (2 * MAX_UNIT_TOKENS - 1) + "\ufffd"


def test_merged_deltas_keep_ids_and_logprobs_with_their_text() -> None:
    vocab = {1: b"a", 2: b"b\xc3", 3: b"\xa9", 4: b"\n", 5: b"c", 6: b".\n\n"}
    stream = generate(vocab, [1, 2, 3, 4, 5, 6], ("\n\n",), interval=5)
    check_stream(stream, vocab)
    assert [(d.text, d.token_ids) for d in stream.deltas] == [("a", (1,)), ("bé\nc.", (2, 3, 4, 5))]


# --- seeded random cases ---------------------------------------------------------

# Few distinct characters so that stops match often; one, two, three and four
# byte characters so that tokens split them.
ALPHABET = ["a", "b", "\n", "Q", ":", "é", "☃", "😀"]
BROKEN = [b"\xff", "☃".encode()[:2]]  # a byte that is never UTF-8; a cut-off character


def random_bytes(rng: random.Random) -> bytes:
    chunks = []
    for _ in range(rng.randint(0, 24)):
        broken = rng.random() < 0.05
        chunks.append(rng.choice(BROKEN) if broken else rng.choice(ALPHABET).encode())
    return b"".join(chunks)


def random_pieces(rng: random.Random) -> list[bytes]:
    data = random_bytes(rng)
    cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, len(data) - 1))) if data else []
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    for _ in range(rng.randint(0, 1)):  # now and then a token with no text
        pieces.insert(rng.randint(0, len(pieces)), b"")
    return [piece for piece in pieces if piece or rng.random() < 0.5]


def random_stops(rng: random.Random) -> tuple[str, ...]:
    return tuple(
        "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 3)))
        for _ in range(rng.randint(0, 3))
    )


def reference(pieces: list[bytes], stops: tuple[str, ...], max_tokens: int) -> tuple[str, str]:
    """Text and stop worked out from the whole text after each token."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = ""
    for piece in pieces[:max_tokens]:
        text += decoder.decode(piece)
        hits = [(text.find(stop), stop) for stop in stops if stop in text]
        if hits:
            position, stop = min(hits)
            return text[:position], stop
    return text + decoder.decode(b"", final=True), ""


def test_random_tokens_and_stops_keep_ids_logprobs_and_text_together() -> None:
    rng = random.Random(20261201)
    stops_hit = straddles = 0
    for _ in range(3000):
        pieces, stops = random_pieces(rng), random_stops(rng)
        vocab = dict(enumerate(pieces))
        max_tokens = rng.randint(1, len(pieces) + 1)
        stream = generate(vocab, list(vocab), stops, max_tokens, interval=rng.randint(1, 4))
        check_stream(stream, vocab)
        assert text_and_stop(stream) == reference(pieces, stops, max_tokens)
        stops_hit += stream.finished.finish_reason is FinishReason.STOP_SEQUENCE
        straddles += bool(straddle_tail(stream, vocab))
    # The cases that matter were generated (728 stops and 328 straddles with this seed).
    assert stops_hit > 500
    assert straddles > 200


# --- the real model ----------------------------------------------------------------


def issue_request() -> pb.GenerateRequest:
    return pb.GenerateRequest(
        model=GEMMA,
        prompt="Q: What is the capital of France?\nA:",
        max_tokens=48,
        temperature=0,
        stop=["\n\n", "Q:"],
        logprobs=True,
    )


def check_real_stream(events: list[pb.GenerateResponse]) -> list[pb.TextDelta]:
    deltas = [e.delta for e in events if e.WhichOneof("event") == "delta"]
    finished = finished_of(events)
    assert finished.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert finished.stop_sequence == "Q:"
    for delta in deltas:
        assert [entry.token_id for entry in delta.logprobs] == list(delta.token_ids)
        assert b"".join(entry.token for entry in delta.logprobs).decode() == delta.text
    streamed = sum(len(delta.token_ids) for delta in deltas)
    assert 0 < streamed < finished.usage.completion_tokens  # the stop's tokens: counted only
    assert text_of(events).endswith("\n")  # the newline that looked like "\n\n" still went out
    return deltas


def test_gemma_streams_no_token_of_the_stop(stub: pb_grpc.InferenceStub) -> None:
    check_real_stream(collect(stub.Generate(issue_request())))


def test_gemma_with_a_stream_interval_streams_the_same_tokens(
    stub: pb_grpc.InferenceStub,
) -> None:
    alone = check_real_stream(collect(stub.Generate(issue_request())))
    with serving(make_settings(stream_interval=3)) as (_, grouped_stub):
        grouped = check_real_stream(collect(grouped_stub.Generate(issue_request())))
    assert [t for d in grouped for t in d.token_ids] == [t for d in alone for t in d.token_ids]
    assert "".join(d.text for d in grouped) == "".join(d.text for d in alone)
