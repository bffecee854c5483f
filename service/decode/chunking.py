"""Several tokens per streamed message, when the operator asks for it (--stream-interval).

Each message a stream sends costs the event loop about a tenth of a
millisecond (the protobuf, the gRPC write, the wake-ups), and that work holds
the GIL the model's thread also needs. With many streams on a fast GPU, one
message per token is where a step's time goes. Grouping a stream's deltas
into messages of up to `interval` tokens divides that cost; the text and the
token ids are the same, in fewer, larger deltas. The first delta always goes
out alone, so time to first token is unchanged, and the end of a generation
flushes whatever is held before the final event.
"""

from __future__ import annotations

from service.decode.sequence import DecodeEvent
from service.text.requests import Delta


def merged(deltas: list[Delta]) -> Delta:
    """One delta carrying the text, token ids and logprobs of several, in order."""
    if len(deltas) == 1:
        return deltas[0]
    return Delta(
        text="".join(delta.text for delta in deltas),
        token_ids=tuple(token for delta in deltas for token in delta.token_ids),
        logprobs=tuple(entry for delta in deltas for entry in delta.logprobs),
    )


class StreamChunker:
    """Groups one stream's events into messages of up to `interval` tokens."""

    def __init__(self, interval: int) -> None:
        self._interval = interval
        self._held: list[Delta] = []
        self._held_tokens = 0
        self._sent_first = False

    def push(self, event: DecodeEvent) -> list[DecodeEvent]:
        """What to send now, given the next event of the generation."""
        if not isinstance(event, Delta):  # the end: what is held goes first
            return [*self.drain(), event]
        if self._interval <= 1:  # the default: every delta as it comes
            return [event]
        self._held.append(event)
        self._held_tokens += max(len(event.token_ids), 1)
        if self._sent_first and self._held_tokens < self._interval:
            return []
        self._sent_first = True
        return self.drain()

    def drain(self) -> list[DecodeEvent]:
        """Everything held, as one delta (or nothing)."""
        if not self._held:
            return []
        held, self._held, self._held_tokens = self._held, [], 0
        return [merged(held)]
