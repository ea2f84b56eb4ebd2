"""Platform state in Redis as seen by the frontdoor and the controller (asyncio side).

Deployments, runners and their pre-warmed pool, the controller's wake-up list, lease
reaping, cold-start statistics and API keys. Runner processes use `runner_side` instead.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.admission_reads import AdmissionReads
from ebb.queue.connection import MAX_BLOCK_S
from ebb.queue.deployment_scripts import DeploymentScripts
from ebb.queue.gpus import SLEEPER_EXIT
from ebb.queue.node_caches import read_node_caches_async
from ebb.queue.priority import class_of_score, class_score_ranges, enqueued_ms_of_score
from ebb.queue.records import decode_runner, encode_runner, parse_cold_start
from ebb.queue.replies import reply_entries, reply_hash, reply_text, reply_texts
from ebb.queue.schema import (
    ApiKeyRecord,
    ColdStartRecord,
    DeploymentSpec,
    Failed,
    RunnerRecord,
    RunnerState,
    UsageRecord,
    encode,
    new_deployment_uid,
)
from ebb.queue.scripts import QueueScripts
from ebb.queue.turn_batch import TurnBatch
from ebb.queue.version_store import VersionStore

log = logging.getLogger(__name__)
_DELETED = encode(
    Failed(
        message="The deployment was deleted while the request waited in its queue; it "
        "never ran and costs nothing.",
        code="deployment_deleted",
    )
)
_LOST = encode(
    Failed(
        message="The runner serving this request stopped responding; the request was lost "
        "mid-generation. Retry it.",
        code="runner_lost",
        retryable=True,
    )
)


@dataclass(frozen=True)
class QueueSnapshot:
    depth: int
    oldest_wait_s: float  # of synchronous requests and job attempts alike
    job_depth: int = 0  # async job attempts waiting in the deployment's job queue
    # The class of the most urgent synchronous request waiting ("": none waits).
    head_priority: str = ""


class PlatformState:
    def __init__(
        self,
        client: aioredis.Redis,
        *,
        result_ttl_s: int = 600,
        short_client: aioredis.Redis | None = None,
        continuations: int = 0,
        continuation_window_s: float = 0.0,
    ):
        self.redis = client
        # How the reaper treats a lost runner's synchronous requests (see reap.lua): this
        # many continuations each, each claimable within the window.
        self._continuations = continuations
        self._continuation_window_ms = int(continuation_window_s * 1000)
        # For the reads admission makes before queueing (`connection.short_command_client`
        # where a process has one): they never block, so a small pool serves any burst.
        self.short_redis = short_client or client
        # One per process, so that concurrent requests for one unit share its reads.
        self.admission_reads = AdmissionReads(self.short_redis)
        # API key lookups of one event-loop turn share a round trip (every tenant request).
        self._key_lookups = TurnBatch(self.short_redis)
        self._scripts = QueueScripts(client)
        self._deployment_scripts = DeploymentScripts(client)
        self._result_ttl_s = result_ttl_s

    # --- deployments -----------------------------------------------------------------

    async def put_deployment(self, spec: DeploymentSpec, *, create_only: bool = False) -> bool:
        """Store `spec` with its uid. False: `create_only` and the name is taken, or the
        name now belongs to another deployment (another uid: the one `spec` was read from
        was deleted and the name created again). A create without a uid gets one."""
        if create_only and not spec.uid:
            spec = msgspec.structs.replace(spec, uid=new_deployment_uid())
        return await self._deployment_scripts.deployment_put(
            spec.name, msgspec.json.encode(spec), spec.uid, create_only=create_only
        )

    async def get_deployment(self, name: str) -> DeploymentSpec | None:
        raw = await self.redis.hget(keys.DEPLOYMENTS, name)
        return msgspec.json.decode(raw, type=DeploymentSpec) if raw else None

    async def list_deployments(self) -> list[DeploymentSpec]:
        raw = await self.redis.hgetall(keys.DEPLOYMENTS)
        specs = [msgspec.json.decode(v, type=DeploymentSpec) for v in raw.values()]
        return sorted(specs, key=lambda s: s.name)

    async def delete_deployment(self, name: str) -> bool:
        """Delete a deployment and everything bound to its name, in one atomic step: its
        uid goes with its record, so its runners claim nothing more (they drain), its
        sleepers are told to exit, and what is still queued for any of its versions fails
        with `deployment_deleted`; a deployment created later under the same name starts
        from nothing. False when there was none."""
        deleted, failed = await self._deployment_scripts.deployment_delete(
            name,
            failed_event=_DELETED,
            result_ttl_s=self._result_ttl_s,
            sleeper_exit=SLEEPER_EXIT,
        )
        if failed:
            log.info("queue: %s deleted with %d queued requests, failed", name, failed)
        return deleted

    async def serving_units(self) -> list[DeploymentSpec]:
        """What the controller scales: each version of each deployment that has traffic
        or may hold work, as its own unit (`ebb.queue.versions`). LoRA adapters are none:
        their base's runners serve them."""
        specs = [s for s in await self.list_deployments() if not s.base]
        return await VersionStore(self.redis).units(specs)

    async def serving_unit(self, unit: str) -> DeploymentSpec | None:
        """The spec of one serving unit (a deployment's version), None once deleted."""
        return await VersionStore(self.redis).unit_spec(unit)

    async def set_deployment_status(self, name: str, **fields: object) -> None:
        await self.redis.hset(
            keys.deployment_status(name), mapping={k: str(v) for k, v in fields.items()}
        )

    async def deployment_status(self, name: str) -> dict[str, str]:
        raw = reply_hash(await self.redis.hgetall(keys.deployment_status(name)))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def deployment_statuses(self, names: list[str]) -> dict[str, dict[str, str]]:
        """`deployment_status` of each name, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(keys.deployment_status(name))
        replies = await pipe.execute()
        return {
            name: {k.decode(): v.decode() for k, v in reply_hash(raw).items()}
            for name, raw in zip(names, replies, strict=True)
        }

    async def queue_snapshot(self, deployment: str) -> QueueSnapshot:
        """Its depths, and the wait of its oldest request (the oldest of each priority
        class's head: a queue's own head is its most urgent class's oldest)."""
        pipe = self.redis.pipeline(transaction=False)
        queue = keys.queue(deployment)
        pipe.zcard(queue)
        for low, high in class_score_ranges():
            pipe.zrangebyscore(queue, low, f"({high}", start=0, num=1, withscores=True)
        jobs = keys.job_queue(deployment)
        pipe.zcard(jobs)
        # Job attempts wait in classes too (job_submit.lua): the oldest of each class.
        for low, high in class_score_ranges():
            pipe.zrangebyscore(jobs, low, f"({high}", start=0, num=1, withscores=True)
        pipe.time()
        depth, *replies, (now_s, now_us) = await pipe.execute()
        classes = len(class_score_ranges())
        heads, job_depth, job_heads = replies[:classes], replies[classes], replies[classes + 1 :]
        enqueued_ms = [enqueued_ms_of_score(head[0][1]) for head in heads + job_heads if head]
        wait_s = 0.0
        if enqueued_ms:
            now_ms = int(now_s) * 1000 + int(now_us) / 1000
            wait_s = max(0.0, (now_ms - float(min(enqueued_ms))) / 1000)
        head = next((class_of_score(h[0][1]) for h in heads if h), "")
        return QueueSnapshot(
            depth=depth, oldest_wait_s=wait_s, job_depth=job_depth, head_priority=head
        )

    async def count_scale_up(self, deployment: str, count: int) -> None:
        await self.redis.hincrby(keys.SCALE_DECISIONS, f"{deployment}|up", count)

    async def scale_decisions(self) -> dict[tuple[str, str], int]:
        """{(deployment, "up" | "down"): count} since the platform's data began."""
        raw = reply_hash(await self.redis.hgetall(keys.SCALE_DECISIONS))
        result = {}
        for field, count in raw.items():
            deployment, _, direction = field.decode().rpartition("|")
            result[(deployment, direction)] = int(count)
        return result

    async def cold_starts_after(self, after_id: bytes) -> tuple[bytes, list[ColdStartRecord]]:
        """Cold-start records newer than `after_id`, and the id to resume from."""
        entries = reply_entries(
            await self.redis.xrange(keys.COLD_STARTS, min=b"(" + after_id, max="+")
        )
        if not entries:
            return after_id, []
        records = [msgspec.json.decode(f[b"r"], type=ColdStartRecord) for _, f in entries]
        return entries[-1][0].encode(), records

    async def cold_start_ms(self, deployment: str) -> dict[str, dict[str, float]]:
        return parse_cold_start(reply_hash(await self.redis.hgetall(keys.coldstart(deployment))))

    async def set_fork_server_state(self, state: str) -> None:
        await self.redis.set(keys.FORK_SERVER, state)

    async def fork_server_state(self) -> str:
        """off, starting, ready or down, as the controller last saw its fork server."""
        return reply_text((await self.redis.get(keys.FORK_SERVER)) or b"off")

    # --- runners and the pre-warmed pool -------------------------------------------------

    async def put_runner(self, record: RunnerRecord) -> None:
        pipe = self.redis.pipeline()
        fields = encode_runner(record)
        pipe.hset(keys.runner(record.runner_id), mapping=fields)  # type: ignore[arg-type]  # redis-py: Mapping[FieldT, ...] is invariant in its key
        pipe.sadd(keys.RUNNERS, record.runner_id)
        await pipe.execute()

    async def mark_runner_gone(self, runner_id: str, **fields: object) -> None:
        """Record a runner that died without saying so; it leaves the pool with it."""
        pipe = self.redis.pipeline()
        encoded = encode_runner(fields)
        pipe.hset(keys.runner(runner_id), mapping=encoded)  # type: ignore[arg-type]  # redis-py: Mapping[FieldT, ...] is invariant in its key
        pipe.srem(keys.STEMS, runner_id)
        await pipe.execute()
        # Its requests continue elsewhere at the next reap, not a lease TTL from now.
        await self._scripts.expire_leases_of(runner_id)

    async def drain_ready(self, runner_id: str, deployment: str) -> bool:
        """Ask a ready runner to drain (a scaling policy gives it back): it reads the
        request within seconds (`serve._SPEC_REFRESH_S`), stops claiming, finishes what it holds and
        exits; one holding nothing whose engine can sleep sleeps instead, as its own idle
        timeout would have had it do. A runner no longer serving ignores it."""
        await self.redis.hset(keys.runner(runner_id), keys.RUNNER_DRAIN_REQUESTED, deployment)
        return True

    async def runners(self) -> list[RunnerRecord]:
        ids = await self.redis.smembers(keys.RUNNERS)
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for runner_id in ids:
            pipe.hgetall(keys.runner(reply_text(runner_id)))
        records = [decode_runner(raw) for raw in await pipe.execute()]
        return sorted((r for r in records if r), key=lambda r: r.launched_ms)

    async def forget_runner(self, runner_id: str) -> None:
        pipe = self.redis.pipeline()
        pipe.srem(keys.RUNNERS, runner_id)
        pipe.srem(keys.STEMS, runner_id)
        pipe.hdel(keys.GPU_PLACEMENTS, runner_id)
        pipe.delete(
            keys.runner(runner_id),
            keys.runner_assignment(runner_id),
            keys.runner_cancels(runner_id),
            keys.runner_log(runner_id),
        )
        await pipe.execute()

    async def runner_log(self, runner_id: str) -> list[str]:
        return reply_texts(await self.redis.lrange(keys.runner_log(runner_id), 0, -1))

    async def take_stem(self, candidates: Sequence[str] | None = None) -> str | None:
        """Take one live pre-warmed runner out of the pool, never the same one twice: any
        (SPOP), or the first of `candidates` still in it (SREM, in their order); stems that
        died since they joined are dropped on the way."""
        if candidates is None:
            while (popped := await self.redis.spop(keys.STEMS)) is not None:
                if await self._still_prewarmed(reply_text(popped)):
                    return reply_text(popped)
            return None
        for runner_id in candidates:
            if await self.redis.srem(keys.STEMS, runner_id) and await self._still_prewarmed(
                runner_id
            ):
                return runner_id
        return None

    async def _still_prewarmed(self, runner_id: str) -> bool:
        state = await self.redis.hget(keys.runner(runner_id), "state")
        return state == RunnerState.PREWARMED.value.encode()

    async def node_caches(self) -> dict[str, frozenset[str]]:
        """{node: sources its weight cache holds}, as the nodes' prefetchers publish them."""
        return await read_node_caches_async(self.redis, now_ms=now_ms())

    async def take_sleeper(self, deployment: str, uid: str = "") -> str | None:
        """Take one of the deployment's sleeping runners to wake (SPOP: once each), one
        launched for the deployment of uid `uid` only: a sleeper of a deleted deployment
        of the same name is told to exit instead."""
        while (popped := await self.redis.spop(keys.sleepers(deployment))) is not None:
            runner_id = reply_text(popped)
            state, bound = await self.redis.hmget(
                keys.runner(runner_id), ["state", "deployment_uid"]
            )
            if state != RunnerState.SLEEPING.value.encode():
                continue
            if reply_text(bound or b"") == uid:
                return runner_id
            await self.redis.rpush(keys.runner_assignment(runner_id), SLEEPER_EXIT)
        return None

    async def wake_sleeper(self, runner_id: str, deployment: str, uid: str = "") -> None:
        """Hand a sleeping runner new work; until it is READY it counts as starting. A
        request to drain made before it slept (`drain_ready`) concerned it as it was then."""
        pipe = self.redis.pipeline()
        pipe.hset(keys.runner(runner_id), "woken_ms", int(time.time() * 1000))
        pipe.hdel(keys.runner(runner_id), keys.RUNNER_DRAIN_REQUESTED)
        await pipe.execute()
        await self.assign(runner_id, deployment, uid)

    async def assign(self, runner_id: str, deployment: str, uid: str = "") -> None:
        """Give a stem (or a woken sleeper) `deployment`, the one of uid `uid`: the runner
        serves that deployment only (it checks the uid when it reads the spec)."""
        pipe = self.redis.pipeline()
        pipe.hset(
            keys.runner(runner_id),
            mapping={
                "deployment": deployment,
                "deployment_uid": uid,
                "assigned_ms": int(time.time() * 1000),
            },
        )
        pipe.rpush(keys.runner_assignment(runner_id), deployment)
        await pipe.execute()

    # --- the controller's wake-up and the lease reaper -------------------------------------

    async def wait_for_wake(self, timeout_s: float) -> set[str]:
        """Deployment names that asked for attention, waiting up to timeout_s for the first."""
        first = await self.redis.blpop([keys.WAKE], timeout=min(timeout_s, MAX_BLOCK_S))
        if not first:
            return set()
        pipe = self.redis.pipeline()
        pipe.lrange(keys.WAKE, 0, -1)
        pipe.delete(keys.WAKE)
        rest, _ = await pipe.execute()
        return {reply_text(first[1]), *reply_texts(rest)}

    async def wake(self, deployment: str) -> None:
        await self.redis.rpush(keys.WAKE, deployment)

    async def reap_expired_leases(self, *, restart_grace_s: float = 0.0) -> list[str]:
        """Continue elsewhere, or fail, the requests whose runner stopped renewing their
        lease (see reap.lua); their ids.

        Leases are scored on the Redis clock, which ran on while Redis was down and no
        runner could renew anything: within `restart_grace_s` of a Redis start nothing
        is reaped, so runners that rode the outage out keep their requests."""
        if restart_grace_s > 0:
            server = await self.redis.info("server")
            if float(server.get("uptime_in_seconds", 0)) < restart_grace_s:
                return []
        return await self._scripts.reap(
            lost_event=_LOST,
            result_ttl_s=self._result_ttl_s,
            continuations=self._continuations,
            admission_window_ms=self._continuation_window_ms,
        )

    # --- API keys ----------------------------------------------------------------------

    async def create_api_key(self, secret: str, record: ApiKeyRecord) -> None:
        await self.redis.hset(keys.API_KEYS, _key_hash(secret), msgspec.json.encode(record))

    async def lookup_api_key(self, secret: str) -> ApiKeyRecord | None:
        raw = await self._key_lookups.execute("HGET", keys.API_KEYS, _key_hash(secret))
        return msgspec.json.decode(raw, type=ApiKeyRecord) if raw else None

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        raw = await self.redis.hgetall(keys.API_KEYS)
        records = [msgspec.json.decode(v, type=ApiKeyRecord) for v in raw.values()]
        return sorted(records, key=lambda r: r.created_at_s)

    async def revoke_api_key(self, key_id: str) -> bool:
        raw = await self.redis.hgetall(keys.API_KEYS)
        for digest, data in raw.items():
            record = msgspec.json.decode(data, type=ApiKeyRecord)
            if record.key_id == key_id and not record.revoked:
                record.revoked = True
                await self.redis.hset(keys.API_KEYS, digest, msgspec.json.encode(record))
                return True
        return False

    # --- usage -------------------------------------------------------------------------

    async def usage_records(self, since_s: float = 0.0) -> list[UsageRecord]:
        start = f"{int(since_s * 1000)}-0" if since_s else "-"
        entries = reply_entries(await self.redis.xrange(keys.USAGE, min=start, max="+"))
        return [msgspec.json.decode(fields[b"r"], type=UsageRecord) for _, fields in entries]

    async def usage_after(
        self, after_id: bytes, *, count: int = 10_000
    ) -> tuple[bytes, list[UsageRecord]]:
        """Up to `count` usage records newer than stream id `after_id` (b"0-0": from the
        start; b"<ms>-0": from that time on), and the id to resume from."""
        entries = reply_entries(
            await self.redis.xrange(keys.USAGE, min=b"(" + after_id, max="+", count=count)
        )
        if not entries:
            return after_id, []
        records = [msgspec.json.decode(f[b"r"], type=UsageRecord) for _, f in entries]
        return entries[-1][0].encode(), records

    async def memory(self) -> dict[str, int]:
        """Redis's memory as INFO reports it: used, peak and the configured limit (0: none)."""
        info = await self.redis.info("memory")
        return {
            "used_memory_bytes": int(info.get("used_memory", 0)),
            "used_memory_peak_bytes": int(info.get("used_memory_peak", 0)),
            "maxmemory_bytes": int(info.get("maxmemory", 0)),
        }

    async def ping(self) -> bool:
        return bool(await self.redis.ping())


def _key_hash(secret: str) -> str:
    # Keys are long random strings, so a plain SHA-256 is enough: no dictionary to attack.
    return hashlib.sha256(secret.encode()).hexdigest()


def now_ms() -> int:
    return int(time.time() * 1000)
