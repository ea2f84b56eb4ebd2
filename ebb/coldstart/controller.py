"""The coldstart controller: watches queues and runners, launches and reclaims runners.

Every tick (at most a second apart) it expires the leases of silent runners, so their
clients get an error event within about a lease period. Each reconcile, in order:
  1. collect exited runner processes; a runner that died before EXITED is FAILED, and a
     deployment whose runners fail to start backs off (`ebb.backoff`);
  2. read the world (`world_reader`: demand, runners, stems, sleepers, GPUs, nodes);
  3. plan (`plan.plan`, pure: which runners to wake, assign, launch, and where);
  4. log the plan with the figures it came from (`decision_log`), then apply it
     (`executor`).
A queued request for a deployment with no runner wakes the controller at once (the
enqueue script pushes onto its wake list), so reaction is not bound to the poll interval.

Only the leader acts (`Leadership`, a lease in Redis: `ebb.coldstart.leader`); a standby
waits. Runners belong to the cluster, not to the controller that launched them: whether one
lives is its launcher's word or its heartbeat in Redis, so a new leader adopts the runners
of the old one and marks gone only those that fell silent.

Its seams are narrow so that a simulation can run it unchanged on simulated time: the
platform's state (`ControllerState`), the runners' processes (`Launcher`), warm capacity
(`WarmStarts`), time (`Clock`), leadership (`Leadership`), the GPUs (`GpuReader`) and
the GPU meter of dead runners (`GpuMeterCloser`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter
from collections.abc import Awaitable
from typing import Protocol

import msgspec

from ebb.backoff import delay_s
from ebb.billing.gpu import meter_for
from ebb.coldstart.budget_reaper import BudgetReaper
from ebb.coldstart.clock import SYSTEM_CLOCK, Clock
from ebb.coldstart.decision_log import DecisionLog
from ebb.coldstart.executor import DecidedSpecs, Executor
from ebb.coldstart.fork_client import Exit
from ebb.coldstart.gpu_reader import GpuReader
from ebb.coldstart.launcher import Launcher, NoWarmStarts, PoolLauncher, WarmStarts
from ebb.coldstart.leader import AlwaysLeader, Leadership
from ebb.coldstart.plan import STARTS, Action, ClearBackoff, MarkUnschedulable, plan
from ebb.coldstart.policy import PolicyConfig
from ebb.coldstart.scaling_tracker import ScalingSource, ScalingTracker
from ebb.coldstart.state import ControllerState
from ebb.coldstart.world import Backoff
from ebb.coldstart.world_reader import NodeLauncher, WorldReader
from ebb.config import Settings
from ebb.launching.stem_pools import DEFAULT_POOL, parse_stem_pools
from ebb.queue.metering import LAST_SIGN_OF_LIFE, EndField, GpuMeter
from ebb.queue.schema import RunnerRecord, RunnerState

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
# The wait before the next start after failed ones: doubling from 2 s up to a minute.
_FIRST_RETRY_S = 2.0
_MAX_RETRY_S = 60.0


class GpuMeterCloser(Protocol):
    """`ebb.queue.metering.GpuMeterScript` over an async client."""

    def close(
        self, runner_id: str, meter: GpuMeter, *, end: int | EndField
    ) -> Awaitable[object]: ...


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
        gpus: GpuReader | None = None,
        leader: Leadership | None = None,
        specs: DecidedSpecs | None = None,
        decisions: DecisionLog | None = None,
        nodes: NodeLauncher | None = None,
        scaling: ScalingSource | None = None,
        budget_reaper: BudgetReaper | None = None,
    ):
        """`warm`: where forked starts come from (none: every launch is fresh);
        `gpu_meter`: closes dead runners' GPU metering when `settings.metering` is on;
        `gpus`: this platform's GPUs, for placing runners on (none: every runner starts
        as on a CPU host);
        `leader`: whether this controller may act (none: it is the only one);
        `specs`: where the launcher reads the specs of the runners it is told to start;
        `decisions`: where each plan is logged (none: the controller's own log only);
        `nodes`: the cluster's nodes, for the plan to prefer one (`launchers.node_source`;
        none: the launcher's scheduler places every runner);
        `scaling`: what the deployments' scaling policies measure (none: only the
        queue-only rule and the schedule act);
        `budget_reaper`: settles the spend-cap reservations of dead frontdoors in the
        reap pass (none: they are left to their period)."""
        self._settings = settings
        self._state = state
        self._budget_reaper = budget_reaper
        self._launcher = launcher
        self._warm = warm or NoWarmStarts()
        self._policy = policy
        self._clock = clock
        self._gpu_meter = gpu_meter
        self._gpus = gpus
        self._backoff: dict[str, Backoff] = {}
        # Deployments shown unschedulable, and why; None until the first reconcile.
        self._unschedulable: dict[str, str] | None = None
        self._stopping = asyncio.Event()
        self._fork_server_state = ""  # as last published
        self._leader = leader or AlwaysLeader()
        self._term = 0  # the leadership term whose runners were last adopted
        self._heartbeats_ms: dict[str, int] = {}  # runner id -> last heartbeat, as last read
        self._pools = {
            p.name: p for p in parse_stem_pools(settings.stem_pools, prewarm=settings.prewarm)
        }
        if set(self._pools) - {DEFAULT_POOL} and not isinstance(launcher, PoolLauncher):
            raise ValueError(
                "EBB_STEM_POOLS names node pools, which only a cluster launcher has: set "
                "EBB_LAUNCHER=kubernetes or ray, or use EBB_PREWARM on one host"
            )
        self._scaling = ScalingTracker(scaling)
        self._reader = WorldReader(
            settings,
            state,
            self._warm,
            pools=self._pools,
            default_gpus=default_runner_gpus(settings),
            gpus=gpus,
            nodes=nodes,
            scaling=self._scaling,
        )
        self._executor = Executor(
            state,
            launcher,
            clock,
            gpus=gpus.records if gpus is not None else None,
            leading=self._leader.leading,
            specs=specs,
        )
        self._decisions = decisions or DecisionLog(None)

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
        if self._budget_reaper is not None:
            await self._budget_reaper.maybe_reap()

    async def reconcile(self) -> None:
        """Collect exits, read the world, plan, log the plan, apply it."""
        records = await self._state.runners()
        self._heartbeats_ms = {r.runner_id: r.heartbeat_ms for r in records}
        runners = await self._collect_exits(records)
        await self._publish_fork_server_state()
        world = await self._reader.read(
            runners,
            now_s=self._clock.monotonic(),
            alive=self._alive,
            backoffs=self._backoff,
            shown_unschedulable=self._unschedulable,
            wall_s=self._clock.time(),
        )
        actions = plan(world, self._policy)
        actions = self._scaling.after_plan(actions, world.wall_s)
        if world.gpus is not None:
            self._unschedulable = _shown_after(self._unschedulable, actions)
        if not actions:
            return
        self._decisions.record(world, actions)
        for action in actions:
            if isinstance(action, ClearBackoff):
                self._backoff.pop(action.deployment, None)
        made = await self._executor.apply(actions, [d.spec for d in world.demands])
        for deployment, count in Counter(
            a.deployment for a in made if isinstance(a, STARTS) and a.deployment
        ).items():
            await self._state.count_scale_up(deployment, count)
            log.info("coldstart: %s scaled up by %d", deployment, count)

    async def _collect_exits(self, runners: list[RunnerRecord]) -> list[RunnerRecord]:
        """Every record, a runner that exited or fell silent marked gone (and a record
        gone long enough forgotten)."""
        exits = {e.runner_id: e for e in self._launcher.poll()}
        now_ms = self._clock.time() * 1000
        kept: list[RunnerRecord] = []
        for r in runners:
            silent = r.state.is_live and self._silent(r)
            if r.runner_id in exits or silent:
                r = await self._runner_gone(r, exits.get(r.runner_id))
            if not r.state.is_live and now_ms - (r.exited_ms or r.launched_ms) > (
                _FORGET_AFTER_S * 1000
            ):
                await self._state.forget_runner(r.runner_id)
                continue
            kept.append(r)
        return kept

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
        its last sign of life), on as many GPUs as its recorded placement holds. A runner
        that exited cleanly closed its own metering at its exit, which makes this a no-op."""
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
        failures = self._backoff.get(r.deployment, Backoff()).failures + 1
        wait_s = delay_s(failures, first_s=_FIRST_RETRY_S, cap_s=_MAX_RETRY_S)
        self._backoff[r.deployment] = Backoff(failures, self._clock.monotonic() + wait_s)
        if failures >= MAX_START_FAILURES:
            # A runner that never ran (a pod that could not start) logged nothing itself;
            # its launcher's account of why is its error.
            last_lines = await self._state.runner_log(r.runner_id) or r.error.splitlines()
            await self._state.set_deployment_status(
                r.deployment,
                error=f"{failures} runner starts failed in a row; last: "
                f"{r.error or 'no error recorded'}",
                error_log="\n".join(last_lines[-10:]),
            )


def _shown_after(shown: dict[str, str] | None, actions: list[Action]) -> dict[str, str]:
    """What `unschedulable` shows once `actions` are applied."""
    after = dict(shown or {})
    for action in actions:
        if isinstance(action, MarkUnschedulable):
            if action.reason:
                after[action.deployment] = action.reason
            else:
                after.pop(action.deployment, None)
    return after


def default_runner_gpus(settings: Settings) -> int:
    """The GPUs a runner asks its node for when its deployment's engine does not say
    (tensor parallel size): the cluster launcher's setting; none locally, where GPU
    placement picks devices itself."""
    if settings.launcher == "kubernetes":
        return settings.k8s_gpus_per_runner
    if settings.launcher == "ray":
        return math.ceil(settings.ray_gpus_per_runner)
    return 0
