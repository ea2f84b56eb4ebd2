"""A deployment's spec on a blocking client, for code outside the event loop (a launcher
placing a runner)."""

from __future__ import annotations

import redis

from ebb.queue.schema import DeploymentSpec
from ebb.queue.version_store import read_unit_spec


def read_deployment(client: redis.Redis, name: str) -> DeploymentSpec | None:
    """The spec of a deployment, or of one version's serving unit (`NAME@vN`)."""
    return read_unit_spec(client, name)
