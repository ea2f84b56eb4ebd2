"""The frontdoor's shared services, and the typed dependency routes reach them through.

`create_app` builds one `Services` per process at startup; a route (or a dependency such
as authentication) takes it as a `ServicesDep` parameter instead of reading
`request.app.state`, so its type is known and tests may override `get_services`.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Annotated

import redis.asyncio as aioredis
from fastapi import Depends, Request

from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.frontdoor.budget_presence import BudgetPresence
from ebb.frontdoor.budgets import BudgetGate
from ebb.frontdoor.catalog import ModelCatalog, template_limits
from ebb.frontdoor.draining import Drain
from ebb.frontdoor.execution import Executor
from ebb.frontdoor.files import FileStore, file_store
from ebb.frontdoor.metrics import Metrics
from ebb.frontdoor.ratelimit import RateLimiter
from ebb.home import resolve_admin_key
from ebb.queue.batch_store import BatchStore
from ebb.queue.budget_presence import BudgetPresenceReads
from ebb.queue.budgets import BudgetStore
from ebb.queue.connection import async_client, short_command_client
from ebb.queue.delivery_store import DeliveryStore, delivery_record_ttl_s
from ebb.queue.event_hub import EventHub
from ebb.queue.file_quota import FileQuotaStore
from ebb.queue.job_store import JobStore
from ebb.queue.ledger import LedgerStore
from ebb.queue.memory_headroom import RedisHeadroom
from ebb.queue.platform import PlatformState
from ebb.queue.priority_store import PriorityStore
from ebb.queue.quotas import QuotaStore
from ebb.queue.ratelimits import RateLimitStore
from ebb.queue.requests import RequestQueue
from ebb.queue.stream_views import StreamViews
from ebb.queue.turn_batch import TurnBatch
from ebb.queue.webhook_secrets import WebhookSecrets


@dataclass
class Services:
    settings: Settings
    admin_key: str
    redis: aioredis.Redis
    state: PlatformState
    queue: RequestQueue
    executor: Executor
    catalog: ModelCatalog
    engines: EngineRegistry
    metrics: Metrics
    limiter: RateLimiter
    ratelimits: RateLimitStore
    priorities: PriorityStore
    quotas: QuotaStore
    ledger: LedgerStore
    jobs: JobStore
    deliveries: DeliveryStore
    webhook_secrets: WebhookSecrets
    batches: BatchStore
    files: FileStore
    file_quota: FileQuotaStore
    stream_views: StreamViews
    budgets: BudgetStore
    # Whether Redis has room for tenant-fed writes (frontdoor.tenant_writes).
    headroom: RedisHeadroom
    # This process's id while it heartbeats (keys.frontdoor_alive): it owns the budget
    # reservations it makes, which the controller settles if it dies (budget_holds).
    instance: str = ""
    # Which callers have a budget (None: every request runs the reserve script).
    budget_presence: BudgetPresence | None = None
    drain: Drain = field(default_factory=Drain)


def build_services(settings: Settings) -> Services:
    url = settings.platform_redis_url("the frontdoor")
    client = async_client(url)
    state = PlatformState(
        client, result_ttl_s=settings.result_ttl_s, short_client=short_command_client(url)
    )
    # One pipeline per loop turn for the admission path: the enqueues, budget reserves
    # and settles, and stream views of the requests the loop resumed together share it.
    turn = TurnBatch(client)
    # A request record must outlive its admission window and generation.
    queue = RequestQueue(client, request_ttl_s=max(settings.result_ttl_s, 3600), batch=turn)
    ratelimits = RateLimitStore(client)
    budgets = BudgetStore(
        client,
        delivery_ttl_s=delivery_record_ttl_s(settings.webhook_give_up_s, settings.job_retention_s),
        batch=turn,
    )
    engines = EngineRegistry.from_settings(settings)
    instance = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    presence = BudgetPresence(BudgetPresenceReads(client))
    return Services(
        settings=settings,
        admin_key=resolve_admin_key(settings),
        redis=client,
        state=state,
        queue=queue,
        executor=Executor(settings, queue, state, PriorityStore(client), EventHub(client)),
        priorities=PriorityStore(client),
        catalog=ModelCatalog(state, engines, template_limits(settings)),
        engines=engines,
        metrics=Metrics(
            settings.weights_dir,
            settings.weights_cache_bytes,
            max_tenants=settings.metrics_max_tenants,
            gpu_second_cost_micros=settings.gpu_second_cost_micros,
        ),
        limiter=RateLimiter(ratelimits, BudgetGate(budgets, owner=instance, presence=presence)),
        ratelimits=ratelimits,
        quotas=QuotaStore(client),
        ledger=LedgerStore(client),
        jobs=JobStore(
            client, retention_s=settings.job_retention_s, result_ttl_s=settings.result_ttl_s
        ),
        deliveries=DeliveryStore(
            client,
            record_ttl_s=delivery_record_ttl_s(
                settings.webhook_give_up_s, settings.job_retention_s
            ),
        ),
        webhook_secrets=WebhookSecrets(client),
        batches=BatchStore(
            client,
            retention_s=settings.job_retention_s,
            delivery_ttl_s=delivery_record_ttl_s(
                settings.webhook_give_up_s, settings.job_retention_s
            ),
        ),
        files=file_store(settings),
        file_quota=FileQuotaStore(client),
        stream_views=StreamViews(client, ttl_s=max(settings.result_ttl_s, 3600), batch=turn),
        budgets=budgets,
        headroom=RedisHeadroom(client, high_water=settings.redis_tenant_write_high_water),
        instance=instance,
        budget_presence=presence,
    )


def services_of(request: Request) -> Services:
    """The services `create_app`'s startup stored on the application."""
    services: Services = request.app.state.services
    return services


async def get_services(request: Request) -> Services:
    """`services_of` as a dependency. A coroutine although it awaits nothing: FastAPI runs
    a plain-function dependency in its thread pool, a hop to another thread and back on
    every request."""
    return services_of(request)


ServicesDep = Annotated[Services, Depends(get_services)]
