"""grpc.health.v1 with its Watch streams bounded.

Watch is unauthenticated (probes cannot send a token) and each stream stays
open for as long as the client likes: a client that opened 20,000 of them
held 285 MB. So the streams open at once are capped, in all and per
connection; past a cap a Watch is RESOURCE_EXHAUSTED at once. Check, which
answers and ends, is not capped.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

# Longest service name a Watch may name (ours are about 30 characters).
MAX_SERVICE_NAME = 256


class BoundedHealthServicer(health.aio.HealthServicer):  # type: ignore[name-defined,misc]
    def __init__(self, max_watches: int, max_watches_per_connection: int) -> None:
        super().__init__()
        self._max_watches = max_watches
        self._max_per_connection = max_watches_per_connection
        self._watching: Counter[str] = Counter()  # by peer (one connection each)

    @property
    def watching(self) -> int:
        return sum(self._watching.values())

    def serving(self, service: str = "") -> bool:
        """Whether `service` ("": the server as a whole) is SERVING, as Check would say."""
        return bool(self._server_status.get(service) == health_pb2.HealthCheckResponse.SERVING)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        if len(request.service) > MAX_SERVICE_NAME:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a service name is at most {MAX_SERVICE_NAME} characters",
            )
        peer = context.peer()
        refusal = self._refusal(peer)
        if refusal:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        self._watching[peer] += 1
        try:
            await super().Watch(request, context)
        finally:
            self._watching[peer] -= 1
            if self._watching[peer] <= 0:
                del self._watching[peer]

    def _refusal(self, peer: str) -> str:
        if self.watching >= self._max_watches:
            return (
                f"{self._max_watches} health Watch streams are open on this server, its "
                "limit (--max-health-watches); use Check, or retry later"
            )
        if self._watching[peer] >= self._max_per_connection:
            return (
                f"this connection has {self._max_per_connection} health Watch streams open, "
                "the limit per connection (--max-health-watches-per-connection)"
            )
        return ""
