"""Applies a plan's actions (`plan.Action`), in order, through `ControllerState`, the GPU
records and the launcher: the only place a decision becomes a write.

Claims stay where the platform makes them atomic: a stem is taken out of the pool
(`take_stem`) and a sleeper out of its set (`take_sleeper`) before either is handed work,
so a stem or sleeper another controller took, or one that left, is never handed work
twice. A start whose claim fails is not made up for here: the next reconcile plans again
from what it reads then. A runner's record is written before its process starts, and its
GPU placement before it can read it, so the next reconcile already counts it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

from ebb.coldstart.clock import Clock
from ebb.coldstart.launcher import Launcher, PoolLauncher
from ebb.coldstart.placement import Placement
from ebb.coldstart.plan import (
    Action,
    AssignStem,
    ClearBackoff,
    Drain,
    DropStem,
    Launch,
    MarkUnschedulable,
    WakeSleeper,
)
from ebb.coldstart.scaling_actions import DrainReady
from ebb.coldstart.state import ControllerState
from ebb.launching.stem_pools import DEFAULT_POOL
from ebb.launching.tiers import Tier
from ebb.queue.gpu_records import GpuPlacement
from ebb.queue.schema import DeploymentSpec, RunnerRecord, RunnerState

log = logging.getLogger(__name__)


class GpuRecords(Protocol):
    """The GPU side of the platform's state (`ebb.queue.gpus.GpuState`)."""

    async def put_placement(self, runner_id: str, placement: GpuPlacement) -> None: ...

    async def return_sleeper(self, runner_id: str, deployment: str) -> None: ...

    async def evict_sleeper(self, runner_id: str, deployment: str) -> bool: ...


@runtime_checkable
@runtime_checkable
class ReadyDrains(Protocol):
    """A state that can tell a ready runner to drain (stop claiming, finish, exit)."""

    async def drain_ready(self, runner_id: str, deployment: str) -> bool: ...


@runtime_checkable
class PlacingLauncher(Protocol):
    """A launcher whose scheduler can be asked for a node (Kubernetes, Ray)."""

    def launch_on(
        self, runner_id: str, deployment: str | None, tier: Tier, placement: Placement
    ) -> None: ...


def new_runner_id() -> str:
    return "r-" + uuid.uuid4().hex[:10]


class DecidedSpecs:
    """The specs of the deployments the last plan decided for, as its world read them:
    what a cluster launcher shapes a runner's pod or actor from (its GPUs, memory,
    accelerator), so that it reads nothing of the platform's state itself."""

    def __init__(self) -> None:
        self._specs: dict[str, DeploymentSpec] = {}

    def update(self, specs: Iterable[DeploymentSpec]) -> None:
        self._specs = {s.name: s for s in specs}

    def get(self, deployment: str) -> DeploymentSpec | None:
        return self._specs.get(deployment)


class Executor:
    def __init__(
        self,
        state: ControllerState,
        launcher: Launcher,
        clock: Clock,
        *,
        gpus: GpuRecords | None = None,
        leading: Callable[[], bool] = lambda: True,
        specs: DecidedSpecs | None = None,
    ):
        """`gpus`: where placements are recorded (None: no GPUs are placed here);
        `leading()`: whether this controller still may start runners; `specs`: kept
        current for the launcher (`DecidedSpecs`)."""
        self._state = state
        self._launcher = launcher
        self._clock = clock
        self._gpus = gpus
        self._leading = leading
        self._specs = specs

    async def apply(
        self, actions: Sequence[Action], specs: Iterable[DeploymentSpec] = ()
    ) -> list[Action]:
        """Apply `actions`, decided for `specs`, in order; the starts that were made
        (wakes, assignments and launches whose claim held), for the scale-up counts."""
        if self._specs is not None:
            self._specs.update(specs)
        made: list[Action] = []
        for action in actions:
            if await self._apply(action):
                made.append(action)
        return made

    async def _apply(self, action: Action) -> bool:
        if isinstance(action, WakeSleeper):
            return await self._wake(action)
        if isinstance(action, AssignStem):
            return await self._assign(action)
        if isinstance(action, Launch):
            return await self._launch(action)
        if isinstance(action, DropStem):
            await self._state.mark_runner_gone(
                action.runner_id,
                state=RunnerState.FAILED,
                error=action.reason,
                exited_ms=self._now_ms(),
            )
        elif isinstance(action, MarkUnschedulable):
            if action.reason:
                log.warning("coldstart: %s is unschedulable: %s", action.deployment, action.reason)
            await self._state.set_deployment_status(action.deployment, unschedulable=action.reason)
        elif isinstance(action, ClearBackoff):
            await self._state.set_deployment_status(action.deployment, error="", error_log="")
        elif isinstance(action, Drain):
            await self._drain(action)
        elif isinstance(action, DrainReady):
            await self._drain_ready(action)
        return False

    async def _drain_ready(self, action: DrainReady) -> None:
        if not isinstance(self._state, ReadyDrains):
            log.warning(
                "coldstart: %s (%s) not drained: this platform's runners take no drain "
                "request (%s)",
                action.runner_id,
                action.deployment,
                action.reason,
            )
            return
        if await self._state.drain_ready(action.runner_id, action.deployment):
            log.info(
                "coldstart: %s (%s) drains: %s", action.runner_id, action.deployment, action.reason
            )

    async def _wake(self, action: WakeSleeper) -> bool:
        """Take sleepers of the deployment until one of the candidates (or, without GPU
        records, any); the others go back to sleep."""
        taken: list[str] = []
        woken = None
        take = self._state.take_sleeper
        while (sleeper := await take(action.deployment, action.uid)) is not None:
            if self._gpus is None or sleeper in action.candidates:
                woken = sleeper
                break
            taken.append(sleeper)
        for other in taken:
            assert self._gpus is not None
            await self._gpus.return_sleeper(other, action.deployment)
        if woken is None:
            log.info("coldstart: no sleeper of %s left to wake", action.deployment)
            return False
        await self._state.wake_sleeper(woken, action.deployment, action.uid)
        log.info("coldstart: waking sleeping %s for %s", woken, action.deployment)
        return True

    async def _assign(self, action: AssignStem) -> bool:
        if await self._state.take_stem([action.stem]) is None:
            log.info("coldstart: stem %s left before %s took it", action.stem, action.deployment)
            return False
        await self._commit(action.stem, action.gpu)
        await self._state.assign(action.stem, action.deployment, action.uid)
        log.info("coldstart: assigned pre-warmed %s to %s", action.stem, action.deployment)
        return True

    async def _launch(self, action: Launch) -> bool:
        if not self._leading():
            # The lease ran out during this pass: the next leader decides, from Redis.
            return False
        runner_id = new_runner_id()
        pool = action.pool
        await self._state.put_runner(
            RunnerRecord(
                runner_id=runner_id,
                state=RunnerState.STARTING,
                deployment=action.deployment or "",
                deployment_uid=action.uid,
                tier=action.tier,
                launched_ms=self._now_ms(),
                pool=pool.name if pool else "",
            )
        )
        await self._commit(runner_id, action.gpu)
        launcher = self._launcher
        if pool is not None and pool.name != DEFAULT_POOL and isinstance(launcher, PoolLauncher):
            launcher.launch_stem(runner_id, pool)
        elif action.placement != Placement() and isinstance(launcher, PlacingLauncher):
            launcher.launch_on(runner_id, action.deployment, action.tier, action.placement)
        else:
            launcher.launch(runner_id, action.deployment, action.tier)
        return True

    async def _drain(self, action: Drain) -> None:
        if self._gpus is not None and await self._gpus.evict_sleeper(
            action.runner_id, action.deployment
        ):
            log.info(
                "coldstart: sleeping %s (%s) exits: %s",
                action.runner_id,
                action.deployment,
                action.reason,
            )

    async def _commit(self, runner_id: str, placement: GpuPlacement | None) -> None:
        """Record `placement` as `runner_id`'s, before the runner can look for it."""
        if placement is not None and self._gpus is not None:
            await self._gpus.put_placement(runner_id, placement)

    def _now_ms(self) -> int:
        return int(self._clock.time() * 1000)
