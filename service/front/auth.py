"""Bearer-token authentication of Inference RPCs (`authorization: Bearer TOKEN`).

Health and reflection are never wrapped by `service.front.rpc`, so probes and
grpcurl's listing need no token.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any

from service.errors import Unauthenticated


class BearerAuth:
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def check(self, metadata: Iterable[tuple[str, Any]] | None) -> None:
        values = [value for key, value in metadata or () if key == "authorization"]
        if not values:
            raise Unauthenticated("missing `authorization: Bearer <token>` metadata")
        # aiohttp hands header bytes that are not UTF-8 through as surrogate escapes:
        # the same bytes back, compared as any other wrong token.
        value = values[0]
        given = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
        if not hmac.compare_digest(given, self._expected):
            raise Unauthenticated("invalid bearer token")
