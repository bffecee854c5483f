"""Requests as they arrive: a Generate request's protobuf to the validated request.

Apart from `GenerationRequest.from_pb` because compiling a grammar or JSON
schema needs llama.cpp and the grammar checks (`service.grammar.compile`), which
the request types must not depend on. The servicer runs this off the event
loop; an engine process gets the compiled grammar with the request.
"""

from __future__ import annotations

from inference.v1 import inference_pb2 as pb
from service.text.requests import GenerationLimits, GenerationRequest, Grammar


def generation_request(
    msg: pb.GenerateRequest, limits: GenerationLimits | None = None
) -> GenerationRequest:
    """The request in `msg`, validated, its grammar compiled and checked."""
    return GenerationRequest.from_pb(msg, limits, grammar=_grammar(msg))


def _grammar(msg: pb.GenerateRequest) -> Grammar | None:
    grammar = msg.grammar if msg.HasField("grammar") else None
    json_schema = msg.response_format.json_schema
    if grammar is None and not json_schema:
        return None
    # Imported only when needed: it loads llama.cpp, which start-up must not pay for.
    from service.grammar.compile import resolve_grammar

    return resolve_grammar(grammar, json_schema)
