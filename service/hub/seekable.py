"""A read-only, seekable raw file of known size, whose subclasses say only how bytes are read.

Two readers hand bytes that are not one local file to code that wants a file
(the GGUF header reader, through io.BufferedReader): a model's chunks read as
the file they join into (service.admission.describe) and a hub file read by
byte ranges (service.hub.ranged). Their position, seek and tell are one piece
of code here, so the two cannot drift apart in how they seek.
"""

from __future__ import annotations

import io
from abc import abstractmethod
from typing import Any


class SeekableReader(io.RawIOBase):
    """`size` bytes, read where the position is by `_read_at`."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        # Both readers have always behaved so, and their callers rely on no more: an unknown
        # whence is a KeyError, a position before the start is clamped to it (where a
        # regular file raises), one past the end is kept and reads there give b"".
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self._position + len(view), self.size)
        done = 0
        while self._position < end:
            count = self._read_at(self._position, view[done : done + end - self._position])
            if not count:  # the source ended early: a short read, as a file gives
                break
            done += count
            # Moved per piece, so an error part way leaves the position after what was read.
            self._position += count
        return done

    @abstractmethod
    def _read_at(self, position: int, into: memoryview) -> int:
        """Bytes from `position` (before `size`) into `into`, at least one of them unless
        the source ended early; fewer than asked is fine, the caller asks again."""
