"""Deployments' specs on a blocking client, for code outside the event loop (a launcher
placing a runner)."""

from __future__ import annotations

import msgspec
import redis

from ebb.queue import keys
from ebb.queue.replies import reply_bytes
from ebb.queue.schema import DeploymentSpec
from ebb.queue.version_store import read_unit_spec, read_units


def read_deployment(client: redis.Redis, name: str) -> DeploymentSpec | None:
    """The spec of a deployment, or of one version's serving unit (`NAME@vN`)."""
    return read_unit_spec(client, name)


def read_deployments(client: redis.Redis) -> list[DeploymentSpec]:
    """Every deployment, by name."""
    raw = client.hgetall(keys.DEPLOYMENTS)
    specs = [msgspec.json.decode(reply_bytes(v), type=DeploymentSpec) for v in raw.values()]
    return sorted(specs, key=lambda s: s.name)


def read_serving_units(client: redis.Redis) -> list[DeploymentSpec]:
    """Every deployment version that has traffic or may hold work, as its serving unit
    (LoRA adapters are none: their base's runners serve them, as `serving_units` says)."""
    return read_units(client, [s for s in read_deployments(client) if not s.base])
