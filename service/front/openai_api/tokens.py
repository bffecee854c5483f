"""POST /tokenize and POST /detokenize bodies as the contract's requests.

The shapes vLLM and llama-server serve: `{"model", "prompt"}` or `{"model",
"messages", "tools"}` to `{"tokens", "count", "max_model_len"}`, and `{"model",
"tokens"}` to `{"prompt"}`. The ids are those a completion with the same prompt,
or a chat with the same messages and tools, feeds the model. Fields not read
here are ignored and named, as the completions endpoints do.
"""

from __future__ import annotations

from inference.v1 import inference_pb2 as pb
from service.errors import InvalidRequest
from service.front.openai_api.requests import Body, chat_request, without_nulls

TOKENIZE_FIELDS = frozenset({"model", "prompt", "messages", "tools"})
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


def tokenize_request(body: Body) -> tuple[pb.TokenizeRequest, list[str]]:
    """The TokenizeRequest of a /tokenize body, and the fields it ignores."""
    body = without_nulls(body)
    ignored = sorted(set(body) - TOKENIZE_FIELDS)
    model = _model(body)
    if body.get("messages") is not None:
        if body.get("prompt") is not None:
            raise InvalidRequest("give `prompt` or `messages`, not both", param="prompt")
        # Read as a chat's messages and tools are: the same turns, the same checks.
        chat = chat_request({"messages": body["messages"], "tools": body.get("tools")})
        request = pb.TokenizeRequest(model=model, messages=chat.messages, tools=chat.tools)
        return request, ignored
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidRequest(
            "/tokenize takes `prompt` (a string) or `messages` (a chat)", param="prompt"
        )
    return pb.TokenizeRequest(model=model, prompt=prompt), ignored


def detokenize_request(body: Body) -> tuple[pb.DetokenizeRequest, list[str]]:
    """The DetokenizeRequest of a /detokenize body, and the fields it ignores."""
    body = without_nulls(body)
    ignored = sorted(set(body) - DETOKENIZE_FIELDS)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 31 for t in tokens
    ):
        raise InvalidRequest("`tokens` must be an array of token ids", param="tokens")
    return pb.DetokenizeRequest(model=_model(body), token_ids=tokens), ignored


def _model(body: Body) -> str:
    model = body.get("model", "")
    if not isinstance(model, str):
        raise InvalidRequest("`model` must be a string", param="model")
    return model
