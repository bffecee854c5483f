"""The contract's GenerateResponse stream as OpenAI's response objects.

`Reply` follows one generation's events and writes either the chunks of a
streamed answer (`chunks`) or, at the end, the whole answer (`whole`), for
chat completions or text completions alike. With `n` above 1, or several
prompts, each choice has a Reply of its own (its `index`), and
`whole_of`/`usage_of` join them.

A chat message and a chat logprobs object carry `refusal: null`, as OpenAI's
schema requires the key (a model here never refuses apart from its text). A
forced tool call cut off by max_tokens ends with finish_reason "length", the
calls completed before the cut, and no text: the half-written call's markup
is not the model's answer to a person.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from inference.v1 import inference_pb2 as pb
from service.front.openai_api.tool_text import ToolTextGate

Json = dict[str, Any]

FINISH_REASONS = {
    pb.FINISH_REASON_END_OF_TURN: "stop",
    pb.FINISH_REASON_STOP_SEQUENCE: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_TIME_LIMIT: "length",  # cut short by the server's clock
    pb.FINISH_REASON_TOOL_CALL: "tool_calls",
}


def completion_id(chat: bool) -> str:
    """A new id for one request's completion, shared by its choices and its chunks."""
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


@dataclass
class Reply:
    """One generation, as `chat.completion` or `text_completion` objects."""

    chat: bool
    id: str  # the completion's (completion_id), the same for every choice
    index: int = 0  # which of the request's choices
    # With tools, streamed text goes out only where it cannot belong to a call block
    # (which only the finished parse takes out): see tool_text.
    hold_text: bool = False
    # A call was forced: the text is nothing but calls, never content.
    forced: bool = False
    # Completions with `echo`: the prompt's text, which the choice's text begins with.
    echo: str = ""
    # Whether this choice's prompt tokens count in `usage` (the first choice of its
    # prompt: `n` choices of one prompt read it once).
    counts_prompt: bool = True
    model: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    text: list[str] = field(default_factory=list)
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    finished: pb.GenerationFinished | None = None
    _gate: ToolTextGate = field(default_factory=ToolTextGate)
    _chars: int = 0  # of the text so far
    _delta_at: int = 0  # where the last delta's text begins in it

    def chunks(self, response: pb.GenerateResponse) -> list[Json]:
        """What one event adds to a streamed answer (maybe nothing)."""
        kind = response.WhichOneof("event")
        if kind == "started":
            self.model = response.started.model
            if self.chat:
                return [self._chunk({"role": "assistant", "content": ""})]
            return [self._chunk(self.echo)] if self.echo else []
        if kind == "delta":
            self.take(response)
            if self.hold_text and self.chat:
                text = self._gate.add(response.delta.text)
                return [self._chunk(self._delta(text))] if text else []
            if not response.delta.text and not response.delta.logprobs:
                return []
            return [self._chunk(self._delta(response.delta.text), response.delta.logprobs)]
        if kind == "finished":
            self.take(response)
            return self._closing_chunks()
        return []  # pull progress has no OpenAI shape

    def take(self, response: pb.GenerateResponse) -> None:
        """Keep what the whole answer needs from one event."""
        kind = response.WhichOneof("event")
        if kind == "started":
            self.model = response.started.model
        elif kind == "delta":
            self.text.append(response.delta.text)
            self.logprobs.extend(response.delta.logprobs)
            self._delta_at, self._chars = self._chars, self._chars + len(response.delta.text)
        elif kind == "finished":
            self.finished = response.finished

    def whole(self) -> Json:
        return {**self._envelope(), "choices": [self.choice()], "usage": self.usage()}

    def choice(self) -> Json:
        """This choice of a whole answer."""
        finished = self._finished()
        choice: Json = {
            "index": self.index,
            "finish_reason": FINISH_REASONS.get(finished.finish_reason, "stop"),
        }
        choice["logprobs"] = self._logprobs(self.logprobs, 0) if self.logprobs else None
        if self.chat:
            parts = self._message_parts(finished)
            choice["message"] = {"role": "assistant", **parts, "refusal": None}
        else:
            choice["text"] = self.echo + "".join(self.text)
        return choice

    def usage(self) -> Json:
        usage = self._finished().usage
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
        }

    def _closing_chunks(self) -> list[Json]:
        finished = self._finished()
        chunks = []
        if self.chat and self.hold_text:
            parts = self._message_parts(finished)
            rest = self._gate.remainder(parts["content"] or "")
            if rest or "tool_calls" in parts:
                calls = [{**call, "index": i} for i, call in enumerate(parts.get("tool_calls", []))]
                delta: Json = {"content": rest or None}
                if calls:
                    delta["tool_calls"] = calls
                chunks.append(self._chunk(delta))
        reason = FINISH_REASONS.get(finished.finish_reason, "stop")
        chunks.append(self._chunk({} if self.chat else "", finish_reason=reason))
        return chunks

    def _message_parts(self, finished: pb.GenerationFinished) -> Json:
        if self.forced and not finished.tool_calls:
            return {"content": None}  # a call cut off before its end (see the docstring)
        if self.forced:
            # Only complete calls: what the parse kept as text is a call cut off.
            finished = _without_content(finished)
        if not finished.tool_calls:
            return {"content": "".join(self.text)}
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments_json},
            }
            for c in finished.tool_calls
        ]
        return {"content": finished.content or None, "tool_calls": calls}

    def _delta(self, text: str) -> Json | str:
        return {"content": text} if self.chat else text

    def _chunk(
        self,
        delta: Json | str,
        logprobs: Any = (),
        finish_reason: str | None = None,
    ) -> Json:
        choice: Json = {"index": self.index, "finish_reason": finish_reason}
        if self.chat:
            choice["delta"] = delta
        else:
            choice["text"] = delta
        choice["logprobs"] = self._logprobs(list(logprobs), self._delta_at) if logprobs else None
        return {**self._envelope(chunk=True), "choices": [choice]}

    def _envelope(self, chunk: bool = False) -> Json:
        kind = "chat.completion" if self.chat else "text_completion"
        if chunk and self.chat:
            kind += ".chunk"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _logprobs(self, entries: list[pb.TokenLogprob], start: int) -> Json:
        """The logprobs object of `entries`, whose text begins at `start` of the
        generated text (a completion's `text_offset` counts the echoed prompt too)."""
        if self.chat:
            return {"content": [_chat_logprob(entry) for entry in entries], "refusal": None}
        tokens = [_text(entry.token) for entry in entries]
        offsets, at = [], len(self.echo) + start
        for token in tokens:
            offsets.append(at)
            at += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [entry.logprob for entry in entries],
            "top_logprobs": [
                {_text(top.token): top.logprob for top in entry.top_logprobs} for entry in entries
            ],
            "text_offset": offsets,
        }

    def _finished(self) -> pb.GenerationFinished:
        if self.finished is None:
            raise RuntimeError("the generation ended without its finished event")
        return self.finished


def whole_of(replies: list[Reply]) -> Json:
    """The whole answer of several choices of one request."""
    first = replies[0]
    choices = [reply.choice() for reply in replies]
    return {**first._envelope(), "choices": choices, "usage": usage_of(replies)}


def usage_chunk_of(replies: list[Reply]) -> Json:
    return {**replies[0]._envelope(chunk=True), "choices": [], "usage": usage_of(replies)}


def usage_of(replies: list[Reply]) -> Json:
    """As OpenAI counts `n` choices: each prompt once, every choice's completion."""
    usage = replies[0].usage()
    counted = [reply.usage() for reply in replies if reply.counts_prompt]
    usage["prompt_tokens"] = sum(each["prompt_tokens"] for each in counted)
    details = usage["prompt_tokens_details"]
    details["cached_tokens"] = sum(
        each["prompt_tokens_details"]["cached_tokens"] for each in counted
    )
    completion = sum(reply.usage()["completion_tokens"] for reply in replies)
    usage["completion_tokens"] = completion
    usage["total_tokens"] = usage["prompt_tokens"] + completion
    return usage


def _without_content(finished: pb.GenerationFinished) -> pb.GenerationFinished:
    kept = pb.GenerationFinished()
    kept.CopyFrom(finished)
    kept.content = ""
    return kept


def _chat_logprob(entry: pb.TokenLogprob) -> Json:
    return {
        "token": _text(entry.token),
        "logprob": entry.logprob,
        "bytes": list(entry.token),
        "top_logprobs": [
            {"token": _text(top.token), "logprob": top.logprob, "bytes": list(top.token)}
            for top in entry.top_logprobs
        ],
    }


def _text(token: bytes) -> str:
    """A token's text; one holding part of a UTF-8 character shows as escapes."""
    return token.decode("utf-8", errors="backslashreplace")
