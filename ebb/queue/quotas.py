"""Tenant quotas in Redis, and writing a tenant's deployment under its quota atomically.

The admin sets each tenant's `TenantQuota`; the frontdoor's policy (`ebb.frontdoor.quotas`)
decides whether a change fits. The check and the write happen under one WATCH of the
deployments, the quotas and the tenant's traffic splits and versions, so two concurrent
changes by one tenant (a create, a PATCH of replicas, a rollout) cannot both slip under
its last free slot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from ebb.queue import keys
from ebb.queue.replies import reply_bytes, reply_hash, reply_text
from ebb.queue.schema import DeploymentSpec
from ebb.queue.version_store import decode_split, decode_version
from ebb.queue.versions import TrafficSplit, VersionRecord

# Versions a tenant keeps per deployment unless its quota says otherwise.
DEFAULT_MAX_VERSIONS = 20


class TenantQuota(msgspec.Struct, kw_only=True, frozen=True):
    """What one tenant may deploy itself. A tenant without a quota may deploy nothing."""

    max_deployments: int = 0
    # Summed over the tenant's deployments: the most runners it can hold at once.
    max_replicas: int = 0
    # Summed over the tenant's deployments: max_replicas × tensor_parallel_size (1 unset).
    max_gpus: int = 0
    # Source prefixes it may deploy from ("hf://acme/", "s3://acme-models/"); "*": any.
    allowed_sources: list[str] = []
    # Versions kept per deployment (deploying past it: delete old ones first).
    max_versions: int = DEFAULT_MAX_VERSIONS


@dataclass
class Holdings:
    """What quotas count, as read under the WATCH: every deployment stored, and of the
    tenant's own (and the one being written) the traffic split and the records of the
    versions it lists."""

    specs: dict[str, DeploymentSpec]
    splits: dict[str, TrafficSplit] = field(default_factory=dict)
    versions: dict[str, dict[int, VersionRecord]] = field(default_factory=dict)

    def split(self, name: str) -> TrafficSplit:
        return self.splits.get(name) or TrafficSplit()


# Called inside the WATCH with the quota (None: never set), the holdings before the write
# and after it; raises to refuse the write.
QuotaCheck = Callable[[TenantQuota | None, Holdings, Holdings], None]


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

    async def holdings(self, tenant: str, name: str) -> tuple[Holdings, TenantQuota | None]:
        """What quotas count for `tenant` (and the deployment `name`) now, and its quota:
        for a check that writes nothing (the write it allows is checked again)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            return await self._watch(pipe, tenant, name)

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
                    before, quota = await self._watch(pipe, tenant, spec.name)
                    current = before.specs.get(spec.name)
                    if create_only:
                        refused = current is not None
                    else:  # never over another deployment of the name (another uid)
                        refused = current is not None and current.uid != spec.uid
                    if refused:
                        await pipe.unwatch()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                        return False
                    after = Holdings(
                        {**before.specs, spec.name: spec}, before.splits, before.versions
                    )
                    check(quota, before, after)
                    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                    pipe.hset(keys.DEPLOYMENTS, spec.name, data)
                    if spec.uid:  # with its record: what claims compare runners' uids with
                        pipe.hset(keys.DEPLOYMENT_UIDS, spec.name, spec.uid)
                    await pipe.execute()
                    return True
                except WatchError:
                    continue

    async def put_split(
        self,
        tenant: str,
        name: str,
        change: Callable[[TrafficSplit], TrafficSplit],
        check: QuotaCheck,
    ) -> TrafficSplit:
        """Apply `change` to `name`'s traffic split if `check` passes on the tenant's
        holdings before and after (a rollout that would run a version past the quota is
        refused). `change` may raise to refuse. Retries when anything changed meanwhile."""
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    before, quota = await self._watch(pipe, tenant, name)
                    new = change(before.split(name))
                    records = await self._records(name, _listed(new))
                    after = Holdings(
                        before.specs,
                        {**before.splits, name: new},
                        {**before.versions, name: records},
                    )
                    check(quota, before, after)
                    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                    pipe.set(keys.traffic(name), msgspec.json.encode(new))
                    await pipe.execute()
                    return new
                except WatchError:
                    continue

    async def _watch(
        self, pipe: Any, tenant: str, name: str
    ) -> tuple[Holdings, TenantQuota | None]:
        """WATCH and read what quotas count for `tenant` (and the deployment `name`)."""
        await pipe.watch(keys.DEPLOYMENTS, keys.TENANT_QUOTAS)
        stored = reply_hash(await pipe.hgetall(keys.DEPLOYMENTS))
        specs = {
            reply_text(n): msgspec.json.decode(value, type=DeploymentSpec)
            for n, value in stored.items()
        }
        raw_quota = await pipe.hget(keys.TENANT_QUOTAS, tenant)
        quota = msgspec.json.decode(reply_bytes(raw_quota), type=TenantQuota) if raw_quota else None
        names = sorted({n for n, s in specs.items() if s.owner == tenant} | ({name} - {""}))
        if names:
            await pipe.watch(*map(keys.traffic, names), *map(keys.deployment_versions, names))
        # Read on another connection: the WATCH above still catches any change after it.
        reads = self._redis.pipeline(transaction=False)
        for n in names:
            reads.get(keys.traffic(n))
        splits = dict(zip(names, map(decode_split, await reads.execute()), strict=True))
        holdings = Holdings(specs, splits)
        for n in names:
            holdings.versions[n] = await self._records(n, _listed(splits[n]))
        return holdings, quota

    async def _records(self, name: str, numbers: list[int]) -> dict[int, VersionRecord]:
        if not numbers:
            return {}
        raw = await self._redis.hmget(keys.deployment_versions(name), [str(n) for n in numbers])
        return {n: decode_version(r) for n, r in zip(numbers, raw, strict=True) if r}


def _listed(split: TrafficSplit) -> list[int]:
    """The versions a split names (its shares and its rollout's ends)."""
    numbers: Iterable[int] = split.weights
    if split.rollout is not None:
        numbers = [*numbers, split.rollout.from_version, split.rollout.to_version]
    return sorted(set(numbers))
