"""The controller process: a Controller over its launcher (EBB_LAUNCHER), stopped by SIGTERM.

Several may run against one Redis (a leader and standbys): each holds or waits for the
leader lease (`ebb.coldstart.leader`), and only the holder acts.
"""

from __future__ import annotations

import asyncio
import signal

from ebb.coldstart.budget_reaper import BudgetReaper
from ebb.coldstart.controller import Controller
from ebb.coldstart.decision_log import DecisionLog
from ebb.coldstart.executor import DecidedSpecs
from ebb.coldstart.gpu_reader import GpuReader
from ebb.coldstart.launchers import make_launcher, node_source
from ebb.coldstart.leader import LeaderElection
from ebb.coldstart.preparer import Preparer
from ebb.coldstart.rollouts import RolloutDriver
from ebb.coldstart.scaling_reads import RedisScalingSource
from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.process_guard import exit_when_orphaned
from ebb.process_memory import start_memory_reporter
from ebb.queue.budget_holds import BudgetHolds
from ebb.queue.budgets import BudgetStore
from ebb.queue.connection import async_client
from ebb.queue.delivery_store import delivery_record_ttl_s
from ebb.queue.gpus import GpuState
from ebb.queue.leader_lease import LeaderLease
from ebb.queue.metering import GpuMeterScript
from ebb.queue.platform import PlatformState


def run_controller(settings: Settings) -> None:
    exit_when_orphaned()
    asyncio.run(_main(settings))


async def _main(settings: Settings) -> None:
    client = async_client(settings.platform_redis_url("ebb coldstart"))
    state = PlatformState(
        client,
        result_ttl_s=settings.result_ttl_s,
        continuations=settings.continuations,
        continuation_window_s=settings.admission_timeout_s,
    )
    specs = DecidedSpecs()
    launcher, warm = make_launcher(settings, specs.get)
    start_memory_reporter(
        settings.platform_redis_url("ebb coldstart"),
        "coldstart",
        others=getattr(launcher, "local_processes", list),
    )
    election = LeaderElection(LeaderLease(client), lease_s=settings.controller_lease_s)
    controller = Controller(
        settings,
        state,
        launcher,
        warm=warm,
        gpu_meter=GpuMeterScript(client),
        gpus=GpuReader(settings, GpuState(client)),
        leader=election,
        specs=specs,
        decisions=DecisionLog(settings.logs_dir),
        nodes=node_source(settings, launcher),
        scaling=RedisScalingSource(state),
        budget_reaper=BudgetReaper(
            BudgetHolds(client),
            BudgetStore(
                client,
                delivery_ttl_s=delivery_record_ttl_s(
                    settings.webhook_give_up_s, settings.job_retention_s
                ),
            ),
        ),
    )
    preparer = Preparer(settings, state, EngineRegistry.from_settings(settings))
    rollouts = RolloutDriver(state)
    stopping = asyncio.Event()

    def stop() -> None:
        stopping.set()
        controller.stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    holding = asyncio.create_task(election.run())
    try:
        await asyncio.gather(
            controller.run(),
            preparer.run(stopping, leading=election.leading),
            rollouts.run(stopping, leading=election.leading),
        )
    finally:
        # The lease is held (and renewed) until the controller stopped acting.
        election.stop()
        await holding
        await client.aclose()
