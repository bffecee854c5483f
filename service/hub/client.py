"""The one way this server speaks HTTP to the hub: redirects checked, bodies bounded.

Every request to the hub (the file listing, header reads, downloads) goes
through `HubClient`:

- a redirect is followed only to http(s), never from https down to http, and
  only to addresses `service.hub.addresses` permits (a hub, or a mirror, that
  answers with a link to an internal address is refused, not followed);
- the token is sent only to the hub's own origin (scheme, host and port), so a
  redirect to a CDN, or to plain http on the same host, never carries it;
- a body is read up to a stated number of bytes (`read_bounded`), whatever
  Content-Length claims, and within a deadline, so no answer can make the
  server hold more than the caller asked for, or hold a thread for longer.

What the hub refuses becomes the service's error in `status_error`, from its
status and the X-Error-Code header the hub sets (as huggingface_hub reads it).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import httpcore2
import httpx2

from service.errors import (
    AccessDenied,
    ModelNotFound,
    NotSupported,
    ServiceError,
    Unavailable,
    excerpt,
)
from service.hub.addresses import AddressPolicy, GuardedBackend, Network

MAX_REDIRECTS = 5


@dataclass(frozen=True)
class HubAccess:
    """Where the hub is and how to ask it (the operator's settings)."""

    endpoint: str
    token: str | None = field(default=None, repr=False)
    timeout: float = 10.0  # seconds per network operation
    # Seconds reading a model's metadata (an Admit) may take in all.
    metadata_seconds: float = 30.0
    # Networks a redirect may lead into besides public addresses and the hub's own.
    redirect_networks: tuple[Network, ...] = ()


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL: what a token is bound to."""
    split = urlsplit(url)
    port = split.port or (443 if split.scheme == "https" else 80)
    return split.scheme, (split.hostname or "").lower(), port


class TooLarge(Exception):
    """A body longer than its caller's bound; the caller says what that means."""


class HubClient:
    """HTTP to one hub, as its operator configured it. Not shared between threads."""

    def __init__(self, access: HubAccess) -> None:
        self.access = access
        self._origin = origin(access.endpoint)
        self.policy = AddressPolicy(self._origin[1], self._origin[2], access.redirect_networks)
        self._client = httpx2.Client(
            timeout=access.timeout, follow_redirects=False, transport=_transport(self.policy)
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HubClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def url(self, path: str) -> str:
        return f"{self.access.endpoint.rstrip('/')}/{path.lstrip('/')}"

    @contextmanager
    def get(
        self,
        url: str,
        headers: dict[str, str] | None = None,
        *,
        on_hub_answer: Callable[[httpx2.Response], None] | None = None,
    ) -> Iterator[httpx2.Response]:
        """GET `url`, following the redirects the rules allow; the last answer, unread.
        `on_hub_answer` sees each answer from the hub's own origin (its headers)."""
        for _ in range(MAX_REDIRECTS + 1):
            sent = dict(headers or {})
            if self.access.token and origin(url) == self._origin:
                sent["Authorization"] = f"Bearer {self.access.token}"
            with self._client.stream("GET", url, headers=sent) as response:
                if on_hub_answer is not None and origin(url) == self._origin:
                    on_hub_answer(response)
                if not response.is_redirect:
                    yield response
                    return
                url = self._next(url, response.headers.get("Location", ""))
        raise Unavailable(f"the hub redirected {excerpt(url)} more than {MAX_REDIRECTS} times")

    def _next(self, current: str, location: str) -> str:
        """Where a redirect leads, if the rules let it be followed."""
        try:
            target = urljoin(current, location)
            split = urlsplit(target)
            port = split.port
        except ValueError:
            target, split, port = location, None, None
        if split is None or split.scheme not in ("http", "https") or not split.hostname:
            raise Unavailable(
                f"the hub answered with a redirect to {excerpt(location)}, which is not an "
                "http(s) address: not followed. Check --hf-endpoint"
            )
        if urlsplit(current).scheme == "https" and split.scheme == "http":
            raise AccessDenied(
                f"the hub redirected from https to plain http ({excerpt(target)}): not "
                "followed, so nothing travels unencrypted. Check --hf-endpoint"
            )
        self.policy.check(split.hostname, port or (443 if split.scheme == "https" else 80))
        return target


def _transport(policy: AddressPolicy) -> httpx2.HTTPTransport | None:
    """A transport that connects only where the policy permits. Behind a proxy from the
    environment the proxy connects, so only the check on each URL applies there."""
    if urllib.request.getproxies():
        return None
    transport = httpx2.HTTPTransport()
    pool = transport._pool
    assert isinstance(pool, httpcore2.ConnectionPool)
    transport._pool = httpcore2.ConnectionPool(
        ssl_context=pool._ssl_context,
        network_backend=GuardedBackend(policy),
    )
    return transport


def read_bounded(response: httpx2.Response, most: int, deadline: float | None = None) -> bytes:
    """The body, if it is at most `most` bytes; TooLarge as soon as it is known to be
    longer (from Content-Length, or from the bytes themselves). Unavailable when the
    deadline (time.monotonic()) passes first."""
    declared = response.headers.get("Content-Length", "").strip()
    if declared.isdigit() and int(declared) > most:
        raise TooLarge(int(declared))
    body = bytearray()
    for chunk in response.iter_bytes():
        if len(body) + len(chunk) > most:
            raise TooLarge(len(body) + len(chunk))
        body += chunk
        if deadline is not None and time.monotonic() > deadline:
            raise Unavailable("the hub sent its answer too slowly; retry later")
    return bytes(body)


def read_prefix(response: httpx2.Response, count: int, deadline: float | None = None) -> bytes:
    """The first `count` bytes of the body (fewer if it is shorter); the rest unread."""
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk[: count - len(body)]
        if len(body) >= count:
            break
        if deadline is not None and time.monotonic() > deadline:
            raise Unavailable("the hub sent its answer too slowly; retry later")
    return bytes(body)


def status_error(response: httpx2.Response, label: str) -> ServiceError:
    """What the hub's refusal means for `label` (a repo, a revision, a file)."""
    status = response.status_code
    code = response.headers.get("X-Error-Code", "")
    if code == "GatedRepo":
        return AccessDenied(
            f"{label} is gated on the Hugging Face hub: accept its terms there, and give the "
            "server a token that may read it (--hf-token or HF_TOKEN)"
        )
    if code == "RevisionNotFound":
        return ModelNotFound(f"the Hugging Face hub has no such revision of {label}")
    if code == "EntryNotFound":
        return ModelNotFound(f"the Hugging Face hub no longer has {label}")
    if code == "DisabledRepo":
        return NotSupported(f"{label} is disabled on the Hugging Face hub")
    if code == "RepoNotFound" or status == 404:
        return ModelNotFound(
            f"the Hugging Face hub has no model {label} (a private one needs the server to "
            "have a token that may read it: --hf-token or HF_TOKEN)"
        )
    refusal = refusal_of(status, label)
    if refusal is not None:
        return refusal
    return Unavailable(f"the Hugging Face hub answered HTTP {status} for {label}; retry later")


def refusal_of(status: int, label: str) -> AccessDenied | None:
    """A refusal a retry will not change: 401 and 403 are the hub saying no."""
    if status in (401, 403):
        return AccessDenied(
            f"the Hugging Face hub refused access to {label} (HTTP {status}): give the "
            "server a token that may read it (--hf-token or HF_TOKEN)"
        )
    return None


@contextmanager
def transport_errors(label: str) -> Iterator[None]:
    """A hub that cannot be reached, or that drops the connection, as UNAVAILABLE."""
    try:
        yield
    except httpx2.TransportError as exc:
        raise Unavailable(
            f"the Hugging Face hub could not answer for {label}: {type(exc).__name__}: {exc}"
        ) from exc
