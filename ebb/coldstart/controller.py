"""The coldstart controller: watches queues and runners, launches and reclaims runners.

Every tick (at most a second apart) it expires the leases of silent runners, so their
clients get an error event within about a lease period. Each reconcile, in order:
  1. collect exited runner processes; a runner that died before EXITED is FAILED;
  2. per deployment: snapshot demand (queued requests and jobs), ask the policy, launch the
     difference — a sleeping runner of the deployment first, then a pre-warmed stem, then a
     runner forked from the fork server (a fresh process while it is not up) — with
     backoff after failed starts;
  3. refill the pre-warmed pool (from the fork server, once it is up).
A queued request for a deployment with no runner wakes the controller at once (the
enqueue script pushes onto its wake list), so reaction is not bound to the poll interval.

Only the leader acts (`Leadership`, a lease in Redis: `ebb.coldstart.leader`); a standby
waits. Runners belong to the cluster, not to the controller that launched them: whether one
lives is its launcher's word or its heartbeat in Redis, so a new leader adopts the runners
of the old one and marks gone only those that fell silent.

Its seams are narrow so that a simulation can run it unchanged on simulated time: the
platform's state (`ControllerState`), the runners' processes (`Launcher`), warm capacity
(`WarmStarts`), time (`Clock`), leadership (`Leadership`) and the GPU meter of dead
runners (`GpuMeterCloser`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec

from ebb.billing.gpu import meter_for
from ebb.coldstart.clock import SYSTEM_CLOCK, Clock
from ebb.coldstart.fork_client import Exit
from ebb.coldstart.launcher import Launcher, NoWarmStarts, PoolLauncher, WarmStarts
from ebb.coldstart.leader import AlwaysLeader, Leadership
from ebb.coldstart.placement import rank_stems
from ebb.coldstart.policy import DemandSnapshot, PolicyConfig, desired_replicas
from ebb.coldstart.state import ControllerState
from ebb.config import Settings
from ebb.launching.stem_pools import DEFAULT_POOL, StemPool, parse_stem_pools, runner_gpus
from ebb.launching.tiers import Tier, WarmState, launch_tier
from ebb.queue.gpu_records import GpuPlacement
from ebb.queue.metering import LAST_SIGN_OF_LIFE, EndField, GpuMeter
from ebb.queue.schema import DeploymentSpec, RunnerRecord, RunnerState

if TYPE_CHECKING:
    from ebb.coldstart.gpu_placer import GpuPlacer

log = logging.getLogger(__name__)

# A runner that has not heartbeated for this many lease periods is dead even if its
# process handle says otherwise (another host, a hung process).
_SILENT_LEASES = 3
# Exited and failed runner records stay visible this long (ebb status, the console).
_FORGET_AFTER_S = 300.0
# Leases are reaped at least this often, whatever the reconcile interval: a client of a
# runner that died must hear about it within about a lease period.
_REAP_INTERVAL_S = 1.0
# Consecutive failed starts after which a deployment shows an error state.
MAX_START_FAILURES = 3


@dataclass
class _Backoff:
    failures: int = 0
    next_try_s: float = 0.0


class GpuMeterCloser(Protocol):
    """`ebb.queue.metering.GpuMeterScript` over an async client."""

    def close(
        self, runner_id: str, meter: GpuMeter, *, end: int | EndField
    ) -> Awaitable[object]: ...


def new_runner_id() -> str:
    return "r-" + uuid.uuid4().hex[:10]


class Controller:
    def __init__(
        self,
        settings: Settings,
        state: ControllerState,
        launcher: Launcher,
        policy: PolicyConfig = PolicyConfig(),
        *,
        warm: WarmStarts | None = None,
        clock: Clock = SYSTEM_CLOCK,
        gpu_meter: GpuMeterCloser | None = None,
        gpus: GpuPlacer | None = None,
        leader: Leadership | None = None,
    ):
        """`warm`: where forked starts come from (none: every launch is fresh);
        `gpu_meter`: closes dead runners' GPU metering when `settings.metering` is on;
        `gpus`: places runners on GPUs (none: every runner starts as on a CPU host);
        `leader`: whether this controller may act (none: it is the only one)."""
        self._settings = settings
        self._state = state
        self._launcher = launcher
        self._warm = warm or NoWarmStarts()
        self._policy = policy
        self._clock = clock
        self._gpu_meter = gpu_meter
        self._gpus = gpus
        self._backoff: dict[str, _Backoff] = {}
        self._stopping = asyncio.Event()
        self._fork_server_state = ""  # as last published
        self._leader = leader or AlwaysLeader()
        self._term = 0  # the leadership term whose runners were last adopted
        self._heartbeats_ms: dict[str, int] = {}  # runner id -> last heartbeat, as last read
        self._records: list[RunnerRecord] = []  # live runners, as this reconcile read them
        self._pools = {
            p.name: p for p in parse_stem_pools(settings.stem_pools, prewarm=settings.prewarm)
        }
        if set(self._pools) - {DEFAULT_POOL} and not isinstance(launcher, PoolLauncher):
            raise ValueError(
                "EBB_STEM_POOLS names node pools, which only a cluster launcher has: set "
                "EBB_LAUNCHER=kubernetes or ray, or use EBB_PREWARM on one host"
            )
        self._default_gpus = default_runner_gpus(settings)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        log.info(
            "coldstart: controller up (stems per pool: %s)",
            {p.name or "default": p.stems for p in self._pools.values()},
        )
        next_reconcile = 0.0
        tick_s = min(self._settings.controller_poll_s, _REAP_INTERVAL_S)
        while not self._stopping.is_set():
            try:
                if not self._leader.leading():
                    await self._stand_by(tick_s)
                    continue
                if self._leader.term != self._term:
                    await self._take_over()
                woken = await self._state.wait_for_wake(tick_s)
                await self._reap()
                if woken or self._clock.monotonic() >= next_reconcile:
                    await self.reconcile()
                    next_reconcile = self._clock.monotonic() + self._settings.controller_poll_s
            except Exception:
                # Redis restarting or a bug in one pass: log, breathe, and go on.
                log.exception("coldstart: reconcile failed")
                await asyncio.sleep(1.0)
        self._launcher.stop_all(grace_s=30.0)

    async def _stand_by(self, tick_s: float) -> None:
        """Not the leader: touch nothing (not even the wake list, the leader's to pop)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), tick_s)

    async def _take_over(self) -> None:
        """A new term: what an earlier leader knew (backoff, the published fork-server
        state) is re-read or restarted. Runners recorded by an earlier controller stay
        ours to watch while they heartbeat; those silent for long are gone (they died with
        it: a local runner exits when its launcher goes)."""
        self._term = self._leader.term
        self._backoff.clear()
        self._fork_server_state = ""
        for r in await self._state.runners():
            if r.state.is_live and self._silent(r):
                await self._state.mark_runner_gone(
                    r.runner_id,
                    state=RunnerState.EXITED,
                    error="lost with an earlier controller",
                    exited_ms=self._now_ms(),
                )
                await self._close_gpu_meter(r)

    def _silent(self, r: RunnerRecord) -> bool:
        """No process this launcher knows of and no sign of life in a few lease periods.
        A record without any timestamp (written by hand) is never silent."""
        last_ms = r.heartbeat_ms or r.launched_ms
        silent_ms = _SILENT_LEASES * self._settings.lease_ttl_s * 1000
        return (
            last_ms > 0
            and self._clock.time() * 1000 - last_ms > silent_ms
            and not self._launcher.alive(r.runner_id)
        )

    def _alive(self, runner_id: str) -> bool:
        """Its launcher says so, or it heartbeated recently (launched by another leader,
        or by a launcher that cannot see it)."""
        beat_ms = self._heartbeats_ms.get(runner_id, 0)
        fresh_ms = _SILENT_LEASES * self._settings.lease_ttl_s * 1000
        recent = beat_ms > 0 and self._clock.time() * 1000 - beat_ms <= fresh_ms
        return self._launcher.alive(runner_id) or recent

    def _now_ms(self) -> int:
        return int(self._clock.time() * 1000)

    async def _publish_fork_server_state(self) -> None:
        state = self._warm.warm_state().value
        if state != self._fork_server_state:
            await self._state.set_fork_server_state(state)
            self._fork_server_state = state

    async def _reap(self) -> None:
        # A lease TTL after a Redis restart, live runners have renewed theirs.
        reaped = await self._state.reap_expired_leases(restart_grace_s=self._settings.lease_ttl_s)
        if reaped:
            log.warning("coldstart: leases expired for %s", reaped)

    async def reconcile(self) -> None:
        records = await self._state.runners()
        self._heartbeats_ms = {r.runner_id: r.heartbeat_ms for r in records}
        runners = await self._collect_exits(records)
        self._records = runners
        await self._publish_fork_server_state()
        specs = await self._state.serving_units()
        if self._gpus is not None:
            await self._gpus.refresh()
            await self._gpus.recheck(specs)
            await self._gpus.enforce_sleep_budget()
        for spec in specs:
            # A runner of an earlier deployment of the same name is not this one's.
            await self._scale(spec, [r for r in runners if _serves(r, spec)])
        await self._refill_pool(runners)

    async def _collect_exits(self, runners: list[RunnerRecord]) -> list[RunnerRecord]:
        exits = {e.runner_id: e for e in self._launcher.poll()}
        now_ms = self._clock.time() * 1000
        live: list[RunnerRecord] = []
        for r in runners:
            silent = r.state.is_live and self._silent(r)
            if r.runner_id in exits or silent:
                r = await self._runner_gone(r, exits.get(r.runner_id))
            if r.state.is_live:
                live.append(r)
            elif now_ms - (r.exited_ms or r.launched_ms) > _FORGET_AFTER_S * 1000:
                await self._state.forget_runner(r.runner_id)
        return live

    async def _runner_gone(self, r: RunnerRecord, exit: Exit | None) -> RunnerRecord:
        await self._close_gpu_meter(r)
        if r.state.is_live:
            if exit is None:
                why = "stopped heartbeating"
            else:
                why = exit.detail or f"process exited with code {exit.code}"
            log.warning(
                "coldstart: runner %s (%s, %s) died: %s",
                r.runner_id,
                r.deployment,
                r.state.value,
                why,
            )
            r = msgspec.structs.replace(
                r, state=RunnerState.FAILED, error=r.error or why, exited_ms=self._now_ms()
            )
            await self._state.mark_runner_gone(
                r.runner_id, state=r.state, error=r.error, exited_ms=r.exited_ms
            )
        if r.state is RunnerState.FAILED and r.deployment and not r.ready_ms:
            await self._start_failed(r)
        return r

    async def _close_gpu_meter(self, r: RunnerRecord) -> None:
        """Bill a dead runner's GPU time up to its last heartbeat (or, without one, up to
        its last sign of life). A runner that exited cleanly closed its own metering at its
        exit, which makes this a no-op."""
        if not self._settings.metering or self._gpu_meter is None:
            return
        spec = await self._state.serving_unit(r.deployment) if r.deployment else None
        if spec is not None and spec.uid != r.deployment_uid:
            spec = None  # another deployment of that name now: never billed to its owner
        gpus = await self._gpus.gpu_count(r.runner_id) if self._gpus is not None else 1
        await self._gpu_meter.close(
            r.runner_id, meter_for(r.runner_id, spec, gpus=gpus), end=LAST_SIGN_OF_LIFE
        )

    async def _start_failed(self, r: RunnerRecord) -> None:
        backoff = self._backoff.setdefault(r.deployment, _Backoff())
        backoff.failures += 1
        backoff.next_try_s = self._clock.monotonic() + min(2.0**backoff.failures, 60.0)
        if backoff.failures >= MAX_START_FAILURES:
            # A runner that never ran (a pod that could not start) logged nothing itself;
            # its launcher's account of why is its error.
            last_lines = await self._state.runner_log(r.runner_id) or r.error.splitlines()
            await self._state.set_deployment_status(
                r.deployment,
                error=f"{backoff.failures} runner starts failed in a row; last: "
                f"{r.error or 'no error recorded'}",
                error_log="\n".join(last_lines[-10:]),
            )

    async def _scale(self, spec: DeploymentSpec, runners: list[RunnerRecord]) -> None:
        queue = await self._state.queue_snapshot(spec.name)
        starting = sum(r.is_starting for r in runners)
        ready = sum(r.state is RunnerState.READY for r in runners)
        snap = DemandSnapshot(
            # Queued async jobs are demand like synchronous requests: they wake a deployment
            # at zero and, waiting long enough, add replicas.
            queue_depth=queue.depth + queue.job_depth,
            oldest_wait_s=queue.oldest_wait_s,
            starting=starting,
            ready=ready,
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            target_concurrency=spec.max_concurrency,
        )
        backoff = self._backoff.get(spec.name)
        if backoff and ready:
            # A runner made it: the deployment is healthy again.
            del self._backoff[spec.name]
            await self._state.set_deployment_status(spec.name, error="", error_log="")
            backoff = None
        missing = desired_replicas(snap, self._policy) - snap.serving
        if missing <= 0 or (backoff and self._clock.monotonic() < backoff.next_try_s):
            return
        launched = 0
        while launched < missing and await self._launch_for(spec):
            launched += 1
        if not launched:
            return
        await self._state.count_scale_up(spec.name, launched)
        log.info(
            "coldstart: %s scaled up by %d (queue=%d, jobs=%d, ready=%d, starting=%d)",
            spec.name,
            launched,
            queue.depth,
            queue.job_depth,
            ready,
            starting,
        )

    async def _launch_for(self, spec: DeploymentSpec) -> bool:
        """Start one runner of `spec`; False when its GPUs have no room for one now."""
        # Tiers, fastest first: a sleeping runner of this deployment, a pre-warmed stem, a
        # process forked from the fork server, a fresh process. Sleepers exist only where
        # engines support sleep mode (GPUs).
        deployment = spec.name
        sleeper = await self._state.take_sleeper(deployment, spec.uid)
        if sleeper is not None:
            if self._gpus is None or await self._gpus.can_wake(sleeper):
                await self._state.wake_sleeper(sleeper, deployment, spec.uid)
                log.info("coldstart: waking sleeping %s for %s", sleeper, deployment)
                return True
            # Its device filled up while it slept: it stays asleep, another starts.
            await self._gpus.return_sleeper(sleeper, deployment)
        placement = None
        if self._gpus is not None:
            reservation = await self._gpus.reserve(spec)
            if not reservation.launch:
                return False
            placement = reservation.placement
        while (stem := await self._take_stem(spec)) is not None:
            if self._alive(stem):
                if self._gpus is not None:
                    await self._gpus.commit(stem, placement)
                await self._state.assign(stem, deployment, spec.uid)
                log.info("coldstart: assigned pre-warmed %s to %s", stem, deployment)
                return True
            # Died since the last reconcile: never hand work to a dead process.
            await self._state.mark_runner_gone(
                stem,
                state=RunnerState.FAILED,
                error="stem died while pre-warmed",
                exited_ms=self._now_ms(),
            )
        tier = launch_tier(self._warm.warm_state() is WarmState.READY)
        await self._launch(deployment, tier, placement, uid=spec.uid)
        return True

    async def _take_stem(self, spec: DeploymentSpec) -> str | None:
        """The best waiting stem for `spec` (`placement.rank_stems`: on a node holding its
        weights, from a pool with its GPUs), out of the pool."""
        waiting = [r for r in self._records if r.state is RunnerState.PREWARMED]
        if not waiting:
            return None
        cached = await self._state.node_caches() if any(r.node for r in waiting) else {}
        gpus = runner_gpus(spec, self._default_gpus)
        ranked = rank_stems(waiting, self._pools, spec.source, gpus, cached)
        stem = await self._state.take_stem(ranked)
        if stem is not None:
            self._records = [r for r in self._records if r.runner_id != stem]
        return stem

    async def _refill_pool(self, runners: list[RunnerRecord]) -> None:
        # A new stem's imports compete for the same cores as a model that is loading to
        # serve a waiting request: refill only once no runner is starting for real work.
        if any(r.deployment and r.is_starting for r in runners):
            return
        # Stems forked from the fork server are ready at once; one spawned while it imports
        # would import the engine a second time, on the same cores.
        if self._warm.warm_state() is WarmState.STARTING:
            return
        for pool in self._pools.values():
            stems = sum(
                r.deployment == ""
                and r.pool == pool.name
                and r.state in (RunnerState.STARTING, RunnerState.PREWARMED)
                for r in runners
            )
            for _ in range(pool.stems - stems):
                await self._launch(None, Tier.PREWARMED, pool=pool)

    async def _launch(
        self,
        deployment: str | None,
        tier: Tier,
        placement: GpuPlacement | None = None,
        *,
        pool: StemPool | None = None,
        uid: str = "",
    ) -> None:
        if not self._leader.leading():
            # The lease ran out during this pass: the next leader decides, from Redis.
            return
        runner_id = new_runner_id()
        # The record exists before the process does, so the next reconcile already counts
        # it: one queued request never launches two runners.
        await self._state.put_runner(
            RunnerRecord(
                runner_id=runner_id,
                state=RunnerState.STARTING,
                deployment=deployment or "",
                deployment_uid=uid,
                tier=tier,
                launched_ms=self._now_ms(),
                pool=pool.name if pool else "",
            )
        )
        if self._gpus is not None:
            await self._gpus.commit(runner_id, placement)
        if (
            pool is not None
            and pool.name != DEFAULT_POOL
            and isinstance(self._launcher, PoolLauncher)
        ):
            self._launcher.launch_stem(runner_id, pool)
        else:
            self._launcher.launch(runner_id, deployment, tier)


def _serves(runner: RunnerRecord, spec: DeploymentSpec) -> bool:
    """Launched for this unit of this deployment: not an earlier one's of the same name."""
    return runner.deployment == spec.name and runner.deployment_uid == spec.uid


def default_runner_gpus(settings: Settings) -> int:
    """The GPUs a runner asks its node for when its deployment's engine does not say
    (tensor parallel size): the cluster launcher's setting; none locally, where GPU
    placement picks devices itself."""
    if settings.launcher == "kubernetes":
        return settings.k8s_gpus_per_runner
    if settings.launcher == "ray":
        return math.ceil(settings.ray_gpus_per_runner)
    return 0
