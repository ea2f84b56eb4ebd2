"""The controller process: a Controller over local processes, stopped by SIGTERM."""

from __future__ import annotations

import asyncio
import signal

from ebb.coldstart.controller import Controller
from ebb.coldstart.gpu_placer import GpuPlacer
from ebb.coldstart.launcher import LocalProcessLauncher
from ebb.coldstart.preparer import Preparer
from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.process_guard import exit_when_orphaned
from ebb.queue.connection import async_client
from ebb.queue.gpus import GpuState
from ebb.queue.metering import GpuMeterScript
from ebb.queue.platform import PlatformState


def run_controller(settings: Settings) -> None:
    exit_when_orphaned()
    asyncio.run(_main(settings))


async def _main(settings: Settings) -> None:
    client = async_client(settings.platform_redis_url("ebb coldstart"))
    state = PlatformState(client, result_ttl_s=settings.result_ttl_s)
    launcher = LocalProcessLauncher(settings)
    controller = Controller(
        settings,
        state,
        launcher,
        warm=launcher,
        gpu_meter=GpuMeterScript(client),
        gpus=GpuPlacer(settings, state, GpuState(client)),
    )
    preparer = Preparer(settings, state, EngineRegistry.from_settings(settings))
    stopping = asyncio.Event()

    def stop() -> None:
        stopping.set()
        controller.stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        await asyncio.gather(controller.run(), preparer.run(stopping))
    finally:
        await client.aclose()
