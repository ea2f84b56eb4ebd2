"""A runner process from launch to exit: STARTING -> (PREWARMED) -> LOADING -> READY ->
DRAINING -> EXITED, or FAILED.

Launched by the controller either with a deployment (a fresh start) or without one (a
pre-warmed stem: it imports the engine libraries, joins the pool and waits for the
controller to assign it a deployment). Every phase of the cold start is timed and folded
into the deployment's cold-start statistics.

Told to stop (`stopping`), it drains if it serves; if it imports or loads, it gives that
up and exits EXITED at once (nothing was admitted to it yet).

The heartbeat thread is `heartbeat`, loading the engine `loading`, the phase clock
`cold_start_clock`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ebb import tracing
from ebb.billing.gpu import NoMeter, RunnerMeter, runner_meter
from ebb.config import Settings
from ebb.engine_options import lora_limits
from ebb.gpus import nvml
from ebb.gpus.count import held_gpus, visible_gpu_count
from ebb.launching.handoff import LAUNCHED_AT_ENV
from ebb.launching.tiers import Tier
from ebb.process_memory import start_memory_reporter
from ebb.queue.connection import UNAVAILABLE_ERRORS, sync_client
from ebb.queue.gpu_records import GpuPlacement
from ebb.queue.gpus import SLEEPER_EXIT
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import DeploymentSpec, RunnerState, WorkItem
from ebb.queue.versions import public_name
from ebb.runners import core_pinning, load_reserve, stall, stopping
from ebb.runners.adapters import RunnerAdapters
from ebb.runners.cold_start_clock import ColdStartClock
from ebb.runners.devices import use_placement
from ebb.runners.engine import EngineAdapter
from ebb.runners.heartbeat import Heartbeat
from ebb.runners.lifecycle import Lifecycle
from ebb.runners.loading import import_engine_libraries, load_engine
from ebb.runners.serve import Outcome, ServingLoop, jobs_beside_sync
from ebb.runners.stopping import RunnerStop, StopRequested
from ebb.secrets import SecretBox, usable_env

log = logging.getLogger(__name__)


def run_runner(settings: Settings, runner_id: str, deployment: str | None, tier: Tier) -> int:
    """The runner process body; returns its exit code."""
    launched_ms = float(os.environ.get(LAUNCHED_AT_ENV, time.time() * 1000))
    clock = ColdStartClock(launched_ms)
    clock.lap("spawn")
    client = sync_client(settings.platform_redis_url("a runner"), outage_s=settings.redis_outage_s)
    queue = RunnerQueue(
        client,
        runner_id,
        lease_ttl_s=settings.lease_ttl_s,
        result_ttl_s=settings.result_ttl_s,
        record_usage=settings.metering,
        prefix_affinity_ms=settings.prefix_affinity_ms,
        prefix_step_wait_ms=settings.prefix_step_wait_ms,
        balance_wait_ms=settings.claim_balance_ms,
    )
    stopper = RunnerStop()
    stopper.install()
    # Where it runs, for placement: a stem here serves best a model this node caches.
    queue.set_fields(pid=os.getpid(), node=settings.node_name or socket.gethostname())
    heartbeat = Heartbeat(
        queue,
        settings.heartbeat_interval_s,
        stopper.event,
        follow_parent=settings.runner_follows_parent,
        on_orphaned=stopper.request,
    )
    heartbeat.start()
    start_memory_reporter(settings.platform_redis_url("a runner"), "runner", runner_id=runner_id)
    # A runner launched for a deployment holds its placement's GPUs from launch on; a stem
    # holds what its launcher named (on one host: none, until it is assigned).
    placement = queue.placement() if deployment else None
    meter = runner_meter(settings, client, runner_id, queue.deployment, gpus=held_gpus(placement))
    lifecycle = Lifecycle(
        queue,
        on_change=_on_change(settings, meter, heartbeat),
    )
    # What its GPU time is used for (billing/gpu_split.py), from each beat.
    heartbeat.on_beat = lambda holding: meter.observe(lifecycle.state, holding)
    redis_gone = False
    try:
        meter.begin(_launched_for(queue, deployment) if deployment else None)
        return _run(settings, lifecycle, queue, deployment, tier, clock, stopper, heartbeat, meter)
    except UNAVAILABLE_ERRORS:
        # Redis stayed away past EBB_REDIS_OUTAGE_S: nothing more can be written through
        # it. Once it is back, the reaper ends what this runner held (or reruns it) and
        # the controller closes its GPU time from its last heartbeat.
        log.exception("runner: %s gives up, Redis unreachable", runner_id)
        redis_gone = True
        return 1
    except Exception as e:
        log.exception("runner: %s failed", runner_id)
        lifecycle.fail(f"{type(e).__name__}: {e}")
        return 1
    finally:
        heartbeat.done.set()
        if not redis_gone:
            meter.close()


def _run(
    settings: Settings,
    lifecycle: Lifecycle,
    queue: RunnerQueue,
    deployment: str | None,
    tier: Tier,
    clock: ColdStartClock,
    stopper: RunnerStop,
    heartbeat: Heartbeat,
    meter: RunnerMeter | NoMeter,
) -> int:
    stop = stopper.event
    if deployment is None:
        try:
            with stopper.interruptible():
                import_engine_libraries()
        except StopRequested:
            return _exit_stopped(lifecycle, "importing the engine")
        clock.lap("import")
        reserve = load_reserve.reserve_for_stem(
            settings.stem_load_reserve_gib, gpus=visible_gpu_count()
        )
        try:
            # Into the pool once its reserve is written: the load it is assigned gets it.
            if reserve is None or reserve.wait_written(stop):
                deployment = _wait_as_stem(lifecycle, queue, stop)
            else:
                deployment = None  # told to stop first
            # A stem's cold start begins now: unmapping its reserve is part of it.
            clock = ColdStartClock(time.time() * 1000)
        finally:
            if reserve is not None:
                reserve.release()  # now: the load's allocations come next
        if deployment is None:
            lifecycle.to(RunnerState.EXITED)
            return 0
    spec, sealed_env = queue.unit(deployment)
    bound = queue.bound_uid()
    if spec is None or (bound and spec.uid != bound):
        # Deleted since the controller chose this runner for it (and perhaps created again
        # by another owner): it loads nothing, and no one's secrets, under that name.
        lifecycle.to(RunnerState.EXITED, error=f"deployment {deployment!r} was deleted")
        return 0
    if spec.uid != bound:
        queue.set_fields(deployment_uid=spec.uid)
    # The version's environment (secrets such as HF_TOKEN) before weights or the engine
    # read theirs; only names are logged.
    env = usable_env(SecretBox(settings.secrets_key).open(sealed_env))
    os.environ.update(env)
    if env:
        log.info("runner: %s set env %s", queue.runner_id, sorted(env))
    placement = queue.placement()
    if placement is not None:
        use_placement(placement)  # before the engine touches CUDA
    meter.assign(spec, gpus=held_gpus(placement))
    lifecycle.to(RunnerState.LOADING, deployment=deployment, tier=tier)
    loaded = _load_unless_stopped(settings, spec, clock, tier, placement, stopper)
    if loaded is None:
        return _exit_stopped(lifecycle, "loading")
    engine, tier = loaded
    clock.lap("engine")
    loop = ServingLoop(queue, engine, spec, stop, lifecycle)
    loop.read_gpus = nvml.reader()
    loop.adapters = _adapters(settings, spec)
    loop.adapters.on_cold_load = functools.partial(_adapter_loaded, queue, public_name(spec.name))
    loop.adapters.on_failure = functools.partial(_adapter_failed, queue)
    loop.jobs_beside_sync = jobs_beside_sync(settings.job_slots_beside_sync, visible_gpu_count())
    if core_pinning.pin_wanted(settings.engine_core_pin):
        loop.engine_thread_placement = functools.partial(
            core_pinning.own_core, settings.home, engine.cpu_threads
        )
    loop.on_first_output = _become_ready(lifecycle, queue, deployment, tier, clock)
    heartbeat.held_ids = loop.held_ids
    loop.gpu_shares.on_waste = meter.waste
    heartbeat.progress = loop.engine_progress
    give_up = stall.die_of_stall(
        queue, deployment, loop.held_ids, lifecycle, settings.engine_stall_s
    )
    heartbeat.watchdog = stall.Watchdog(
        loop.engine_progress, settings.engine_stall_s, give_up
    ).check
    try:
        while loop.run() is Outcome.SLEEP:
            woken = _sleep_until_woken(settings, lifecycle, queue, engine, deployment, stop)
            if woken is None:
                break
            loop.on_first_output = woken
    except UNAVAILABLE_ERRORS:
        raise  # not the engine's fault, and no way to report through Redis
    except Exception as e:
        loop.fail_all(f"the engine failed: {e}")
        raise
    finally:
        engine.shutdown()
    lifecycle.to(RunnerState.EXITED)
    return 0


def _load_unless_stopped(
    settings: Settings,
    spec: DeploymentSpec,
    clock: ColdStartClock,
    tier: Tier,
    placement: GpuPlacement | None,
    stopper: RunnerStop,
) -> tuple[EngineAdapter, Tier] | None:
    """The loaded engine and the tier it started from; None when the runner was told to
    stop before or while it loaded (the load given up), or as it ended (shut down)."""
    try:
        with stopper.interruptible():
            engine, tier = load_engine(settings, spec, clock, tier, placement)
    except BaseException as e:
        # Whatever a load told to stop raised, it was stopped, not failed.
        if not (stopping.caused_by_stop(e) or stopper.event.is_set()):
            raise
        if not isinstance(e, StopRequested):
            log.info("runner: the stopped load raised", exc_info=e)
        return None
    if stopper.event.is_set():
        # Stopped as the load ended, or by a load that swallowed the stop: nothing was
        # admitted yet, and nothing will be.
        engine.shutdown()
        return None
    return engine, tier


def _exit_stopped(lifecycle: Lifecycle, phase: str) -> int:
    """End a runner stopped while `phase`, before it admitted anything: what the load
    started ends with it, and it exits as one told to stop (EXITED: its claims released
    and its GPU time closed as on any exit, no failure for the controller to count)."""
    log.info("runner: stopped while %s", phase)
    stopping.end_children()
    lifecycle.to(RunnerState.EXITED)
    return 0


def _launched_for(queue: RunnerQueue, deployment: str) -> DeploymentSpec | None:
    """The spec of the deployment this runner was launched for; None when the name now
    belongs to another deployment (another uid), which is never billed for this runner."""
    spec = queue.deployment(deployment)
    bound = queue.bound_uid()
    return None if spec is None or (bound and spec.uid != bound) else spec


def _become_ready(
    lifecycle: Lifecycle, queue: RunnerQueue, deployment: str, tier: Tier, clock: ColdStartClock
) -> Callable[[WorkItem], None]:
    """Go READY and record the start's phases; returns what records its first token."""
    lifecycle.to(RunnerState.READY, tier=tier)
    ready_s = time.time()
    clock.phases_ms["total"] = clock.total()
    queue.record_cold_start(deployment, tier, clock.phases_ms)
    phases = {k: round(v) for k, v in clock.phases_ms.items()}
    log.info(
        "runner: %s ready for %s via %s in %.0f ms %s",
        queue.runner_id,
        deployment,
        tier,
        clock.total(),
        phases,
    )

    def first_token(work: WorkItem) -> None:
        # From READY for a request that waited on this start, else from its own arrival:
        # a runner that went ready before any work came has no first-token cost to show.
        waited_from_s = max(ready_s, work.enqueued_at_s)
        if work.traceparent and work.enqueued_at_s < ready_s:
            start_ns = int(clock.start_ms * 1_000_000)
            tracing.record_cold_start(work.traceparent, tier, start_ns, clock.phases_ms)
        queue.record_cold_start(
            deployment, tier, {"first_token": (time.time() - waited_from_s) * 1000}
        )

    return first_token


def _sleep_until_woken(
    settings: Settings,
    lifecycle: Lifecycle,
    queue: RunnerQueue,
    engine: EngineAdapter,
    deployment: str,
    stop: threading.Event,
) -> Callable[[WorkItem], None] | None:
    """Park the engine asleep until the controller wakes this runner for new work.

    Returns what records the first token after the wake-up, or None when the runner should
    exit instead (slept past the sleep timeout, or asked to stop).
    """
    engine.sleep()
    deadline = time.monotonic() + settings.sleep_timeout_s
    woken = None
    while not woken and not stop.is_set() and time.monotonic() < deadline:
        woken = queue.wait_for_assignment(timeout_s=0.5)
    if not woken:
        if queue.leave_sleepers(deployment):
            return None
        # The controller took this sleeper at the instant it gave up: serve that work.
        woken = queue.wait_for_assignment(timeout_s=5.0)
    if not woken or woken == SLEEPER_EXIT:
        # Gave up, or evicted: the host's RAM budget for sleepers is spent.
        return None
    clock = ColdStartClock(time.time() * 1000)
    engine.wake_up()
    clock.lap("wake")
    return _become_ready(lifecycle, queue, deployment, Tier.SLEEPING, clock)


def _wait_as_stem(lifecycle: Lifecycle, queue: RunnerQueue, stop: threading.Event) -> str | None:
    lifecycle.to(RunnerState.PREWARMED)
    queue.offer_as_stem()
    while not stop.is_set():
        assigned = queue.wait_for_assignment(timeout_s=0.5)
        if assigned:
            return assigned
    if queue.withdraw_stem():
        return None
    # The controller took this stem at the instant it was told to stop: take that one (it
    # exits before its load, LOADING -> EXITED, and the controller starts another).
    return queue.wait_for_assignment(timeout_s=5.0)


def _on_change(
    settings: Settings, meter: RunnerMeter | NoMeter, heartbeat: Heartbeat
) -> Callable[[RunnerState], None]:
    """What each lifecycle transition tells: the GPU meter what the time is used for from
    now on, and a pod's readiness file (when one is asked for)."""
    ready_file = _ready_file(settings.runner_ready_file) if settings.runner_ready_file else None

    def follow(state: RunnerState) -> None:
        meter.observe(state, bool(heartbeat.held_ids()))
        if ready_file is not None:
            ready_file(state)

    return follow


def _ready_file(path: Path) -> Callable[[RunnerState], None]:
    """Keeps `path` present exactly while the runner is READY: a pod's readiness probe
    reads the runner's own state from it."""

    def follow(state: RunnerState) -> None:
        if state is RunnerState.READY:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            path.unlink(missing_ok=True)

    return follow


def _adapters(settings: Settings, spec: DeploymentSpec) -> RunnerAdapters:
    """The LoRA adapters this runner may serve, fetched into this host's weight cache."""
    from ebb.weights_cache import CacheOptions

    return RunnerAdapters(
        settings.weights_dir,
        limits=lora_limits(spec.engine),
        base_source=spec.source,
        cache_options=CacheOptions.from_settings(settings),
    )


# An adapter's metric and status: never worth failing the request that loaded it.


def _adapter_loaded(queue: RunnerQueue, base: str, adapter: str) -> None:
    with contextlib.suppress(*UNAVAILABLE_ERRORS):
        queue.adapter_loaded(adapter, base)


def _adapter_failed(queue: RunnerQueue, adapter: str, error: str) -> None:
    with contextlib.suppress(*UNAVAILABLE_ERRORS):
        queue.adapter_failed(adapter, error)
