"""The platform's state in memory: what `PlatformState` (Redis) is to the controller, for
simulations and controller tests, with the runner-side and frontdoor-side steps a
simulated world takes against it.

Each method is one atomic step, as its Redis counterpart is (nothing here awaits, so
no other task runs in between). Where the platform decides in Redis (taking a stem or a
sleeper, try_drain.lua and try_sleep.lua's guard, enqueue.lua's wake, leaving the pool),
the rule is mirrored here and named, and tests/integration/test_simulation_parity.py
holds each mirror to its original: it takes every step here and on a real redis-server
from the same scenarios and fails when the outcomes differ. A change to either side
needs a case there.

Why mirrors and not the real scripts on a real Redis: the platform's steps stamp the
wall clock (`assign`, `wake_sleeper`) or the server's (enqueue.lua, `queue_snapshot`),
which a simulated clock cannot drive; SPOP takes at random, where a replay must be
deterministic; and a trace replayed step by step through a server would cost a round trip
per step to every bench and controller test that runs on this state.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from ebb.coldstart.clock import ManualClock
from ebb.coldstart.scaling_tracker import Latency, RunnerLoad
from ebb.coldstart.simulation_trace import TraceRequest
from ebb.queue.platform import QueueSnapshot
from ebb.queue.schema import DeploymentSpec, RunnerRecord, RunnerState


@dataclass(frozen=True)
class Queued:
    request: TraceRequest
    enqueued_s: float


class InMemoryState:
    """A `ControllerState` over dicts, on a `ManualClock`."""

    def __init__(self, clock: ManualClock):
        self.clock = clock
        self.deployments: dict[str, DeploymentSpec] = {}
        self.status: dict[str, dict[str, str]] = {}
        self.records: dict[str, RunnerRecord] = {}
        self.queues: dict[str, deque[Queued]] = {}
        self.job_depth: Counter[str] = Counter()
        self.logs: dict[str, list[str]] = {}
        self.scale_ups: Counter[str] = Counter()
        self.fork_server: str = "off"
        # Ordered sets (dicts): taking from them is deterministic, unlike SPOP.
        self._stems: dict[str, None] = {}
        self._sleepers: dict[str, dict[str, None]] = {}
        self._wakes: dict[str, None] = {}
        self.cached: dict[str, frozenset[str]] = {}  # node -> sources, as prefetchers say
        # What the scaling policies measure (`ScalingSource`): requests each runner holds,
        # requests served (first token), the cold starts the runner model takes.
        self.held: dict[str, int] = {}
        self.served: list[Latency] = []
        self.cold_starts_ms: dict[str, dict[str, float]] = {}
        # When the controller last directed a ready runner to drain (a policy's scale-in).
        self.last_drain_ready_s: float = -math.inf

    # --- ControllerState: deployments ----------------------------------------------------

    async def list_deployments(self) -> list[DeploymentSpec]:
        return sorted(self.deployments.values(), key=lambda s: s.name)

    async def get_deployment(self, name: str) -> DeploymentSpec | None:
        return self.deployments.get(name)

    async def serving_units(self) -> list[DeploymentSpec]:
        return await self.list_deployments()  # one version each

    async def serving_unit(self, unit: str) -> DeploymentSpec | None:
        return self.deployments.get(unit)

    async def set_deployment_status(self, name: str, **fields: object) -> None:
        self.status.setdefault(name, {}).update({k: str(v) for k, v in fields.items()})

    async def queue_snapshot(self, deployment: str) -> QueueSnapshot:
        queue = self.queues.get(deployment)
        oldest_wait_s = self.clock.now_s - queue[0].enqueued_s if queue else 0.0
        return QueueSnapshot(
            depth=len(queue) if queue else 0,
            oldest_wait_s=oldest_wait_s,
            job_depth=self.job_depth[deployment],
        )

    async def count_scale_up(self, deployment: str, count: int) -> None:
        self.scale_ups[deployment] += count

    # --- ControllerState: runners and the pool ---------------------------------------------

    async def runners(self) -> list[RunnerRecord]:
        return sorted(self.records.values(), key=lambda r: r.launched_ms)

    async def put_runner(self, record: RunnerRecord) -> None:
        self.records[record.runner_id] = record

    async def mark_runner_gone(self, runner_id: str, **fields: object) -> None:
        self.update_runner(runner_id, **fields)
        self._stems.pop(runner_id, None)

    async def forget_runner(self, runner_id: str) -> None:
        self.records.pop(runner_id, None)
        self._stems.pop(runner_id, None)
        self.logs.pop(runner_id, None)

    async def runner_log(self, runner_id: str) -> list[str]:
        return list(self.logs.get(runner_id, []))

    async def take_stem(self, candidates: Sequence[str] | None = None) -> str | None:
        # As PlatformState.take_stem: stems that left PREWARMED are dropped on the way.
        order = list(self._stems) if candidates is None else list(candidates)
        for runner_id in order:
            if runner_id not in self._stems:
                continue
            del self._stems[runner_id]
            record = self.records.get(runner_id)
            if record is not None and record.state is RunnerState.PREWARMED:
                return runner_id
        return None

    async def node_caches(self) -> dict[str, frozenset[str]]:
        return dict(self.cached)

    async def take_sleeper(self, deployment: str, uid: str = "") -> str | None:
        sleepers = self._sleepers.get(deployment, {})
        while sleepers:
            runner_id = next(iter(sleepers))
            del sleepers[runner_id]
            record = self.records.get(runner_id)
            if record is None or record.state is not RunnerState.SLEEPING:
                continue
            if record.deployment_uid == uid:
                return runner_id
        return None

    async def wake_sleeper(self, runner_id: str, deployment: str, uid: str = "") -> None:
        self.update_runner(runner_id, woken_ms=self.clock.ms())
        await self.assign(runner_id, deployment, uid)

    async def assign(self, runner_id: str, deployment: str, uid: str = "") -> None:
        self.update_runner(
            runner_id, deployment=deployment, deployment_uid=uid, assigned_ms=self.clock.ms()
        )

    async def set_fork_server_state(self, state: str) -> None:
        self.fork_server = state

    # --- ControllerState: wake-ups and leases ----------------------------------------------

    async def wait_for_wake(self, timeout_s: float) -> set[str]:
        """Never waits: simulated time moves only when its driver moves it."""
        return self.take_wakes()

    async def reap_expired_leases(self, *, restart_grace_s: float = 0.0) -> list[str]:
        return []  # simulated runners never die holding a lease

    # --- the frontdoor's side ---------------------------------------------------------------

    def enqueue(self, deployment: str, request: TraceRequest, *, at_s: float | None = None) -> None:
        """Admit a request (arrived at `at_s`, default now); every admission wakes the
        controller (enqueue.lua wakes it less often: only when the queue was empty and no
        runner with room claims from it; the poll, every `controller_poll_s`, sees the
        rest)."""
        enqueued_s = self.clock.now_s if at_s is None else at_s
        self.queues.setdefault(deployment, deque()).append(Queued(request, enqueued_s))
        self._wakes[deployment] = None

    # --- ScalingSource and ReadyDrains -------------------------------------------------------

    async def runner_load(self, runner_ids: list[str]) -> dict[str, RunnerLoad]:
        return {r: RunnerLoad(self.held.get(r, 0)) for r in runner_ids}

    async def latencies_after(self, cursor: bytes) -> tuple[bytes, list[Latency]]:
        start = int(cursor or b"0")
        return str(len(self.served)).encode(), self.served[start:]

    async def cold_start_ms(self, deployment: str) -> dict[str, dict[str, float]]:
        return self.cold_starts_ms

    async def drain_ready(self, runner_id: str, deployment: str) -> bool:
        """As a drain request: the runner claims no more and exits once it holds nothing."""
        record = self.records.get(runner_id)
        if record is None or record.state is not RunnerState.READY:
            return False
        self.update_runner(runner_id, state=RunnerState.DRAINING)
        self.last_drain_ready_s = self.clock.now_s
        return True

    def take_wakes(self) -> set[str]:
        wakes, self._wakes = set(self._wakes), {}
        return wakes

    # --- the runners' side -------------------------------------------------------------------

    def update_runner(self, runner_id: str, **fields: object) -> None:
        record = self.records.get(runner_id)
        if record is not None:
            self.records[runner_id] = msgspec.structs.replace(record, **fields)

    def join_pool(self, runner_id: str) -> None:
        """A stem done importing: PREWARMED and takeable."""
        self.update_runner(runner_id, state=RunnerState.PREWARMED)
        self._stems[runner_id] = None

    def pool(self) -> frozenset[str]:
        """The runners in the pre-warmed pool, as `keys.STEMS` would hold them."""
        return frozenset(self._stems)

    def sleepers(self, deployment: str) -> frozenset[str]:
        """The deployment's sleepers not yet taken, as `keys.sleepers` would hold them."""
        return frozenset(self._sleepers.get(deployment, {}))

    def serving_runner_count(self, deployment: str) -> int:
        """As `RunnerQueue.serving_runner_count`: runners that serve or are about to."""
        return sum(r.deployment == deployment and r.state.will_serve for r in self.records.values())

    def _nothing_queued(self, deployment: str) -> bool:
        return not self.queues.get(deployment) and not self.job_depth[deployment]

    def try_drain(self, deployment: str, runner_id: str) -> bool:
        """Mirrors try_drain.lua: drain only if nothing waits in the deployment's queues
        (else a request that arrived at that instant would wait for a new cold start)."""
        if not self._nothing_queued(deployment):
            return False
        self.update_runner(runner_id, state=RunnerState.DRAINING)
        return True

    def try_sleep(self, deployment: str, runner_id: str) -> bool:
        """Mirrors try_sleep.lua: the same guard as `try_drain`, then wakeable."""
        if not self._nothing_queued(deployment):
            return False
        self.update_runner(runner_id, state=RunnerState.SLEEPING)
        self._sleepers.setdefault(deployment, {})[runner_id] = None
        return True
