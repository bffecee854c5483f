"""A JSON body's budget, checked on its raw bytes before it is parsed, and the lone
surrogates refused after (service.front.openai_api.body says why and where).

The counts are an upper bound read at C speed: every item of an array or member of
an object but the first follows a comma, and every container opens with a bracket.
Text inside strings counts too, so a body of prose or code with more than a million
commas is refused: that is several megabytes of text, past any context served here.
No aiohttp here: the cluster's picker reads bodies with these too.
"""

from __future__ import annotations

import re

from service.errors import InvalidRequest

# Items (array elements and object members, every level) and containers (objects
# and arrays) one body may hold. A million token ids, or 2,048 embedding inputs of
# 8,192 ids each, as OpenAI's limits have them, fit; the memory of the parsed body
# stays below about 150 MB (docs/operations.md, "Request bodies").
MAX_ITEMS = 1 << 20
MAX_CONTAINERS = 1 << 18
# A `\uD800`-`\uDFFF` escape: the only way a lone surrogate enters (raw UTF-8 cannot
# hold one, and json.loads refuses it). Pairs are fine: the walk checks each string.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def check_json_budget(raw: bytes) -> None:
    """Refuse, before parsing, a body with more items or containers than MAX_ITEMS and
    MAX_CONTAINERS: an upper bound counted on the raw bytes (the module says how)."""
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > MAX_CONTAINERS:
        raise InvalidRequest(
            f"the request body holds more than {MAX_CONTAINERS} JSON objects and arrays "
            "(brackets counted, those in strings too); send less in one request"
        )
    items = raw.count(b",") + containers + 1
    if items > MAX_ITEMS:
        raise InvalidRequest(
            f"the request body holds more than {MAX_ITEMS} JSON items (commas counted, "
            "those in strings too); send less in one request"
        )


def refuse_lone_surrogates(raw: bytes, body: object) -> None:
    """InvalidRequest naming the first string of `body` that holds a lone UTF-16
    surrogate (`"\\ud800"` unpaired), which no model, tokenizer or protobuf can take.
    The walk runs only when the raw body has a surrogate escape at all."""
    if _SURROGATE_ESCAPE.search(raw) is None:
        return
    pending: list[tuple[str, object]] = [("", body)]
    while pending:
        where, value = pending.pop()
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, dict):
            for key, child in value.items():
                _check_text(key, where or "the body")
                pending.append((f"{where}.{key}" if where else key, child))
        elif isinstance(value, list):
            pending.extend((f"{where}[{index}]", child) for index, child in enumerate(value))


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise InvalidRequest(
            f"`{where}` holds a lone UTF-16 surrogate (\\u{ord(bad):04x}) at character "
            f"{exc.start}; strings must be valid Unicode (a surrogate only in a pair)",
            param=where.split(".")[0].split("[")[0] or None,
        ) from None
