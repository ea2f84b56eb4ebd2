"""Deployments' specs on a blocking client, for code outside the event loop (a launcher
placing a runner)."""

from __future__ import annotations

import msgspec
import redis

from ebb.queue import keys
from ebb.queue.replies import reply_bytes
from ebb.queue.schema import DeploymentSpec


def read_deployment(client: redis.Redis, name: str) -> DeploymentSpec | None:
    raw = client.hget(keys.DEPLOYMENTS, name)
    return None if raw is None else msgspec.json.decode(reply_bytes(raw), type=DeploymentSpec)


def read_deployments(client: redis.Redis) -> list[DeploymentSpec]:
    """Every deployment, by name."""
    raw = client.hgetall(keys.DEPLOYMENTS)
    specs = [msgspec.json.decode(reply_bytes(v), type=DeploymentSpec) for v in raw.values()]
    return sorted(specs, key=lambda s: s.name)
