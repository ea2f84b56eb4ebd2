"""The controller's part of rollouts (leader only): moving traffic once a new version is
warm, and the scheduled steps of an automatic rollout, rolled back when the new version
does worse than the old one.

Each pass, per deployment with an active rollout:
  1. warming: once the new version's unit has a READY runner, its first step's share
     goes to it (before that it takes no traffic, so nobody waits on its cold start);
     a LoRA adapter's version at once (it has no runners: its base's serve it);
  2. scheduled (interval > 0): the usage records of the current step (the platform's own
     per-request outcomes and times to first token) are judged; the rollout rolls back
     at once when the new version is worse by more than the margins, and is promoted
     each interval while it is not.
Every pass, per deployment: job attempts still queued for a version at 0 % (the old one
once a rollout is done, the new one after a rollback) move to the version that serves
(`ebb.queue.job_moves`): jobs follow the traffic split, like synchronous requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ebb.queue.job_moves import JobMoves
from ebb.queue.platform import PlatformState
from ebb.queue.rollout import RolloutRefused, Verdict, health_of, judge, promote, rollback, warmed
from ebb.queue.schema import DeploymentSpec, RunnerState, UsageRecord
from ebb.queue.version_store import VersionStore
from ebb.queue.versions import TrafficSplit, unit_name

log = logging.getLogger(__name__)

PASS_INTERVAL_S = 0.5


@dataclass
class _StepRead:
    since_s: float
    after_id: bytes
    records: list[UsageRecord] = field(default_factory=list)


class RolloutDriver:
    def __init__(self, state: PlatformState, clock: Callable[[], float] = time.time):
        self._state = state
        self._store = VersionStore(state.redis)
        self._moves = JobMoves(state.redis)
        self._clock = clock
        self._read: dict[str, _StepRead] = {}  # deployment -> its current step's records

    async def run(
        self, stopping: asyncio.Event, leading: Callable[[], bool] = lambda: True
    ) -> None:
        log.info("coldstart: rollout driver up")
        while not stopping.is_set():
            try:
                if leading():
                    await self.advance()
            except Exception:
                log.exception("coldstart: advancing rollouts failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), PASS_INTERVAL_S)

    async def advance(self) -> None:
        scheduled: set[str] = set()
        for spec in await self._state.list_deployments():
            split = await self._store.split(spec.name)
            await self._follow_split(spec.name, split)
            rollout = split.rollout
            if rollout is None or not rollout.active:
                continue
            scheduled.add(spec.name)
            try:
                if rollout.state == "warming":
                    await self._when_warm(spec, rollout.to_version)
                elif rollout.interval_s > 0:
                    await self._on_schedule(spec.name, split)
            except RolloutRefused:
                continue  # changed under us by the API: the next pass sees the new state
        for name in set(self._read) - scheduled:
            del self._read[name]

    async def _follow_split(self, name: str, split: TrafficSplit) -> None:
        """Move the jobs queued for versions at 0 % to the primary version. Version 1 is
        looked at even once a rollout dropped it from the split: its unit is the bare
        name, where jobs of every version once waited."""
        idle = [v for v, w in split.weights.items() if w == 0]
        if 1 not in split.weights:
            idle.append(1)
        if not idle or split.weights.get(split.primary, 0) == 0:
            return
        units = [unit_name(name, v) for v in idle]
        target = unit_name(name, split.primary)
        for unit, waiting in zip(units, await self._moves.queued(units), strict=True):
            if waiting:
                moved = await self._moves.move_queued(unit, target)
                log.info("coldstart: moved %d queued jobs from %s to %s", moved, unit, target)

    async def _when_warm(self, spec: DeploymentSpec, version: int) -> None:
        """Traffic moves once the new version can answer: a ready runner of its own, or
        at once for a LoRA adapter, which has none (its base's runners load it on its
        first request, as they do any adapter's, and its base wakes for it)."""
        name = spec.name
        unit = unit_name(name, version)
        if not spec.base:
            runners = await self._state.runners()
            if not any(r.deployment == unit and r.state is RunnerState.READY for r in runners):
                return
        now = self._clock()
        moved = await self._store.update_split(name, lambda s: warmed(s, now))
        log.info("coldstart: %s v%d is warm; traffic now %s", name, version, moved.weights)
        await self._state.wake(unit)

    async def _step_records(self, name: str, step_started_at_s: float) -> list[UsageRecord]:
        """The deployment's usage records since its step began, read incrementally: each
        pass reads only what finished since the last one."""
        read = self._read.get(name)
        if read is None or read.since_s != step_started_at_s:
            start_ms = int(step_started_at_s * 1000)
            read = self._read[name] = _StepRead(step_started_at_s, f"{start_ms - 1}-0".encode())
        while True:
            read.after_id, batch = await self._state.usage_after(read.after_id)
            read.records += [r for r in batch if r.deployment == name]
            if len(batch) < 10_000:
                return read.records

    async def _on_schedule(self, name: str, split: TrafficSplit) -> None:
        rollout = split.rollout
        assert rollout is not None
        records = await self._step_records(name, rollout.step_started_at_s)
        health = health_of(records, name)
        now = self._clock()
        verdict, why = judge(
            rollout, health.get(rollout.from_version), health.get(rollout.to_version), now
        )
        if verdict is Verdict.ROLL_BACK:
            await self._store.update_split(name, lambda s: rollback(s, why, now))
            log.warning("coldstart: %s rolled back to v%d: %s", name, rollout.from_version, why)
        elif verdict is Verdict.PROMOTE:
            moved = await self._store.update_split(name, lambda s: promote(s, now))
            log.info("coldstart: %s promoted; traffic now %s", name, moved.weights)
