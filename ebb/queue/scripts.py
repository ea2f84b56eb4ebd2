"""The Lua scripts behind every multi-key state change of requests and runners, each
behind a typed call.

Each state change that must be atomic (enqueue, claim, withdraw, cancel, finish, reap,
drain, sleep) is one script; the header of each .lua file states its contract. Callers
never pass KEYS or ARGV: a wrapper here takes named, typed parameters, builds both lists
in the script's order (key names from `keys`) and converts the reply. The runner calls
its scripts on a blocking client (`RunnerScripts`); the frontdoor and the controller on
an asyncio one (`QueueScripts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from typing import Any, Literal, Protocol

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError

from ebb.queue import keys
from ebb.queue.claim_balance import BALANCE_SLACK
from ebb.queue.prefix import affinity_key
from ebb.queue.priority import score_offset_ms
from ebb.queue.replies import reply_bytes, reply_int, reply_list, reply_text, reply_texts
from ebb.queue.schema import WorkItem, encode
from ebb.queue.versions import public_name

# What Redis accepts as a script argument.
Arg = str | bytes | int | float


# Helpers every script shares (now_ms, waking runners and the controller), loaded first.
PRELUDE = "_prelude"


@cache
def lua_source(name: str) -> str:
    """lua/NAME.lua as Redis runs it: the prelude, then the script."""
    return _lua_file(PRELUDE) + _lua_file(name)


def _lua_file(name: str) -> str:
    return resources.files("ebb.queue").joinpath("lua", f"{name}.lua").read_text()


class _DirectScript(Script):
    """A Script called on its own client only (pipelines take EVALSHA with its `sha`).

    redis-py's `Script.__call__` first asks `isinstance(client, Pipeline)`, and Pipeline
    derives from a typing Protocol, whose isinstance check costs tens of microseconds:
    more than the rest of a call on the admission path."""

    def __call__(self, keys=None, args=None, client=None):  # type: ignore[no-untyped-def]  # redis-py's own signature
        keys = list(keys or [])
        call_args = (*keys, *(args or []))
        client = client or self.registered_client
        try:
            return client.evalsha(self.sha, len(keys), *call_args)
        except NoScriptError:  # Redis restarted (or flushed its scripts): load it again
            self.sha = client.script_load(self.script)
            return client.evalsha(self.sha, len(keys), *call_args)


class _DirectAsyncScript(AsyncScript):
    """`_DirectScript` on an asyncio client."""

    async def __call__(self, keys=None, args=None, client=None):  # type: ignore[no-untyped-def]  # redis-py's own signature
        keys = list(keys or [])
        call_args = (*keys, *(args or []))
        client = client or self.registered_client
        try:
            return await client.evalsha(self.sha, len(keys), *call_args)
        except NoScriptError:
            self.sha = await client.script_load(self.script)
            return await client.evalsha(self.sha, len(keys), *call_args)


class _BatchedAsyncScript(AsyncScript):
    """`_DirectAsyncScript` whose EVALSHA goes out with the other commands of its event
    loop's turn (`ebb.queue.turn_batch`)."""

    def __init__(self, client: aioredis.Redis, script: str, batch: TurnBatchLike):
        super().__init__(client, script)
        self._batch = batch

    async def __call__(self, keys=None, args=None, client=None):  # type: ignore[no-untyped-def]  # redis-py's own signature
        keys = list(keys or [])
        call_args = (*keys, *(args or []))
        try:
            return await self._batch.execute("EVALSHA", self.sha, len(keys), *call_args)
        except NoScriptError:
            self.sha = await self.registered_client.script_load(self.script)
            return await self.registered_client.evalsha(self.sha, len(keys), *call_args)


class TurnBatchLike(Protocol):
    async def execute(self, *command: Arg) -> Any: ...


def register(client: redis.Redis, name: str) -> Script:
    """lua/NAME.lua bound to a blocking client."""
    return _DirectScript(client, lua_source(name))


def register_async(
    client: aioredis.Redis, name: str, batch: TurnBatchLike | None = None
) -> AsyncScript:
    """lua/NAME.lua bound to an asyncio client; sent with the other commands of its
    loop's turn when `batch` is given."""
    if batch is not None:
        return _BatchedAsyncScript(client, lua_source(name), batch)
    return _DirectAsyncScript(client, lua_source(name))


class QueueScripts:
    """The request queue's scripts on an asyncio client (frontdoor, controller)."""

    def __init__(self, client: aioredis.Redis, batch: TurnBatchLike | None = None):
        """`batch`: the enqueue script joins its loop turn's pipeline (the frontdoor)."""
        self._enqueue = register_async(client, "enqueue", batch)
        self._withdraw = register_async(client, "withdraw")
        self._cancel = register_async(client, "cancel")
        self._reap = register_async(client, "reap")
        self._rerun_lost = register_async(client, "rerun_lost")
        self._expire_runner = register_async(client, "leases_expire_runner")

    async def enqueue(
        self,
        work: WorkItem,
        *,
        admission_window_ms: int,
        depth_limit: int,
        request_ttl_s: int,
        shed_depth: int = 0,
    ) -> int | Literal["full", "shed", "duplicate"]:
        """Queue `work` in its priority class: its admission deadline (ms), or why it was
        refused ('shed': `shed_depth` > 0 requests were already queued)."""
        dep = work.deployment
        reply = reply_list(
            await self._enqueue(
                keys=[
                    keys.queue(dep),
                    keys.request(work.request_id),
                    keys.queue_signal(dep),
                    keys.WAKE,
                    keys.claiming(dep),
                ],
                args=[
                    work.request_id,
                    encode(work),
                    dep,
                    admission_window_ms,
                    depth_limit,
                    request_ttl_s,
                    keys.SIGNAL_LIST_MAX,
                    affinity_key(work),
                    score_offset_ms(work.priority),
                    shed_depth,
                ],
            )
        )
        if reply_int(reply[0]):
            return reply_int(reply[1])
        why = reply_text(reply[1])
        return why if why in ("full", "shed") else "duplicate"  # type: ignore[return-value]  # narrowed by `in`

    async def withdraw(self, work: WorkItem, *, state: Literal["withdrawn", "cancelled"]) -> bool:
        """True when `work` was taken back before any runner claimed it."""
        return bool(
            reply_int(
                await self._withdraw(
                    keys=[keys.queue(work.deployment), keys.request(work.request_id)],
                    args=[work.request_id, state],
                )
            )
        )

    async def cancel(self, work: WorkItem) -> str:
        """'withdrawn', 'aborting' (its runner is asked to abort) or 'none' (finished)."""
        return reply_text(
            await self._cancel(
                keys=[keys.queue(work.deployment), keys.request(work.request_id)],
                args=[work.request_id, keys.RUNNER_CANCELS_PREFIX],
            )
        )

    async def rerun_lost(self, work: WorkItem, *, admission_window_ms: int) -> bool:
        """True when `work`, failed with runner_lost, was queued again."""
        dep = work.deployment
        return bool(
            reply_int(
                await self._rerun_lost(
                    keys=[
                        keys.queue(dep),
                        keys.request(work.request_id),
                        keys.queue_signal(dep),
                        keys.WAKE,
                    ],
                    args=[work.request_id, admission_window_ms, dep, keys.SIGNAL_LIST_MAX],
                )
            )
        )

    async def reap(
        self,
        *,
        lost_event: bytes,
        result_ttl_s: int,
        continuations: int = 0,
        admission_window_ms: int = 0,
    ) -> list[str]:
        """Every request whose lease expired: one with fewer than `continuations` behind
        it is queued again as a continuation (a synchronous one claimable within
        `admission_window_ms`), the others fail with `lost_event`; their ids."""
        return reply_texts(
            await self._reap(
                keys=[keys.LEASES, keys.WAKE, keys.JOBS_WAITING],
                args=[
                    keys.REQUEST_PREFIX,
                    keys.EVENTS_PREFIX,
                    lost_event,
                    result_ttl_s,
                    continuations,
                    admission_window_ms,
                    keys.QUEUE_PREFIX,
                    keys.QUEUE_SIGNAL_PREFIX,
                    keys.SIGNAL_LIST_MAX,
                    keys.JOB_QUEUE_PREFIX,
                ],
            )
        )

    async def expire_leases_of(self, runner_id: str) -> int:
        """Expire now the leases of what `runner_id` (known dead) held; how many."""
        return reply_int(
            await self._expire_runner(keys=[keys.LEASES], args=[keys.REQUEST_PREFIX, runner_id])
        )


class RunnerScripts:
    """The runner's scripts on its blocking client."""

    def __init__(self, client: redis.Redis):
        self._claim = register(client, "claim")
        self._finish = register(client, "finish")
        self._heartbeat = register(client, "heartbeat")
        self._engine_stall = register(client, "engine_stall")
        self._try_drain = register(client, "try_drain")
        self._try_sleep = register(client, "try_sleep")
        self._fold_ema = register(client, "fold_ema")
        self._job_yield = register(client, "job_yield")

    def claim(
        self,
        *,
        runner_id: str,
        deployment: str,
        max_count: int,
        max_jobs: int,
        lease_ttl_ms: int,
        claimed_event: bytes,
        deployment_uid: str,
        prefix_affinity_ms: int = 0,
        prefix_step_wait_ms: int = 0,
        critical_extra: int = 0,
        balance_wait_ms: int = 0,
    ) -> tuple[list[bytes], list[str], int, int, bool, set[str]]:
        """Claim up to `max_count` requests (at most `max_jobs` job attempts): the encoded
        work of each claimed one, the ids this runner was asked to abort, how many
        synchronous requests and job attempts are still queued, whether the
        deployment this runner was launched for (`deployment_uid`) is gone (then nothing
        was claimed), and the ids of the claimed that are continuations. With
        `prefix_affinity_ms`, a request another runner holds the prompt prefix of waits
        for it that long, or while that runner is inside the engine step it was in when
        the request came, up to `prefix_step_wait_ms` (see claim.lua). Once `max_count`
        were claimed, up to `critical_extra` critical requests more. With
        `balance_wait_ms`, a request is left that long for a live peer with more room
        (`claim_balance.leaves_for_peer`)."""
        claimed, cancelled, still_queued, jobs_queued, gone, continued = reply_list(
            self._claim(
                keys=[
                    keys.queue(deployment),
                    keys.LEASES,
                    keys.runner_cancels(runner_id),
                    keys.runner(runner_id),
                    keys.prefix_owners(deployment),
                    keys.job_queue(deployment),
                    keys.JOBS_WATCH,
                    keys.JOBS_SIGNAL,
                    keys.claiming(deployment),
                    keys.DEPLOYMENT_UIDS,
                    keys.claimers(deployment),
                ],
                args=[
                    runner_id,
                    max_count,
                    lease_ttl_ms,
                    keys.REQUEST_PREFIX,
                    keys.EVENTS_PREFIX,
                    claimed_event,
                    max_jobs,
                    keys.SIGNAL_LIST_MAX,
                    prefix_affinity_ms,
                    keys.CLAIM_SCAN_EXTRA,
                    keys.RUNNER_PREFIX,
                    keys.PREFIX_OWNERS_TTL_S,
                    keys.PREFIX_OWNERS_MAX,
                    keys.RUNNER_SIGNAL_PREFIX,
                    prefix_step_wait_ms,
                    keys.CLAIMING_TTL_MS,
                    public_name(deployment),
                    deployment_uid,
                    critical_extra,
                    balance_wait_ms,
                    BALANCE_SLACK,
                ],
            )
        )
        ids_and_work = reply_list(claimed)
        works = [reply_bytes(work) for work in ids_and_work[1::2]]
        return (
            works,
            reply_texts(cancelled),
            reply_int(still_queued),
            reply_int(jobs_queued),
            bool(reply_int(gone)),
            set(reply_texts(continued)),
        )

    def job_yield(
        self, *, runner_id: str, deployment: str, request_id: str, keep_output: bool = True
    ) -> bool:
        """Give a held job attempt back to the job queue (see job_yield.lua): to be
        continued from its output so far, or (not `keep_output`) to start over."""
        return bool(
            reply_int(
                self._job_yield(
                    keys=[
                        keys.request(request_id),
                        keys.events(request_id),
                        keys.LEASES,
                        keys.job_queue(deployment),
                        keys.queue_signal(deployment),
                        keys.JOBS_WAITING,
                    ],
                    args=[request_id, runner_id, keys.SIGNAL_LIST_MAX, int(keep_output)],
                )
            )
        )

    def finish(
        self,
        *,
        runner_id: str,
        request_id: str,
        state: str,
        event: bytes,
        prompt_tokens: int,
        completion_tokens: int,
        result_ttl_s: int,
        usage: bytes | None,
        pipe: redis.client.Pipeline | None = None,
    ) -> bool:
        """End a held request once, recording `usage` (when given) in the same step;
        False when it was not this runner's to finish. With `pipe`, the call is only
        queued on that pipeline (its reply comes with the pipeline's) and True returned."""
        script_keys: list[str] = [
            keys.request(request_id),
            keys.events(request_id),
            keys.LEASES,
            keys.USAGE,
        ]
        args: list[Arg] = [
            request_id,
            runner_id,
            state,
            event,
            prompt_tokens,
            completion_tokens,
            result_ttl_s,
            usage if usage is not None else "",
        ]
        if pipe is not None:
            # EVALSHA, not the Script: a pipeline holding Scripts first asks Redis whether
            # they are loaded, one more round trip. The caller retries a NOSCRIPT reply.
            pipe.evalsha(self._finish.sha, len(script_keys), *script_keys, *args)
            return True
        return bool(reply_int(self._finish(keys=script_keys, args=args)))

    def heartbeat(
        self,
        *,
        runner_id: str,
        lease_ttl_ms: int,
        held: Iterable[str],
        engine_steps: int,
        engine_busy_ms: int,
    ) -> None:
        """Prove liveness, extend the leases of the `held` request ids and record the
        engine's progress (see heartbeat.lua)."""
        self._heartbeat(
            keys=[keys.runner(runner_id), keys.LEASES],
            args=[lease_ttl_ms, engine_steps, engine_busy_ms, *held],
        )

    def engine_stall(
        self,
        *,
        runner_id: str,
        deployment: str,
        counter_field: str,
        error: str,
        held: Iterable[str],
    ) -> int:
        """Expire the `held` leases now, count the stall under `counter_field`, record the
        runner failed with `error` (see engine_stall.lua); the leases it expired."""
        return reply_int(
            self._engine_stall(
                keys=[
                    keys.runner(runner_id),
                    keys.LEASES,
                    keys.METRIC_COUNTERS,
                    keys.claiming(deployment),
                ],
                args=[counter_field, error, *held],
            )
        )

    def try_drain(self, *, runner_id: str, deployment: str) -> bool:
        """True when the runner is now draining (nothing queued for it)."""
        return bool(
            reply_int(
                self._try_drain(
                    keys=[
                        keys.queue(deployment),
                        keys.runner(runner_id),
                        keys.job_queue(deployment),
                        keys.claiming(deployment),
                    ]
                )
            )
        )

    def try_sleep(self, *, runner_id: str, deployment: str) -> bool:
        """True when the runner is now sleeping (nothing queued for it)."""
        return bool(
            reply_int(
                self._try_sleep(
                    keys=[
                        keys.queue(deployment),
                        keys.runner(runner_id),
                        keys.sleepers(deployment),
                        keys.job_queue(deployment),
                        keys.claiming(deployment),
                    ],
                    args=[runner_id],
                )
            )
        )

    def fold_ema(self, *, deployment: str, weight: float, values: Mapping[str, float]) -> None:
        """Fold `values` into the deployment's cold-start moving averages."""
        args: list[Arg] = [weight]
        for field, value in values.items():
            args += [field, value]
        self._fold_ema(keys=[keys.coldstart(deployment)], args=args)
