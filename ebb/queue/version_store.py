"""Versions and traffic splits in Redis, and the specs of the serving units they make.

A deployment with nothing stored here is version 1 at 100 %: how every deployment made
before versions existed keeps working unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import redis
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from ebb.queue import keys
from ebb.queue.replies import reply_bytes, reply_hash
from ebb.queue.schema import DeploymentSpec
from ebb.queue.versions import TrafficSplit, VersionRecord, compose, split_unit, unit_name

_split_decoder = msgspec.json.Decoder(TrafficSplit)
_version_decoder = msgspec.json.Decoder(VersionRecord)
_spec_decoder = msgspec.json.Decoder(DeploymentSpec)


# Versions any deployment keeps, whoever deploys them (the admin too): each is stored with
# its environment and is a serving unit the controller looks at every pass.
MAX_VERSIONS_KEPT = 50


class TooManyVersions(Exception):
    def __init__(self, kept: int):
        super().__init__(kept)
        self.kept = kept


class VersionInUse(Exception):
    pass


def _refuse_deleting(split: TrafficSplit, number: int, *, latest: int) -> None:
    rollout = split.rollout
    if split.weights.get(number, 0) > 0:
        raise VersionInUse(f"version {number} takes traffic; roll out another version first.")
    ends = (rollout.from_version, rollout.to_version) if rollout and rollout.active else ()
    if number in ends:
        raise VersionInUse(
            f"version {number} is in the rollout in progress; finish or roll it back first."
        )
    if number == latest:
        raise VersionInUse(f"version {number} is the latest (new versions are numbered after it).")


def decode_split(raw: object) -> TrafficSplit:
    """A deployment's split as read (`keys.traffic`); nothing stored: version 1 at 100 %."""
    return _split_decoder.decode(reply_bytes(raw)) if raw else TrafficSplit()


def decode_version(raw: object) -> VersionRecord:
    return _version_decoder.decode(reply_bytes(raw))


def _versions(raw: Mapping[bytes | str, bytes | str] | None) -> dict[int, VersionRecord]:
    return {int(k): _version_decoder.decode(v) for k, v in reply_hash(raw).items()}


class VersionStore:
    def __init__(self, client: aioredis.Redis):
        self.redis = client

    async def split(self, deployment: str) -> TrafficSplit:
        return decode_split(await self.redis.get(keys.traffic(deployment)))

    async def versions(self, deployment: str) -> dict[int, VersionRecord]:
        return _versions(await self.redis.hgetall(keys.deployment_versions(deployment)))

    async def version(self, deployment: str, number: int) -> VersionRecord | None:
        raw = await self.redis.hget(keys.deployment_versions(deployment), str(number))
        return _version_decoder.decode(raw) if raw else None

    async def keep_first(self, record: VersionRecord, deployment: str) -> None:
        """Store version 1 as it is now, unless it was stored already (HSETNX)."""
        data = msgspec.json.encode(record)
        await self.redis.hsetnx(keys.deployment_versions(deployment), "1", data)

    async def add(
        self, deployment: str, make: Callable[[int], VersionRecord], *, max_versions: int
    ) -> VersionRecord:
        """A new version numbered after the highest one, listed in the split at 0 %;
        `TooManyVersions` when `max_versions` are kept already. One WATCH, so two deploys
        at once get two numbers and cannot pass the limit together."""
        key, split_key = keys.deployment_versions(deployment), keys.traffic(deployment)
        async with self.redis.pipeline() as pipe:
            while True:
                try:
                    await pipe.watch(key, split_key)
                    numbers = [int(k) for k in await pipe.hkeys(key)]
                    if len(numbers) >= max_versions:
                        raise TooManyVersions(len(numbers))
                    record = make(max([1, *numbers]) + 1)
                    split = decode_split(await pipe.get(split_key))
                    split.weights.setdefault(record.version, 0)  # prepared; traffic by rollout
                    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                    pipe.hset(key, str(record.version), msgspec.json.encode(record))
                    pipe.set(split_key, msgspec.json.encode(split))
                    await pipe.execute()
                    return record
                except WatchError:
                    continue

    async def delete_version(self, deployment: str, number: int) -> TrafficSplit:
        """Forget version `number` and its unit's state; the split after. Raises
        LookupError when there is no such version, VersionInUse when it takes traffic,
        is in a rollout or is the latest (new versions are numbered after it)."""
        key, split_key = keys.deployment_versions(deployment), keys.traffic(deployment)
        async with self.redis.pipeline() as pipe:
            while True:
                try:
                    await pipe.watch(key, split_key)
                    numbers = [int(k) for k in await pipe.hkeys(key)]
                    if number not in numbers:
                        raise LookupError(number)
                    split = decode_split(await pipe.get(split_key))
                    _refuse_deleting(split, number, latest=max(numbers))
                    split.weights.pop(number, None)
                    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                    pipe.hdel(key, str(number))
                    pipe.set(split_key, msgspec.json.encode(split))
                    if number != 1:  # version 1's unit state is the deployment's own
                        unit = unit_name(deployment, number)
                        pipe.delete(keys.deployment_status(unit), keys.coldstart(unit))
                    await pipe.execute()
                    return split
                except WatchError:
                    continue

    async def update_split(
        self, deployment: str, change: Callable[[TrafficSplit], TrafficSplit]
    ) -> TrafficSplit:
        """Apply `change` to the current split atomically (WATCH/MULTI, retried on a race
        with another frontdoor or the controller). `change` may raise to refuse."""
        key = keys.traffic(deployment)
        async with self.redis.pipeline() as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    new = change(decode_split(await pipe.get(key)))
                    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                    pipe.set(key, msgspec.json.encode(new))
                    await pipe.execute()
                    return new
                except WatchError:
                    continue

    async def unit_spec(self, unit: str) -> DeploymentSpec | None:
        """The spec a unit runs with; None once its deployment is deleted."""
        name, number = split_unit(unit)
        pipe = self.redis.pipeline(transaction=False)
        ask_unit(pipe, name, number)
        raw_spec, raw_version, raw_split = await pipe.execute()
        return decode_unit(raw_spec, raw_version, raw_split, number)

    async def units(self, specs: list[DeploymentSpec]) -> list[DeploymentSpec]:
        """The serving units of `specs`: every version that has traffic or may still hold
        work (listed in its split), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        _ask_units(pipe, specs)
        return _units(specs, await pipe.execute())


def _ask_units(pipe: Any, specs: list[DeploymentSpec]) -> None:
    """Queue the reads `_units` needs on `pipe` (an async or a blocking pipeline)."""
    for spec in specs:
        pipe.get(keys.traffic(spec.name))
        pipe.hgetall(keys.deployment_versions(spec.name))


def _units(specs: list[DeploymentSpec], replies: list[Any]) -> list[DeploymentSpec]:
    units: list[DeploymentSpec] = []
    for i, spec in enumerate(specs):
        split, versions = decode_split(replies[2 * i]), _versions(replies[2 * i + 1])
        for number in sorted(split.weights):
            if number == 1 or number in versions:
                units.append(compose(spec, versions.get(number), split, number))
    return units


def read_units(client: redis.Redis, specs: list[DeploymentSpec]) -> list[DeploymentSpec]:
    """`VersionStore.units` on a blocking client (a node's weight prefetcher)."""
    pipe = client.pipeline(transaction=False)
    _ask_units(pipe, specs)
    return _units(specs, pipe.execute())


def ask_unit(pipe: Any, deployment: str, number: int) -> None:
    """Queue on `pipe` the three reads `decode_unit` takes, in its order: the deployment's
    record, version `number`'s record and the traffic split."""
    pipe.hget(keys.DEPLOYMENTS, deployment)
    pipe.hget(keys.deployment_versions(deployment), str(number))
    pipe.get(keys.traffic(deployment))


def decode_unit(
    raw_spec: object, raw_version: object, raw_split: object, number: int
) -> DeploymentSpec | None:
    """A unit's spec from its deployment's record, its version's and the split, as read;
    None when the deployment is gone, or the version (other than 1) is."""
    if not raw_spec:
        return None
    version = _version_decoder.decode(reply_bytes(raw_version)) if raw_version else None
    if version is None and number != 1:
        return None
    return compose(
        _spec_decoder.decode(reply_bytes(raw_spec)), version, decode_split(raw_split), number
    )


def read_unit_spec(client: redis.Redis, unit: str) -> DeploymentSpec | None:
    """`VersionStore.unit_spec` on a blocking client (a runner, a launcher)."""
    name, number = split_unit(unit)
    pipe = client.pipeline(transaction=False)
    ask_unit(pipe, name, number)
    raw_spec, raw_version, raw_split = pipe.execute()
    return decode_unit(raw_spec, raw_version, raw_split, number)


def read_unit(client: redis.Redis, unit: str) -> tuple[DeploymentSpec | None, str]:
    """A unit's spec and its version's sealed environment ("" when none), read in one
    transaction: both belong to the same deployment (never one owner's spec with a later
    owner's secrets of the same name)."""
    name, number = split_unit(unit)
    pipe = client.pipeline(transaction=True)
    ask_unit(pipe, name, number)
    raw_spec, raw_version, raw_split = pipe.execute()
    spec = decode_unit(raw_spec, raw_version, raw_split, number)
    if spec is None or not raw_version:
        return spec, ""
    return spec, _version_decoder.decode(reply_bytes(raw_version)).env_sealed
