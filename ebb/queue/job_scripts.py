"""The Lua scripts behind jobs and webhook deliveries, registered on a Redis client.

Each is one atomic state change; the header of each .lua file states its contract.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ebb.queue.scripts import _source


@dataclass(frozen=True)
class JobScripts:
    """Scripts bound to one client (sync `redis.Redis` or `redis.asyncio.Redis`)."""

    job_submit: Any
    job_cancel: Any
    job_update: Any
    job_requeue: Any
    job_expire: Any
    job_announce: Any
    delivery_claim: Any
    delivery_record: Any
    delivery_renew: Any
    secret_rotate: Any

    @classmethod
    def register(cls, client) -> JobScripts:
        return cls(**{f.name: client.register_script(_source(f.name)) for f in fields(cls)})
