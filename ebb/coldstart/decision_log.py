"""Every plan's actions, with the figures of the snapshot that led to them: the first place
an operator looks when asking why a request went where it went (`ebb logs DEPLOYMENT`).

One JSON line per deployment a plan acted on, appended to `decisions-UID.log` under the
logs directory (`logtail.decisions_log`: by the deployment's uid, so a tenant reads its
own deployment's decisions and never another's — each line holds only that deployment's
actions and queue figures, and the platform's own: waiting stems, free GPU memory per
device). The platform's own actions (stems launched or dropped) and every deployment's
line go to the controller's log as well, which only the admin reads.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from ebb.coldstart.plan import Action, deployment_of
from ebb.coldstart.world import Demand, World
from ebb.logtail import decisions_log

log = logging.getLogger(__name__)


class DecisionLog:
    def __init__(self, logs_dir: Path | None):
        """`logs_dir`: where the per-deployment files go (None: the controller's log only)."""
        self._dir = logs_dir

    def record(self, world: World, actions: Sequence[Action]) -> None:
        """Log `actions` (nothing when there are none) with what `world` said."""
        by_deployment: dict[str | None, list[Action]] = {}
        for action in actions:
            by_deployment.setdefault(deployment_of(action), []).append(action)
        demands = {d.name: d for d in world.demands}
        for deployment, acted in by_deployment.items():
            demand = demands.get(deployment) if deployment is not None else None
            line = decision_line(world, acted, demand)
            log.info("coldstart: decided %s", line)
            if demand is not None:
                self._append(demand.spec.uid, line)

    def _append(self, uid: str, line: str) -> None:
        path = decisions_log(self._dir, uid) if self._dir is not None else None
        if path is None:
            return
        try:
            with path.open("a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError:
            log.exception("coldstart: could not write %s", path)


def decision_line(world: World, actions: Sequence[Action], demand: Demand | None) -> str:
    """One JSON line (`ts` first, as `ebb logs --since` reads it)."""
    fields: dict[str, Any] = {
        "ts": _timestamp(),
        "deployment": demand.name if demand is not None else "",
        "actions": [{"action": type(a).__name__, **_fields(a)} for a in actions],
    }
    if demand is not None:
        fields["queue"] = {
            "requests": demand.queue_depth,
            "jobs": demand.job_depth,
            "oldest_wait_s": round(demand.oldest_wait_s, 3),
        }
        fields["runners"] = {
            "ready": demand.ready,
            "starting": demand.starting,
            "sleeping": len(demand.sleepers),
            "max_concurrency": demand.spec.max_concurrency,
        }
        if demand.backoff is not None:
            fields["failed_starts"] = demand.backoff.failures
    fields["stems_waiting"] = len(world.waiting_stems)
    fields["warm"] = world.warm.value
    if world.gpus is not None and world.gpus.present:
        fields["gpu_free_bytes"] = {
            f"{i.host}:{d.index}": d.free_bytes for i in world.gpus.inventories for d in i.devices
        }
    return json.dumps(fields, default=str)


def _fields(action: Action) -> dict[str, Any]:
    raw = msgspec.to_builtins(action)
    fields: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return {k: v for k, v in fields.items() if v not in (None, "", (), [], 0)}


def _timestamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
