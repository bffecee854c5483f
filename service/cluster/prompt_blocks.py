"""A request's prompt as a chain of block hashes, for prefix-affinity routing.

The picker has no tokenizer, so it cuts the prompt's text (as SGLang's router
does) rather than its tokens: every chat message starts a new block, and long
text is cut every `BLOCK_CHARS` characters. Each block's hash covers everything
before it too, so two prompts share a block hash exactly when they share the
text up to that block's end. A conversation's next turn repeats every earlier
message, so all of the previous turn's blocks match.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from inference.v1 import inference_pb2 as pb

BLOCK_CHARS = 64


@dataclass(frozen=True)
class Block:
    digest: bytes
    end: int  # characters of prompt text up to the end of this block


def chained_blocks(
    pieces: list[str], block_chars: int = BLOCK_CHARS, *, model: str = ""
) -> list[Block]:
    """Blocks of each piece in turn (a piece never shares a block with the next). The
    chain starts from the model's name: the same prompt to another model is another
    prompt, in another cache."""
    blocks: list[Block] = []
    running = hashlib.blake2b(model.encode("utf-8", "surrogatepass"), digest_size=16)
    end = 0
    for piece in pieces:
        running.update(b"\x1e")  # a piece boundary is part of the text hashed
        for start in range(0, max(len(piece), 1), block_chars):
            chunk = piece[start : start + block_chars]
            running.update(chunk.encode("utf-8", "surrogatepass"))
            end += len(chunk)
            blocks.append(Block(running.copy().digest(), end))
    return blocks


def generation_pieces(request: pb.GenerateRequest) -> list[str]:
    """The text the model's prompt is built from, in order: the raw prompt, or
    each chat message (its role, content and tool calls)."""
    if not request.messages:
        return [request.prompt]
    # Tools are rendered into the prompt ahead of the conversation.
    tools = [tool.SerializeToString(deterministic=True).hex() for tool in request.tools]
    return ["".join(tools)] + [_message_text(message) for message in request.messages]


def _message_text(message: pb.ChatMessage) -> str:
    calls = "".join(f"\x1f{call.name}\x1f{call.arguments_json}" for call in message.tool_calls)
    return f"{message.role}\x1f{message.name}\x1f{message.content}{calls}"
