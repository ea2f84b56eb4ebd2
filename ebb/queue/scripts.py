"""The Lua scripts behind every multi-key state change, registered on a Redis client.

Each state change that must be atomic (enqueue, claim, withdraw, cancel, finish, reap,
drain) is one script; see the header of each .lua file for its contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

_NAMES = (
    "enqueue",
    "claim",
    "withdraw",
    "cancel",
    "finish",
    "reap",
    "try_drain",
    "heartbeat",
    "fold_ema",
    "try_sleep",
)


@cache
def _source(name: str) -> str:
    return resources.files("ebb.queue").joinpath("lua", f"{name}.lua").read_text()


@dataclass(frozen=True)
class Scripts:
    """Scripts bound to one client (sync `redis.Redis` or `redis.asyncio.Redis`)."""

    enqueue: Any
    claim: Any
    withdraw: Any
    cancel: Any
    finish: Any
    reap: Any
    try_drain: Any
    heartbeat: Any
    fold_ema: Any
    try_sleep: Any

    @classmethod
    def register(cls, client) -> Scripts:
        return cls(**{name: client.register_script(_source(name)) for name in _NAMES})


def load_script(client, name: str):
    """One script of lua/NAME.lua bound to `client`, for modules with scripts of their own."""
    return client.register_script(_source(name))
