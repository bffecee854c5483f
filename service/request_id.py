"""Request ids: the client's `x-request-id`, or one made up, on every log line of the RPC."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from typing import Any

METADATA_KEY = "x-request-id"
_ACCEPTABLE = re.compile(r"[A-Za-z0-9._:/@+=-]{1,128}")


def request_id_from(metadata: Iterable[tuple[str, Any]] | None) -> str:
    """The caller's id when it is short and printable; otherwise a fresh one."""
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str) and _ACCEPTABLE.fullmatch(value):
            return value
    return uuid.uuid4().hex
