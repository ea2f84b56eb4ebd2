"""Tenant quotas in Redis, and writing a tenant's deployment under its quota atomically.

The admin sets each tenant's `TenantQuota`; the frontdoor's policy (`ebb.frontdoor.quotas`)
decides whether a change fits. The check and the write happen under one WATCH of the
deployments and the quotas, so two concurrent creates by one tenant cannot both slip
under its last free slot.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from ebb.queue import keys
from ebb.queue.replies import reply_bytes, reply_hash, reply_text
from ebb.queue.schema import DeploymentSpec


class TenantQuota(msgspec.Struct, kw_only=True, frozen=True):
    """What one tenant may deploy itself. A tenant without a quota may deploy nothing."""

    max_deployments: int = 0
    # Summed over the tenant's deployments: the most runners it can hold at once.
    max_replicas: int = 0
    # Summed over the tenant's deployments: max_replicas × tensor_parallel_size (1 unset).
    max_gpus: int = 0
    # Source prefixes it may deploy from ("hf://acme/", "s3://acme-models/"); "*": any.
    allowed_sources: list[str] = []


# Called inside the WATCH with the quota (None: never set) and every deployment stored now
# ({name: spec}); raises to refuse the write.
QuotaCheck = Callable[[TenantQuota | None, dict[str, DeploymentSpec]], None]


class QuotaStore:
    def __init__(self, client: aioredis.Redis):
        self._redis = client

    async def get(self, tenant: str) -> TenantQuota | None:
        raw = await self._redis.hget(keys.TENANT_QUOTAS, tenant)
        return msgspec.json.decode(reply_bytes(raw), type=TenantQuota) if raw else None

    async def set(self, tenant: str, quota: TenantQuota) -> None:
        await self._redis.hset(keys.TENANT_QUOTAS, tenant, msgspec.json.encode(quota))

    async def all(self) -> dict[str, TenantQuota]:
        raw = reply_hash(await self._redis.hgetall(keys.TENANT_QUOTAS))
        return {
            reply_text(name): msgspec.json.decode(value, type=TenantQuota)
            for name, value in raw.items()
        }

    async def put_deployment(
        self, tenant: str, spec: DeploymentSpec, check: QuotaCheck, *, create_only: bool
    ) -> bool:
        """Store `spec` if `check` passes on the state it replaces; False when
        `create_only` and the name is taken, or when the name now belongs to another
        deployment (another uid). Retries when anything changed meanwhile."""
        data = msgspec.json.encode(spec)
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(keys.DEPLOYMENTS, keys.TENANT_QUOTAS)
                    stored = reply_hash(await pipe.hgetall(keys.DEPLOYMENTS))
                    specs = {
                        reply_text(name): msgspec.json.decode(value, type=DeploymentSpec)
                        for name, value in stored.items()
                    }
                    current = specs.get(spec.name)
                    if create_only:
                        refused = current is not None
                    else:  # never over another deployment of the name (another uid)
                        refused = current is not None and current.uid != spec.uid
                    if refused:
                        await pipe.unwatch()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                        return False
                    raw_quota = await pipe.hget(keys.TENANT_QUOTAS, tenant)
                    quota = (
                        msgspec.json.decode(reply_bytes(raw_quota), type=TenantQuota)
                        if raw_quota
                        else None
                    )
                    check(quota, specs)
                    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                    pipe.hset(keys.DEPLOYMENTS, spec.name, data)
                    if spec.uid:  # with its record: what claims compare runners' uids with
                        pipe.hset(keys.DEPLOYMENT_UIDS, spec.name, spec.uid)
                    await pipe.execute()
                    return True
                except WatchError:
                    continue
