"""Refuse webhook URLs that would make ebb call into its own network (SSRF).

A URL is accepted when it is http(s) and every address its host resolves to is public
(not loopback, private, link-local, shared, reserved, multicast or unspecified; an
IPv4-mapped IPv6 address is judged by its IPv4 address), or inside one of the networks
an operator allowed (EBB_WEBHOOK_ALLOWED_CIDRS). The check runs at submission (a 400) and
again before every attempt, and the attempt connects to the address that was checked, so
a DNS answer that changes in between (rebinding) cannot redirect it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from ebb.config import IPNetwork

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_DEFAULT_PORTS = {"http": 80, "https": 443}


class UnsafeUrl(Exception):
    """The URL may not be called; the message says why and what to change."""


@dataclass(frozen=True)
class Target:
    """Where one attempt goes: the URL as given, and the checked address to connect to."""

    url: str
    scheme: str
    host: str
    port: int
    address: IPAddress

    @property
    def endpoint(self) -> str:
        """The receiving endpoint, the unit of the per-endpoint concurrency limit."""
        return f"{self.scheme}://{self.host}:{self.port}"

    def pinned_url(self) -> str:
        """The URL with its host replaced by the checked address (credentials kept)."""
        parts = urlsplit(self.url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        host = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return parts._replace(netloc=f"{userinfo}{at}{host}:{self.port}").geturl()

    @property
    def host_header(self) -> str:
        default = _DEFAULT_PORTS[self.scheme] == self.port
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if default else f"{host}:{self.port}"


def refusal(address: IPAddress, allowed: list[IPNetwork]) -> str | None:
    """Why `address` may not be called, or None when it may."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    if any(address in network for network in allowed):
        return None
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_private or (isinstance(address, ipaddress.IPv4Address) and address in _SHARED_V4):
        return "a private address"
    if address.is_multicast or address.is_reserved or address.is_unspecified:
        return "a reserved address"
    if not address.is_global:
        return "a non-public address"
    return None


_SHARED_V4 = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT


def parse_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL; raises UnsafeUrl when it is not one."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise UnsafeUrl(f"webhook.url is not a valid URL ({e}).") from e
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise UnsafeUrl(
            "webhook.url must be an absolute http:// or https:// URL, e.g. "
            "https://example.com/hooks/ebb."
        )
    return parts.scheme, parts.hostname, port or _DEFAULT_PORTS[parts.scheme]


async def resolve_target(url: str, allowed: list[IPNetwork]) -> Target:
    """Resolve and check `url`; raises UnsafeUrl when it may not be called."""
    scheme, host, port = parse_url(url)
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        addresses = await _resolve(host, port)
    for address in addresses:
        why = refusal(address, allowed)
        if why is not None:
            raise UnsafeUrl(
                f"webhook.url's host {host!r} resolves to {address}, {why}; webhooks go "
                "only to public addresses. Use a publicly reachable URL (an operator can "
                "allow networks with EBB_WEBHOOK_ALLOWED_CIDRS)."
            )
    return Target(url=url, scheme=scheme, host=host, port=port, address=addresses[0])


async def _resolve(host: str, port: int) -> list[IPAddress]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UnsafeUrl(
            f"webhook.url's host {host!r} does not resolve ({e.strerror}); check the URL."
        ) from e
    addresses: list[IPAddress] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise UnsafeUrl(f"webhook.url's host {host!r} has no address; check the URL.")
    return addresses
