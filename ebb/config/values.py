"""What the settings' validators share: byte quantities ("40GiB"), budgets, env names."""

from __future__ import annotations

import ipaddress
import re

from pydantic import ValidationInfo

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


# Byte settings an empty value unsets (their default); the others need a number.
_OPTIONAL_BYTES = frozenset(
    {"weights_cache_bytes", "sleep_host_ram_bytes", "redis_maxmemory_bytes"}
)


def parse_bytes(text: str, name: str) -> int:
    """ "50GB", "40GiB" or "1000" as a number of bytes; ValueError naming `name` otherwise."""
    match = _BYTES_RE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _BYTE_UNITS:
        raise ValueError(f"{name} must be a number of bytes like 50000000000, 50GB or 40GiB")
    return int(float(match.group(1)) * _BYTE_UNITS[unit])


def bytes_or_none(value: object, info: ValidationInfo) -> object:
    """A byte setting's text ("4GiB") as a number; empty unsets the optional ones."""
    if isinstance(value, str):
        if not value.strip() and info.field_name in _OPTIONAL_BYTES:
            return None
        return parse_bytes(value, env_name(info))
    return value


def budget_positive(value: int | None, info: ValidationInfo) -> int | None:
    if value is not None and value <= 0:
        raise ValueError(f"{env_name(info)} must be positive (unset it for no limit)")
    return value


def env_name(info: ValidationInfo) -> str:
    return f"EBB_{info.field_name.upper()}" if info.field_name else "EBB_?"
