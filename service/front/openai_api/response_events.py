"""A generation's events as a Responses API `response` and its typed events.

`ResponseEvents` follows one Generate through the chat completion it is
(`responses.Reply`, with its hold on text that may be a call block) and turns
each chunk into the Responses events a stream sends, numbered by
`sequence_number`:

    response.created, response.in_progress
    response.output_item.added (message), response.content_part.added
    response.output_text.delta ...
    response.output_text.done, response.content_part.done, response.output_item.done
    for each call: response.output_item.added (function_call),
        response.function_call_arguments.delta, .done, response.output_item.done
    response.completed (or response.incomplete: max_output_tokens)

A whole answer is the same walk with the events dropped, so the two agree. An
error after the stream began is an `error` event, then `response.failed`. A
finished response made with `store` is kept for `previous_response_id`.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from inference.v1 import inference_pb2 as pb
from service.front.openai_api.conversations import Conversations
from service.front.openai_api.responses import Reply
from service.front.openai_api.responses_api import ResponsesRequest

Json = dict[str, Any]

# What a response that failed says of its error, from the error's OpenAI type.
_FAILURE_CODES = {
    "rate_limit_error": "rate_limit_exceeded",
    "invalid_request_error": "invalid_prompt",
}


class ResponseEvents:
    """One response: its id, the events it has sent, and the object they built."""

    def __init__(self, request: ResponsesRequest, conversations: Conversations) -> None:
        self.id = "resp_" + secrets.token_hex(24)
        self._request = request
        self._conversations = conversations
        generation = request.generation
        self._reply = Reply(
            True,
            self.id,
            hold_text=bool(generation.tools),
            forced=generation.HasField("tool_choice"),
        )
        self._created = int(time.time())
        self._completed: int | None = None
        self._sequence = 0
        self._status = "in_progress"
        self._output: list[Json] = []
        self._message: Json | None = None  # the message item being written
        self._text: list[str] = []
        self._logprobs: list[Json] = []
        self._calls: list[Json] = []
        self._error: Json | None = None

    def events(self, event: pb.GenerateResponse) -> list[Json]:
        """The events one event of the generation adds (maybe none)."""
        chunks = self._reply.chunks(event)
        if event.WhichOneof("event") == "started":
            return [self._state("response.created"), self._state("response.in_progress")]
        events: list[Json] = []
        for chunk in chunks:
            choice = chunk["choices"][0]
            delta = choice["delta"]
            logprobs = (choice.get("logprobs") or {}).get("content") or []
            if delta.get("content") or logprobs:
                events += self._text_delta(delta.get("content") or "", logprobs)
            self._calls += delta.get("tool_calls") or []
            if choice["finish_reason"] is not None:
                events += self._finish(choice["finish_reason"])
        return events

    def failed(self, error: Json) -> list[Json]:
        """The events that end a stream on an error (OpenAI's `{"error": ...}` body)."""
        described = error["error"]
        self._status = "failed"
        self._error = {
            "code": _FAILURE_CODES.get(described["type"], "server_error"),
            "message": described["message"],
        }
        return [
            self._numbered(
                {
                    "type": "error",
                    "code": described["code"],
                    "message": described["message"],
                    "param": described["param"],
                }
            ),
            self._state("response.failed"),
        ]

    def response(self) -> Json:
        """The response object as it stands."""
        request, body = self._request, self._request.body
        finished = self._reply.finished
        length = finished is not None and finished.finish_reason in (
            pb.FINISH_REASON_LENGTH,
            pb.FINISH_REASON_TIME_LIMIT,
        )
        text_format = (body.get("text") or {}).get("format") or {"type": "text"}
        response: Json = {
            "id": self.id,
            "object": "response",
            "created_at": self._created,
            "status": self._status,
            "background": False,
            "completed_at": self._completed,
            "error": self._error,
            "incomplete_details": {"reason": "max_output_tokens"} if length else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": None,
            "model": self._reply.model or request.generation.model,
            "output": list(self._output),
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "store": request.store,
            "temperature": body.get("temperature"),
            "text": {"format": text_format},
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": request.tools,
            "top_logprobs": body.get("top_logprobs"),
            "top_p": body.get("top_p"),
            "truncation": "disabled",
            "metadata": body.get("metadata") or {},
        }
        if finished is not None:  # OpenAI's schema has no null usage: none until the end
            response["usage"] = self._usage()
        return response

    # --- the output items -------------------------------------------------------------

    def _text_delta(self, text: str, logprobs: list[Json]) -> list[Json]:
        events = [] if self._message is not None else self._open_message()
        assert self._message is not None
        self._text.append(text)
        self._logprobs += logprobs
        delta = self._event(
            "response.output_text.delta",
            **self._in_message(),
            delta=text,
            logprobs=[_brief(entry) for entry in logprobs],
        )
        return [*events, delta]

    def _open_message(self) -> list[Json]:
        self._message = {
            "id": "msg_" + secrets.token_hex(24),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        return [
            self._event(
                "response.output_item.added", output_index=len(self._output), item=self._message
            ),
            self._event(
                "response.content_part.added",
                **self._in_message(),
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            ),
        ]

    def _in_message(self) -> Json:
        assert self._message is not None
        return {
            "item_id": self._message["id"],
            "output_index": len(self._output),
            "content_index": 0,
        }

    def _close_message(self, status: str) -> list[Json]:
        assert self._message is not None
        text = "".join(self._text)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": self._logprobs}
        item = {**self._message, "status": status, "content": [part]}
        where = self._in_message()
        events = [
            self._event(
                "response.output_text.done",
                **where,
                text=text,
                logprobs=[_brief(entry) for entry in self._logprobs],
            ),
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=where["output_index"], item=item),
        ]
        self._output.append(item)
        return events

    def _function_call(self, call: Json) -> list[Json]:
        function = call["function"]
        item = {
            "id": "fc_" + secrets.token_hex(24),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call["id"],
            "name": function["name"],
            "arguments": "",
        }
        index = len(self._output)
        done = {**item, "status": "completed", "arguments": function["arguments"]}
        self._output.append(done)
        where = {"item_id": item["id"], "output_index": index}
        return [
            self._event("response.output_item.added", output_index=index, item=item),
            self._event(
                "response.function_call_arguments.delta", **where, delta=function["arguments"]
            ),
            self._event(
                "response.function_call_arguments.done",
                **where,
                name=function["name"],
                arguments=function["arguments"],
            ),
            self._event("response.output_item.done", output_index=index, item=done),
        ]

    def _finish(self, reason: str) -> list[Json]:
        incomplete = reason == "length"
        events = []
        if self._message is None and not self._calls:  # an empty answer is an empty message
            events += self._open_message()
        if self._message is not None:
            events += self._close_message("incomplete" if incomplete else "completed")
        for call in self._calls:
            events += self._function_call(call)
        self._status = "incomplete" if incomplete else "completed"
        self._completed = int(time.time())
        if self._request.store:
            self._keep()
        return [*events, self._state(f"response.{self._status}")]

    def _keep(self) -> None:
        """This response's turn and answer, for a later `previous_response_id`."""
        answer: Json = {"role": "assistant", "content": "".join(self._text) or None}
        if self._calls:
            answer["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": c["function"]} for c in self._calls
            ]
        request = self._request
        self._conversations.keep(self.id, request.history, [*request.turn, answer])

    def _usage(self) -> Json:
        usage = self._reply.usage()
        return {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {
                "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]
            },
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        }

    # --- events -----------------------------------------------------------------------

    def _state(self, kind: str) -> Json:
        """response.created, .in_progress, .completed, ...: the response as it stands."""
        return self._event(kind, response=self.response())

    def _event(self, kind: str, **fields: Any) -> Json:
        return self._numbered({"type": kind, **fields})

    def _numbered(self, event: Json) -> Json:
        event["sequence_number"] = self._sequence
        self._sequence += 1
        return event


def sse(event: Json) -> bytes:
    """One server-sent event, named by its type as OpenAI's are."""
    data = json.dumps(event, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def _brief(entry: Json) -> Json:
    """A token's log-probability as the text events carry it (no bytes)."""
    tops = [{"token": top["token"], "logprob": top["logprob"]} for top in entry["top_logprobs"]]
    return {"token": entry["token"], "logprob": entry["logprob"], "top_logprobs": tops}
