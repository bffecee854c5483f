"""The conversations `previous_response_id` continues: kept in memory, per server.

Each response made with `store` (OpenAI's default) is kept as its whole
conversation in chat form: the turns it continued, its own input, and its
answer (`instructions` are not kept: OpenAI does not carry them over either).
A response is a copy of its conversation, not a link to the one before, so
dropping one never breaks another.

Bounded, least recently used first out: at most `max_responses` responses and
`max_characters` characters of their conversations' JSON, each conversation
counted whole though turns it shares with others are held once (the bound is
on the safe side). A conversation larger than the whole bound is not kept. It
lives on the event loop, like the rest of the front's bookkeeping.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from service.errors import InvalidRequest, excerpt

Json = dict[str, Any]

MAX_RESPONSES = 1024
MAX_CHARACTERS = 64 << 20


@dataclass(frozen=True)
class History:
    """A kept conversation: its messages, oldest first, and their size."""

    messages: tuple[Json, ...] = ()
    size: int = 0  # characters of the messages' JSON


class Conversations:
    def __init__(
        self, max_responses: int = MAX_RESPONSES, max_characters: int = MAX_CHARACTERS
    ) -> None:
        self._max_responses = max_responses
        self._max_characters = max_characters
        self._kept: OrderedDict[str, History] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return len(self._kept)

    def conversation(self, response_id: str) -> History:
        """The conversation up to and with the response `response_id`, or
        InvalidRequest if it is not kept."""
        kept = self._kept.get(response_id)
        if kept is None:
            raise InvalidRequest(
                f"previous response {excerpt(response_id, 80)} is not kept here: responses "
                f"are kept in this server's memory (the last {self._max_responses}, "
                f"{self._max_characters >> 20} MiB at most), only with `store` true, and "
                "not across restarts or replicas; send the whole conversation as `input`",
                param="previous_response_id",
            )
        self._kept.move_to_end(response_id)
        return kept

    def keep(self, response_id: str, history: History, messages: list[Json]) -> None:
        """Keep the conversation `history` continued by `messages` (this response's
        input and answer) as `response_id`'s."""
        size = len(json.dumps(messages, separators=(",", ":")))
        kept = History((*history.messages, *messages), history.size + size)
        if kept.size > self._max_characters:
            return
        self._kept[response_id] = kept
        self._size += kept.size
        while len(self._kept) > self._max_responses or self._size > self._max_characters:
            _, dropped = self._kept.popitem(last=False)
            self._size -= dropped.size
