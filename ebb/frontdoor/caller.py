"""Who is calling: the identity authentication resolves a bearer key to."""

from __future__ import annotations

from dataclasses import dataclass

ADMIN_TENANT = "admin"


@dataclass(frozen=True)
class Caller:
    tenant: str
    key_id: str
    is_admin: bool
