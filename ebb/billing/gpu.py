"""GPU-second metering of runners, from launch to exit, loading and draining included.

A runner is billed for every GPU it holds (`ebb.gpus.count.held_gpus`: the devices of its
placement; a tensor-parallel runner holds several), or for one when it holds none
(`billed_gpus`). The runner and the controller hand the same count to `meter_for`.

The runner meters itself: when it starts (storing who its time is billed to), when a
pre-warmed runner is assigned a deployment (its pool time ends there), every
`interval_s` while it lives (so usage shows up while it runs, and a price change applies
from then on), and once at exit. Live segments end at the runner's last heartbeat, so a
runner that is SIGKILLed is closed by the controller from that same heartbeat: nothing
is lost but the time since it, which is under a heartbeat interval (a runner killed before
its first heartbeat is closed where it was last seen: ready, or launched).

Each segment the runner writes carries its account of that time by use (`gpu_split.py`:
serving, loading, idle, asleep, wasted), which the runner keeps from its lifecycle and
heartbeat (`observe`). A runner launched for demand holds its time back until it first
serves (the periodic writes wait; see `gpu_split.py`), so that one which never serves
books its whole life as wasted at exit; capacity kept on purpose (the pre-warmed pool,
`min_replicas`) writes its time as it goes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from ebb.billing.gpu_split import PhaseClock, use_of
from ebb.config import Settings
from ebb.gpus.count import billed_gpus
from ebb.queue.metering import POOL_DEPLOYMENT, GpuMeter, GpuMeterScript
from ebb.queue.schema import DeploymentSpec, RunnerState
from ebb.queue.versions import public_name

log = logging.getLogger(__name__)

# The tenant billed for the pre-warmed pool: the platform operator's own.
PLATFORM_TENANT = "admin"


def meter_for(runner_id: str, spec: DeploymentSpec | None, gpus: int) -> GpuMeter:
    """Who a runner's time is billed to (its deployment's owner, or the pool's), for how
    many GPUs: `gpus` is what it holds (`held_gpus`), at least one is billed."""
    gpus = billed_gpus(gpus)
    if spec is None:
        return GpuMeter(
            runner_id=runner_id, deployment=POOL_DEPLOYMENT, tenant=PLATFORM_TENANT, gpu_count=gpus
        )
    return GpuMeter(
        runner_id=runner_id,
        # A version's runner is billed under the deployment's public name.
        deployment=public_name(spec.name),
        tenant=spec.owner,
        gpu_count=gpus,
        price_per_gpu_second_micros=spec.price_per_gpu_second_micros,
    )


class RunnerMeter(threading.Thread):
    """Meters one runner process's GPU time (see the module docstring).

    `read_spec(name)` re-reads a deployment, so a price or owner change applies to the
    next segment; it returns None for a deleted deployment (the last attribution stays),
    and a deployment created again under the name (another uid) is not this runner's:
    the last attribution stays too.
    """

    def __init__(
        self,
        client: redis.Redis,
        runner_id: str,
        *,
        interval_s: float,
        read_spec: Callable[[str], DeploymentSpec | None],
        gpus: int,
    ):
        super().__init__(name="gpu-meter", daemon=True)
        self._script = GpuMeterScript(client)
        self._runner_id = runner_id
        self._interval_s = interval_s
        self._read_spec = read_spec
        self._gpus = gpus
        self._meter = meter_for(runner_id, None, self._gpus)
        self._unit = ""  # the serving unit (deployment version) whose spec it re-reads
        self._uid = ""  # ... of this deployment only (DeploymentSpec.uid)
        self._done = threading.Event()
        self.clock = PhaseClock()
        # How long time may stay undecided (never served) before it is written as it was:
        # past its idle timeout, only min_replicas keeps a runner that serves nothing.
        self._hold_s = 0.0

    def observe(self, state: RunnerState, holding: bool) -> None:
        """The runner is in `state`, holding requests or not (its lifecycle's changes and
        each heartbeat): what its time is used for from now on."""
        self.clock.enter(use_of(state, holding))

    def waste(self, ms: float) -> None:
        """`ms` of the runner's serving time bought nothing (ebb/runners/gpu_shares.py)."""
        self.clock.waste(ms)

    def holding_back(self) -> bool:
        """Whether the time so far is undecided (see the module docstring): not written yet."""
        if self.clock.served or self.clock.kept:
            return False
        if self.clock.use != "idle" or self.clock.idle_s() < self._hold_s:
            return True  # loading, asleep, or idle for less than its idle timeout
        self.clock.keep()  # idle past its idle timeout: kept by min_replicas, on purpose
        return False

    def _switch(self, *, final: bool = False) -> None:
        uses = self.clock.take(final=final) or {self.clock.use: 1}
        if final:
            self._script.close(self._runner_id, self._meter, end="exited_ms", uses_ms=uses)
        else:
            self._script.switch(self._runner_id, self._meter, end="heartbeat_ms", uses_ms=uses)

    def _attribute(self, spec: DeploymentSpec | None) -> None:
        self._meter = meter_for(self._runner_id, spec, self._gpus)
        self._unit = spec.name if spec else ""
        self._uid = spec.uid if spec else ""
        self._hold_s = spec.idle_timeout_s + self._interval_s if spec else 0.0
        if spec is None or spec.min_replicas > 0:
            self.clock.keep()  # the pre-warmed pool, min_replicas: capacity kept on purpose

    def begin(self, spec: DeploymentSpec | None) -> None:
        """From launch on, bill to `spec`'s owner (None: the pre-warmed pool)."""
        self._attribute(spec)
        # Who pays, stored now (no segment yet: end 0): a launched runner is loading.
        self.clock.enter("loading" if spec else "idle")
        self._script.switch(self._runner_id, self._meter, end=0)
        self.start()

    def assign(self, spec: DeploymentSpec, gpus: int) -> None:
        """The runner took `spec` (a pre-warmed one: its pool time ends at this heartbeat),
        holding `gpus` devices (`held_gpus`) from now on."""
        self._gpus = gpus
        self._switch()  # the pool's time, then this deployment's from here
        self.clock.restart_undecided()
        self._attribute(spec)

    def run(self) -> None:
        while not self._done.wait(self._interval_s):
            if self.holding_back():
                continue
            try:
                self._refresh()
                self._switch()
            except Exception:  # a Redis blip: the next segment covers this one's time
                log.exception("runner: %s GPU metering failed", self._runner_id)

    def close(self) -> None:
        """The runner recorded its exit: bill up to it, once. Never raises: if this fails,
        the controller closes the interval from the last heartbeat."""
        self._done.set()
        if self.is_alive():
            self.join()
        try:
            self._switch(final=True)
        except Exception:
            log.exception("runner: %s could not close its GPU metering", self._runner_id)

    def _refresh(self) -> None:
        if self._meter.deployment == POOL_DEPLOYMENT or not self._unit:
            return
        spec = self._read_spec(self._unit)
        if spec is not None and spec.uid == self._uid:
            self._meter = meter_for(self._runner_id, spec, self._gpus)


class NoMeter:
    """Metering switched off (EBB_METERING=0)."""

    def observe(self, state: RunnerState, holding: bool) -> None: ...

    def waste(self, ms: float) -> None: ...

    def begin(self, spec: DeploymentSpec | None) -> None: ...

    def assign(self, spec: DeploymentSpec, gpus: int) -> None: ...

    def close(self) -> None: ...


def runner_meter(
    settings: Settings,
    client: redis.Redis,
    runner_id: str,
    read_spec: Callable[[str], DeploymentSpec | None],
    gpus: int,
) -> RunnerMeter | NoMeter:
    """`gpus`: the devices the runner holds (`ebb.gpus.count.held_gpus`)."""
    if not settings.metering:
        return NoMeter()
    return RunnerMeter(
        client, runner_id, interval_s=settings.gpu_meter_interval_s, read_spec=read_spec, gpus=gpus
    )
