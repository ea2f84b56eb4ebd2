"""What the controller reads and writes of the platform's state: the narrow seam between
`Controller` and `ebb.queue.platform.PlatformState` (Redis).

`PlatformState` satisfies `ControllerState` as it is; a simulation or a test hands the
controller an in-memory one instead (`ebb.coldstart.simulation_state.InMemoryState`).
The contracts are PlatformState's: each method is one atomic step as seen by the other
processes (runners, frontdoors).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ebb.queue.platform import QueueSnapshot
from ebb.queue.schema import DeploymentSpec, RunnerRecord


class ControllerState(Protocol):
    # --- deployments and their demand ---------------------------------------------------

    async def list_deployments(self) -> list[DeploymentSpec]: ...

    async def get_deployment(self, name: str) -> DeploymentSpec | None: ...

    async def serving_units(self) -> list[DeploymentSpec]:
        """Each deployment version that may need runners, named as its serving unit."""
        ...

    async def serving_unit(self, unit: str) -> DeploymentSpec | None: ...

    async def set_deployment_status(self, name: str, **fields: object) -> None:
        """Merge `fields` into the deployment's status (its error state, shown to users)."""
        ...

    async def queue_snapshot(self, deployment: str) -> QueueSnapshot:
        """Queued requests and job attempts, and how long the oldest has waited."""
        ...

    async def count_scale_up(self, deployment: str, count: int) -> None: ...

    # --- runners and the pre-warmed pool ------------------------------------------------

    async def runners(self) -> list[RunnerRecord]:
        """Every runner record, oldest launch first."""
        ...

    async def put_runner(self, record: RunnerRecord) -> None: ...

    async def mark_runner_gone(self, runner_id: str, **fields: object) -> None:
        """Record a runner that died without saying so; it leaves the pool with it."""
        ...

    async def forget_runner(self, runner_id: str) -> None: ...

    async def runner_log(self, runner_id: str) -> list[str]:
        """The last lines the runner logged (shown with a failing deployment)."""
        ...

    async def take_stem(self, candidates: Sequence[str] | None = None) -> str | None:
        """One pre-warmed runner out of the pool, never the same one twice: any, or the
        first of `candidates` (runner ids, best first) still waiting."""
        ...

    async def node_caches(self) -> dict[str, frozenset[str]]:
        """{node: the sources its weight cache holds}, nodes whose prefetcher is alive."""
        ...

    async def take_sleeper(self, deployment: str, uid: str = "") -> str | None:
        """One of the deployment's sleeping runners to wake, never the same one twice;
        only one launched for the deployment of uid `uid` (not an earlier one's)."""
        ...

    async def wake_sleeper(self, runner_id: str, deployment: str, uid: str = "") -> None: ...

    async def assign(self, runner_id: str, deployment: str, uid: str = "") -> None:
        """Give a stem its deployment (the one of uid `uid`); the stem starts loading it."""
        ...

    async def set_fork_server_state(self, state: str) -> None: ...

    # --- the controller's wake-up and the lease reaper -----------------------------------

    async def wait_for_wake(self, timeout_s: float) -> set[str]:
        """Deployments that asked for attention, waiting up to `timeout_s` for the first."""
        ...

    async def reap_expired_leases(self, *, restart_grace_s: float = 0.0) -> list[str]:
        """Fail the requests whose runner stopped renewing their lease; their ids.

        Nothing is reaped while the store itself started less than `restart_grace_s`
        ago: runners could not renew leases while it was down."""
        ...
