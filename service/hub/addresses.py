"""Which network addresses the hub may send this server to.

The hub's endpoint is the operator's choice, so its own addresses are trusted.
What the hub answers is not: a redirect could point the server at a cloud
metadata service (169.254.169.254), an admin port on loopback, or a host on
the private network behind it, and the server would fetch it with its own
network position. So a redirect reaches only

- a public (globally routable) address, however it is spelled: an IPv6
  address that carries an IPv4 one (IPv4-mapped `::ffff:a.b.c.d`, SIIT
  `::ffff:0:a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`, Teredo) is
  public only if the IPv4 address inside is too,
  and the special-purpose ranges Python's own table lacks (192.0.0.0/24, the
  local-use NAT64 prefix 64:ff9b:1::/48, the deprecated IPv4-compatible ::/96,
  3fff::/20, 5f00::/16, fec0::/10) are not;
- an address the hub's own host name resolves to (a mirror on loopback or on
  the private network that serves its files from another port), or
- a network the operator named (`--hf-redirect-networks 10.0.0.0/8,...`).

The check is made twice: on the URL before it is asked (a clear refusal), and
again when the connection is made (`GuardedBackend`), on the very addresses
connected to, so a name that resolves differently the second time (DNS
rebinding) gains nothing.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import httpcore2
from httpcore2._backends.sync import SyncBackend

from service.errors import AccessDenied, excerpt

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(text: str) -> list[Network]:
    """`10.0.0.0/8,fd00::/8` as networks; ValueError naming a part that is not one."""
    networks: list[Network] = []
    for part in (p.strip() for p in text.split(",")):
        if part:
            networks.append(ipaddress.ip_network(part, strict=False))
    return networks


# Special-purpose ranges (IANA's registries) that are not globally reachable but that
# Python 3.11's `is_global` passes; and the few inside them that are.
_NOT_GLOBAL = tuple(
    ipaddress.ip_network(n)
    for n in ("192.0.0.0/24", "::/96", "64:ff9b:1::/48", "3fff::/20", "5f00::/16", "fec0::/10")
)
_GLOBAL_AFTER_ALL = tuple(ipaddress.ip_network(n) for n in ("192.0.0.9/32", "192.0.0.10/32"))
# IPv6 prefixes whose last 32 bits are an IPv4 address the packet is delivered to.
_CARRIES_IPV4_LAST = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "::ffff:0:0/96",  # IPv4-mapped
        "::ffff:0:0:0/96",  # SIIT, IPv4-translated
        "64:ff9b::/96",  # NAT64, the well-known prefix
        "::/96",  # IPv4-compatible (deprecated)
    )
)


def embedded_ipv4(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (where the packet really goes)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    found: list[ipaddress.IPv4Address] = []
    if any(address in prefix for prefix in _CARRIES_IPV4_LAST):
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    return found


def _globally_routable(address: Address) -> bool:
    if any(address in network for network in _GLOBAL_AFTER_ALL):
        return True
    if not address.is_global or address.is_multicast:
        return False
    return not any(address in network for network in _NOT_GLOBAL)


def is_public(address: Address) -> bool:
    """Whether an address is globally routable, and so is every IPv4 address it carries."""
    return all(_globally_routable(a) for a in [address, *embedded_ipv4(address)])


def _plain(address: Address) -> Address:
    """An IPv4 address written as IPv6 (::ffff:127.0.0.1) judged as the IPv4 one."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def resolve(host: str, port: int) -> list[Address]:
    """Every address `host` resolves to (an address literal is itself)."""
    try:
        return [_plain(ipaddress.ip_address(host.strip("[]")))]
    except ValueError:
        pass
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [_plain(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])) for info in found]


def _kind(address: Address) -> str:
    if address.is_loopback:
        return "a loopback address"
    if address.is_unspecified:
        return "the unspecified address"
    inner = [a for a in embedded_ipv4(address) if not _globally_routable(a)]
    if inner:
        return f"an IPv6 spelling of {inner[0]}, {_kind(inner[0])}"
    if address.is_link_local:
        return "a link-local address (where cloud metadata services listen)"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_multicast:
        return "a multicast address"
    return "a private address"


class AddressPolicy:
    """Whether the server may connect to an address on the hub's word."""

    def __init__(self, hub_host: str, hub_port: int, networks: Sequence[Network] = ()) -> None:
        self.hub_host = hub_host
        self._hub_port = hub_port
        self._networks = tuple(networks)
        self._hub_addresses: frozenset[Address] | None = None
        self._lock = threading.Lock()

    def hub_addresses(self) -> frozenset[Address]:
        """What the hub's host name resolves to, looked up once."""
        with self._lock:
            if self._hub_addresses is None:
                try:
                    self._hub_addresses = frozenset(resolve(self.hub_host, self._hub_port))
                except OSError:
                    return frozenset()  # looked up again next time
            return self._hub_addresses

    def permits(self, address: Address) -> bool:
        address = _plain(address)
        if is_public(address):
            return True
        if any(address in network for network in self._networks):
            return True
        return address in self.hub_addresses()

    def refusal(self, host: str, addresses: Iterable[Address]) -> AccessDenied | None:
        """Why `host` may not be reached on the hub's word, or None if it may."""
        if host == self.hub_host:
            return None
        refused = [a for a in addresses if not self.permits(a)]
        if not refused:
            return None
        return AccessDenied(
            f"the hub sent this server to {excerpt(host)}, which is {_kind(refused[0])} "
            f"({refused[0]}); a hub's redirects reach only public addresses and the hub's "
            "own. If your mirror serves files from there, name the network with "
            "--hf-redirect-networks"
        )

    def check(self, host: str, port: int) -> None:
        """Raise AccessDenied when `host` resolves to an address the hub may not send us to."""
        if host == self.hub_host:
            return
        try:
            addresses = resolve(host, port)
        except OSError:
            return  # the connection fails on its own, as the hub being down does
        refusal = self.refusal(host, addresses)
        if refusal is not None:
            raise refusal


class RefusedAddress(httpcore2.ConnectError):
    """A connection the policy did not allow (the name resolved elsewhere this time)."""


class GuardedBackend(SyncBackend):
    """httpcore's own socket backend, connecting only to addresses the policy permits."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore2.NetworkStream:
        if host == self._policy.hub_host:
            return super().connect_tcp(host, port, timeout, local_address, socket_options)
        try:
            addresses = resolve(host, port)
        except OSError as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        allowed = [a for a in addresses if self._policy.permits(a)]
        if not allowed:
            raise RefusedAddress(
                f"{host} resolves to {', '.join(map(str, addresses))}, which the hub may "
                "not send this server to"
            )
        failure: httpcore2.ConnectError | None = None
        for address in allowed:  # connect to the checked address itself, never the name
            try:
                return super().connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except httpcore2.ConnectError as exc:
                failure = exc
        assert failure is not None
        raise failure
