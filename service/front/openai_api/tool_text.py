"""What of a streamed answer with tools may go out as text before it ends.

With tools offered, the model may write call blocks among its text, and only the
finished parse (service/tools, in the engine) takes them out. Holding every word
until the end made a streamed answer arrive in one piece, so this lets out the
text that cannot belong to a call, as it comes:

- nothing while the answer is blank, nor when it starts like a call written
  without markers (Gemma's `[name(...)]` or `{"name": ...}`, possibly fenced):
  such an answer is held whole;
- otherwise the text up to the first call marker of any convention we parse
  (`<tool_call>`, `<start_function_call>`), less an end that could be the start
  of one and less trailing whitespace (a parse that finds calls strips the
  content); from the first marker on, everything is held.

At the end, `remainder` is what the parsed content adds to what went out.
"""

from __future__ import annotations

from service.decode.text import releasable_length
from service.tools.function_gemma import OPEN as FUNCTION_GEMMA_OPEN
from service.tools.hermes import OPEN as HERMES_OPEN

CALL_MARKERS = (HERMES_OPEN, FUNCTION_GEMMA_OPEN)
# How an answer that is a call without markers starts (service/tools/gemma.py).
CALL_STARTS = ("[", "{", "`")


class ToolTextGate:
    """One streamed answer's text, and how much of it went out.

    Only the text not yet let out is kept beside what went out, so each delta
    costs its own length, not the answer's: an answer can be long."""

    def __init__(self) -> None:
        self._pending = ""  # come but not let out (before the first non-blank: all of it)
        self._sent: list[str] = []  # let out, from the first non-blank on
        self._lead: int | None = None  # the blanks before the first non-blank, once known
        self._held = False  # the rest is held to the end

    def add(self, delta: str) -> str:
        """The text that may go out now, after `delta` came."""
        if self._held:
            return ""
        self._pending += delta
        if self._lead is None:
            stripped = self._pending.lstrip()
            if not stripped:
                return ""
            if stripped.startswith(CALL_STARTS):
                self._held = True
                return ""
            self._lead = len(self._pending) - len(stripped)
            self._pending = stripped
        end = self._safe_end()
        piece, self._pending = self._pending[:end], self._pending[end:]
        if piece:
            self._sent.append(piece)
        return piece

    def remainder(self, content: str) -> str:
        """What of the parsed `content` has not gone out yet."""
        sent = "".join(self._sent)
        if content.startswith(sent):  # calls found: the content was stripped
            return content[len(sent) :]
        begin = self._lead or 0  # no calls: the content is the text, leading blanks too
        if content[begin:].startswith(sent):
            return content[begin + len(sent) :]
        common = 0  # not expected; never send text twice
        while common < min(len(content), len(sent)) and content[common] == sent[common]:
            common += 1
        return content[common:]

    def _safe_end(self) -> int:
        """How much of the pending text may go out: up to a call marker (after which
        all is held), less an end that may become one and less trailing blanks."""
        text = self._pending
        found = [at for marker in CALL_MARKERS if (at := text.find(marker)) >= 0]
        if found:
            end, self._held = min(found), True
        else:  # an end that may become a marker waits, as one that may become a stop does
            end = releasable_length(text, CALL_MARKERS)
        return len(text[:end].rstrip())
