"""`POST /v1/embeddings` as the contract's Embed, both ways.

`input` is what OpenAI's API takes: a string, an array of strings, an array of
token ids, or an array of such arrays; each becomes one EmbedInput, in order.
`encoding_format` "float" (the default) gives arrays of numbers, "base64" the
little-endian float32 bytes of each vector, base64-encoded, as OpenAI's SDKs
decode them. `dimensions` must be the model's own: a model not trained to give
shorter vectors (Matryoshka) gives worse ones when cut, so a smaller one is
refused rather than served. `user` is accepted and ignored, like any unknown field.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from inference.v1 import inference_pb2 as pb
from service.embeddings.requests import MAX_INPUTS
from service.errors import InvalidRequest

Body = dict[str, Any]
_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions"})
_ENCODINGS = ("float", "base64")


def embed_request(body: Body) -> pb.EmbedRequest:
    """The Embed request for a body (nulls already removed)."""
    model = body.get("model", "")
    if not isinstance(model, str):
        raise InvalidRequest("`model` must be a string")
    return pb.EmbedRequest(model=model, inputs=embed_inputs(body.get("input")))


def embed_inputs(value: object) -> list[pb.EmbedInput]:
    """OpenAI's `input` in each of its four shapes."""
    if isinstance(value, str):
        return [pb.EmbedInput(text=value)]
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "`input` must be a string, an array of strings, an array of token ids, or an "
            "array of arrays of token ids, and not empty"
        )
    if len(value) > MAX_INPUTS and not all(_is_token(item) for item in value):
        raise InvalidRequest(f"`input` holds {len(value)} items; at most {MAX_INPUTS}")
    if all(_is_token(item) for item in value):
        return [pb.EmbedInput(tokens=pb.EmbedTokens(ids=value))]
    return [_one_input(item, index) for index, item in enumerate(value)]


def _one_input(item: object, index: int) -> pb.EmbedInput:
    if isinstance(item, str):
        return pb.EmbedInput(text=item)
    if isinstance(item, list) and item and all(_is_token(token) for token in item):
        return pb.EmbedInput(tokens=pb.EmbedTokens(ids=item))
    raise InvalidRequest(
        f"`input[{index}]` must be a string or a non-empty array of token ids (integers "
        "from 0 to 4294967295)"
    )


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32


def encoding(body: Body) -> str:
    value = body.get("encoding_format", "float")
    if value not in _ENCODINGS:
        raise InvalidRequest('`encoding_format` must be "float" or "base64"')
    return str(value)


def check_dimensions(body: Body, given: int) -> None:
    """`dimensions`, if asked, is the model's own (see the module docstring)."""
    wanted = body.get("dimensions")
    if wanted is None:
        return
    if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 1:
        raise InvalidRequest("`dimensions` must be a positive integer")
    if wanted != given:
        raise InvalidRequest(
            f"the model gives {given} dimensions and was not trained to give {wanted}; "
            "leave `dimensions` out"
        )


def ignored(body: Body) -> list[str]:
    return sorted(set(body) - _FIELDS)


def embeddings_body(response: pb.EmbedResponse, encoding_format: str) -> Body:
    """OpenAI's list of embedding objects, and its usage."""
    return {
        "object": "list",
        "model": response.model,
        "data": [
            {
                "object": "embedding",
                "index": index,
                "embedding": _encoded(list(item.values), encoding_format),
            }
            for index, item in enumerate(response.embeddings)
        ],
        "usage": {
            "prompt_tokens": response.prompt_tokens,
            "total_tokens": response.prompt_tokens,
        },
    }


def _encoded(values: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        raw = np.asarray(values, dtype="<f4").tobytes()
        return base64.b64encode(raw).decode("ascii")
    return values
