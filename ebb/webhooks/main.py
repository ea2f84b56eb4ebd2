"""The `ebb webhooks` process: the job collector and the delivery worker, until SIGTERM.

Both are stateless beyond Redis; any number of these processes may run. On SIGTERM the
worker stops taking deliveries, lets attempts in flight finish (up to the webhook
timeout) and exits; anything cut short is retried by whichever worker runs next.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import httpx

from ebb.config import Settings
from ebb.process_guard import exit_when_orphaned
from ebb.process_memory import start_memory_reporter
from ebb.queue.connection import async_client
from ebb.queue.delivery_store import DeliveryStore, delivery_record_ttl_s
from ebb.queue.job_store import JobStore
from ebb.queue.ratelimits import RateLimitStore
from ebb.queue.webhook_secrets import WebhookSecrets
from ebb.webhooks.collector import JobCollector
from ebb.webhooks.sender import USER_AGENT, Deliverer


def run_worker(settings: Settings) -> None:
    exit_when_orphaned()
    # The worker logs each attempt itself, with the webhook id and job.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    asyncio.run(_main(settings))


async def _main(settings: Settings) -> None:
    client = async_client(settings.platform_redis_url("ebb webhooks"))
    start_memory_reporter(settings.platform_redis_url("ebb webhooks"), "webhooks")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    collector = JobCollector(
        JobStore(client, retention_s=settings.job_retention_s, result_ttl_s=settings.result_ttl_s),
        settings,
        RateLimitStore(client),
    )
    # Redirects are not followed: a 3xx is a failed attempt, never a hop to another host.
    http = httpx.AsyncClient(
        follow_redirects=False,
        headers={"user-agent": USER_AGENT},
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        trust_env=False,
    )
    deliverer = Deliverer(
        DeliveryStore(
            client,
            record_ttl_s=delivery_record_ttl_s(
                settings.webhook_give_up_s, settings.job_retention_s
            ),
        ),
        WebhookSecrets(client),
        settings,
        http,
    )
    try:
        await asyncio.gather(collector.run(stop), deliverer.run(stop))
    finally:
        await http.aclose()
        await client.aclose()
