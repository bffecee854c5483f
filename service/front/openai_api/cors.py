"""Cross-origin requests from browser pages (`--http-cors-origins`), off by default.

With origins configured, a request whose `Origin` is one of them (or any, with
`*`) is answered with `Access-Control-Allow-Origin`, on every response: answers,
event streams and errors alike (set as the headers go out, whatever sends them).
A browser's preflight (`OPTIONS` with `Access-Control-Request-Method`) is
answered here, before the bearer token is asked for (a browser sends none with
it): 204 with the methods and the headers the page asked to send, or 403 for an
origin not allowed. The headers a page may read are the request id, the ignored
fields and `Retry-After`. Credentials (cookies) are never allowed: the API's
token travels in the `Authorization` header, which the page sends itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from service.config import ANY_ORIGIN as ANY
from service.request_id import METADATA_KEY

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

METHODS = "GET, POST, OPTIONS"
EXPOSED = ", ".join((METADATA_KEY, "x-ignored-fields", "Retry-After"))
# How long a browser may keep a preflight's answer.
MAX_AGE_SECONDS = 600


class Cors:
    def __init__(self, origins: frozenset[str]) -> None:
        self._origins = frozenset(origin.rstrip("/") for origin in origins)

    def allowed(self, origin: str | None) -> str | None:
        """What `Access-Control-Allow-Origin` says to `origin`; None: nothing."""
        if not origin or not self._origins:
            return None
        if ANY in self._origins:
            return ANY
        return origin if origin in self._origins else None

    @web.middleware
    async def preflight(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A browser's preflight, answered before anything else looks at the request."""
        asking = request.headers.get("Access-Control-Request-Method")
        if request.method != "OPTIONS" or asking is None or not self._origins:
            return await handler(request)
        if self.allowed(request.headers.get("Origin")) is None:
            return web.json_response(
                {
                    "error": {
                        "message": "this origin may not call the API from a browser "
                        "(see --http-cors-origins)",
                        "type": "permission_error",
                        "param": None,
                        "code": "origin_not_allowed",
                    }
                },
                status=403,
            )
        headers = {
            "Access-Control-Allow-Methods": METHODS,
            "Access-Control-Max-Age": str(MAX_AGE_SECONDS),
        }
        wanted = request.headers.get("Access-Control-Request-Headers")
        if wanted:
            headers["Access-Control-Allow-Headers"] = wanted
        return web.Response(status=204, headers=headers)

    async def add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """`on_response_prepare`: the CORS headers of an allowed origin, on any response."""
        allowed = self.allowed(request.headers.get("Origin"))
        if self._origins and ANY not in self._origins:
            response.headers.add("Vary", "Origin")  # the answer depends on the origin
        if allowed is None:
            return
        response.headers["Access-Control-Allow-Origin"] = allowed
        response.headers["Access-Control-Expose-Headers"] = EXPOSED
