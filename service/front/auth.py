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
        given = values[0].encode() if isinstance(values[0], str) else bytes(values[0])
        if not hmac.compare_digest(given, self._expected):
            raise Unauthenticated("invalid bearer token")
