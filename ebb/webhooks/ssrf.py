"""Refuse webhook URLs that would make ebb call into its own network (SSRF).

A URL is accepted when it is http(s) and every address its host resolves to is public
(not loopback, private, link-local, shared, reserved, multicast or unspecified; an IPv6
address that embeds an IPv4 one - mapped, compatible, 6to4 2002::/16, NAT64 64:ff9b::/96,
Teredo 2001::/32 - is judged by that IPv4 address as well), or inside one of the networks
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
    """Why `address` may not be called, or None when it may. An IPv6 address that carries
    an IPv4 one (mapped, compatible, 6to4, NAT64, Teredo) is judged by the IPv4 address
    too: a translator or relay would deliver to it."""
    if any(address in network for network in allowed):
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # the same host, spelled in IPv6
            return refusal(address.ipv4_mapped, allowed)
        if address in _NAT64_LOCAL:
            return "a local-use NAT64 address"
        for embedded in _embedded_ipv4(address):
            why = refusal(embedded, allowed)
            if why is not None:
                return f"{why} ({embedded}, embedded in an IPv6 address)"
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
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the IPv4 address is the low 32 bits
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215, local use
_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated IPv4-compatible addresses


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, by every form that carries one."""
    found = []
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)  # (server, client)
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _NAT64 or (address in _COMPATIBLE and int(address) > 1):
        found.append(low32)
    return found


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
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise UnsafeUrl(f"webhook.url's host {host!r} has no address; check the URL.")
    return addresses
