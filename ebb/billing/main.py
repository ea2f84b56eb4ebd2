"""The billing process (`ebb billing`, supervised by `ebb up`): the ledger consumer.

Its own process rather than a task in the controller: exporting to S3 blocks on the
network for as long as S3 is slow, and a crash in billing must not stop the autoscaler
(nor the reverse). Running two of them by mistake is harmless: every fold and close is a
compare-and-set on the ledger's state.
"""

from __future__ import annotations

import asyncio
import signal

from ebb.billing.consumer import LedgerConsumer
from ebb.billing.export import exporter_from
from ebb.config import Settings
from ebb.process_guard import exit_when_orphaned
from ebb.process_memory import start_memory_reporter
from ebb.queue.connection import async_client
from ebb.queue.ledger import LedgerStore


def run_billing(settings: Settings) -> None:
    exit_when_orphaned()
    asyncio.run(_main(settings))


async def _main(settings: Settings) -> None:
    client = async_client(settings.platform_redis_url("ebb billing"))
    start_memory_reporter(settings.platform_redis_url("ebb billing"), "billing")
    consumer = LedgerConsumer(
        LedgerStore(client),
        exporter_from(settings),
        grace_s=settings.billing_close_grace_s,
        usage_retention_s=settings.usage_retention_s,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await consumer.run(stop)
    finally:
        await client.aclose()
