"""The runner's side of the queue: wait for work, claim, stream output, finish, heartbeat.

Blocking redis-py on purpose: the runner's loop thread alternates between engine steps
(CPU-bound, holding that thread) and short Redis round trips; an event loop would add
nothing but a hop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis

from ebb.queue import keys
from ebb.queue.continuation import OutputSoFar, output_so_far
from ebb.queue.gpu_records import GpuPlacement
from ebb.queue.gpus import read_placement
from ebb.queue.observations import (
    ADAPTER_LOADS,
    ENGINE_STALLS,
    RunnerStats,
    counter_field,
    report_runner_stats,
)
from ebb.queue.records import (
    COLD_START_EMA_WEIGHT,
    cold_start_field,
    decode_runner,
    encode_runner,
)
from ebb.queue.replies import reply_entries, reply_hash, reply_int, reply_text
from ebb.queue.schema import (
    Claimed,
    ColdStartRecord,
    DeploymentSpec,
    Progress,
    RequestEvent,
    RunnerRecord,
    RunnerState,
    UsageRecord,
    WorkItem,
    decode_event,
    decode_work,
    encode,
)
from ebb.queue.scripts import RunnerScripts
from ebb.queue.version_store import read_unit, read_unit_spec
from ebb.queue.versions import split_unit
from ebb.queue.work_news import WorkNews

# The runner's log tail kept in Redis for `ebb status` and the console.
_LOG_LINES_KEPT = 50


@dataclass(frozen=True)
class Ending:
    """How a held request ends: its final state and terminal event, and its counts."""

    work: WorkItem
    state: str
    event: RequestEvent
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float | None = None  # from its enqueueing to its first output, when it had one
    tpot_ms: float | None = None  # per output token after the first
    queue_ms: float | None = None  # from its enqueueing to its claim
    batch_size: float | None = None  # mean requests in the batch while it decoded


@dataclass(frozen=True)
class ClaimResult:
    claimed: list[WorkItem]
    cancelled: list[str]
    # Synchronous requests still queued after this claim for want of room (not those it
    # left for another runner: their prefix's, or one with more room).
    sync_waiting: int = 0
    # Job attempts still queued after it (for slots synchronous traffic leaves).
    jobs_waiting: int = 0
    # The deployment this runner was launched for is gone (deleted, perhaps created again
    # by someone else under its name): nothing was claimed, and nothing will be.
    deployment_gone: bool = False
    # The ids of the claimed that are continuations: their output so far is on their
    # events stream (`RunnerQueue.output_so_far`).
    continued: frozenset[str] = frozenset()

    @property
    def queues_empty(self) -> bool:
        """Nothing was left queued: until work is announced, another claim finds none."""
        return not (self.sync_waiting or self.jobs_waiting)


class RunnerQueue:
    def __init__(
        self,
        client: redis.Redis,
        runner_id: str,
        *,
        lease_ttl_s: float,
        result_ttl_s: int,
        record_usage: bool = True,
        prefix_affinity_ms: int = 0,
        prefix_step_wait_ms: int = 0,
        balance_wait_ms: int = 0,
    ):
        """`prefix_affinity_ms`: how long a request whose prompt prefix another runner
        served last may be left for that runner (0: claim strictly oldest first);
        `prefix_step_wait_ms`: how long in all while that runner has not claimed since the
        request came (it is inside an engine step); `balance_wait_ms`: how long a request
        may be left for a live peer of the deployment with more room (0: never; see
        claim_balance.py)."""
        self._redis = client
        self._record_usage = record_usage
        self._scripts = RunnerScripts(client)
        self.runner_id = runner_id
        self._lease_ttl_ms = int(lease_ttl_s * 1000)
        self._prefix_affinity_ms = prefix_affinity_ms
        self._prefix_step_wait_ms = prefix_step_wait_ms
        self._balance_wait_ms = balance_wait_ms
        self._result_ttl_s = result_ttl_s
        self._claimed_event = encode(Claimed(runner_id=runner_id))

    def placement(self) -> GpuPlacement | None:
        """The GPUs the controller reserved for this runner; None on CPU hosts."""
        return read_placement(self._redis, self.runner_id)

    # --- registration and lifecycle -------------------------------------------------

    def register(self, record: RunnerRecord) -> None:
        pipe = self._redis.pipeline()
        fields = encode_runner(record)
        pipe.hset(keys.runner(self.runner_id), mapping=fields)  # type: ignore[arg-type]  # redis-py: Mapping[FieldT, ...] is invariant in its key
        pipe.sadd(keys.RUNNERS, self.runner_id)
        pipe.execute()

    def set_fields(self, **fields: object) -> None:
        encoded = encode_runner(fields)
        self._redis.hset(keys.runner(self.runner_id), mapping=encoded)  # type: ignore[arg-type]  # redis-py: Mapping[FieldT, ...] is invariant in its key

    def record(self) -> RunnerRecord | None:
        return decode_runner(reply_hash(self._redis.hgetall(keys.runner(self.runner_id))))

    def offer_as_stem(self) -> None:
        self._redis.sadd(keys.STEMS, self.runner_id)

    def wait_for_assignment(self, timeout_s: float) -> str | None:
        reply = self._redis.blpop([keys.runner_assignment(self.runner_id)], timeout=timeout_s)
        return reply_text(reply[1]) if reply else None

    def withdraw_stem(self) -> bool:
        """Leave the pool; False when the controller already picked this stem."""
        return bool(self._redis.srem(keys.STEMS, self.runner_id))

    def deployment(self, name: str) -> DeploymentSpec | None:
        """The spec of the unit this runner serves (a deployment's version)."""
        return read_unit_spec(self._redis, name)

    def unit(self, name: str) -> tuple[DeploymentSpec | None, str]:
        """The unit's spec and its version's sealed environment, read in one snapshot (a
        delete and re-create between two reads cannot pair one owner's spec with the
        other's secrets)."""
        return read_unit(self._redis, name)

    def bound_uid(self) -> str:
        """The uid of the deployment the controller launched or assigned this runner for
        ("" when it did not say: a record from before uids)."""
        return reply_text(self._redis.hget(keys.runner(self.runner_id), "deployment_uid") or b"")

    def append_log(self, line: str) -> None:
        pipe = self._redis.pipeline()
        pipe.rpush(keys.runner_log(self.runner_id), line)
        pipe.ltrim(keys.runner_log(self.runner_id), -_LOG_LINES_KEPT, -1)
        pipe.execute()

    def try_drain(self, deployment: str) -> bool:
        return self._scripts.try_drain(runner_id=self.runner_id, deployment=deployment)

    # --- work ------------------------------------------------------------------------

    def wait_for_work(self, deployment: str, timeout_s: float) -> None:
        """Block until a request was queued for `deployment` (or timeout_s passed)."""
        self._redis.blpop(
            [keys.queue_signal(deployment), keys.runner_signal(self.runner_id)],
            timeout=max(timeout_s, 0.01),
        )

    def work_news(self, deployment: str, clock: Callable[[], float] = time.monotonic) -> WorkNews:
        """A listener on the channels that announce work for this runner (see work_news.py)."""
        own = keys.runner_signal(self.runner_id)
        channels = [keys.queue_signal(deployment), own, keys.runner_cancels(self.runner_id)]
        return WorkNews(self._redis, channels, own_channel=own, clock=clock)

    def claim(
        self,
        deployment: str,
        max_count: int,
        max_jobs: int = 0,
        *,
        uid: str = "",
        critical_extra: int = 0,
    ) -> ClaimResult:
        """Claim up to `max_count` requests; async job attempts fill at most `max_jobs` of
        those slots, and only when no synchronous request is waiting. Only while the
        deployment's uid is still `uid`, the one this runner serves (see claim.lua). With
        those slots filled, up to `critical_extra` critical requests more."""
        claimed, cancelled, sync_waiting, jobs_waiting, gone, continued = self._scripts.claim(
            runner_id=self.runner_id,
            deployment=deployment,
            max_count=max_count,
            max_jobs=max_jobs,
            lease_ttl_ms=self._lease_ttl_ms,
            claimed_event=self._claimed_event,
            deployment_uid=uid,
            prefix_affinity_ms=self._prefix_affinity_ms,
            prefix_step_wait_ms=self._prefix_step_wait_ms,
            critical_extra=critical_extra,
            balance_wait_ms=self._balance_wait_ms,
        )
        works = [decode_work(work) for work in claimed]
        return ClaimResult(works, cancelled, sync_waiting, jobs_waiting, gone, frozenset(continued))

    def output_so_far(self, request_id: str) -> OutputSoFar:
        """What a continuation replays: the output its stream holds (see continuation.py)."""
        entries = reply_entries(self._redis.xrange(keys.events(request_id)))
        return output_so_far([decode_event(fields[b"e"]) for _, fields in entries])

    def yield_job(self, deployment: str, request_id: str, *, keep_output: bool = True) -> bool:
        """Give back a job attempt this runner holds, for a synchronous request to have its
        slot: queued again, to be continued from its output so far (or, not
        `keep_output`, to start over), nothing billed yet; False when it was no longer
        this runner's (or a cancel of it waits)."""
        return self._scripts.job_yield(
            runner_id=self.runner_id,
            deployment=deployment,
            request_id=request_id,
            keep_output=keep_output,
        )

    def publish(
        self, progress: dict[str, Progress], endings: list[Ending] | None = None
    ) -> list[bool]:
        """Every request's output of one engine step, then the requests it completed
        (`finish_many`), in one round trip; whether each ending was this runner's."""
        endings = endings or []
        if not progress and not endings:
            return []
        if not progress and len(endings) == 1:
            done = [self._finish(endings[0], pipe=None)]
            self._signal_jobs(done, endings)
            return done
        pipe = self._redis.pipeline(transaction=False)
        for request_id, event in progress.items():
            pipe.xadd(keys.events(request_id), {"e": encode(event)})
        for ending in endings:
            self._finish(ending, pipe=pipe)
        replies = pipe.execute(raise_on_error=False)
        for reply in replies[: len(progress)]:
            if isinstance(reply, Exception):
                raise reply
        done = []
        for ending, reply in zip(endings, replies[len(progress) :], strict=True):
            if isinstance(reply, redis.exceptions.NoScriptError):
                done.append(self._finish(ending, pipe=None))  # loads it; it did not run
            elif isinstance(reply, Exception):
                raise reply
            else:
                done.append(bool(reply_int(reply)))
        self._signal_jobs(done, endings)
        return done

    def finish(
        self,
        work: WorkItem,
        *,
        state: str,
        event: RequestEvent,
        prompt_tokens: int,
        completion_tokens: int,
        ttft_ms: float | None = None,
    ) -> bool:
        """End a held request once; usage is recorded in the same atomic step."""
        return self.finish_many(
            [Ending(work, state, event, prompt_tokens, completion_tokens, ttft_ms)]
        )[0]

    def finish_many(self, endings: list[Ending]) -> list[bool]:
        """`finish` each of `endings`, in one round trip (an engine step that completes
        many requests costs one, not one each); whether each was this runner's to
        finish, in order."""
        return self.publish({}, endings)

    def _signal_jobs(self, done: list[bool], endings: list[Ending]) -> None:
        if any(ok and e.work.job_id for ok, e in zip(done, endings, strict=True)):
            # A hint only: the collector also looks at every claimed job periodically.
            pipe = self._redis.pipeline(transaction=False)
            pipe.rpush(keys.JOBS_SIGNAL, "1")
            pipe.ltrim(keys.JOBS_SIGNAL, -keys.SIGNAL_LIST_MAX, -1)
            pipe.execute()

    def _finish(self, ending: Ending, pipe: redis.client.Pipeline | None) -> bool:
        work = ending.work
        deployment, version = split_unit(work.deployment)
        base = ""
        if work.adapter is not None:  # billed to the adapter, on its own line
            base, (deployment, version) = deployment, split_unit(work.adapter.name)
        usage = UsageRecord(
            base=base,
            request_id=work.request_id,
            # Billed under the public name, so `ebb usage` sums a deployment's versions.
            deployment=deployment,
            version=version,
            ttft_ms=ending.ttft_ms,
            tpot_ms=ending.tpot_ms,
            queue_ms=ending.queue_ms,
            batch_size=ending.batch_size,
            tenant=work.tenant,
            prompt_tokens=ending.prompt_tokens,
            completion_tokens=ending.completion_tokens,
            state=ending.state,
            runner_id=self.runner_id,
            finished_at_s=time.time(),
            key_id=work.key_id,
            price_per_1m_input_tokens_micros=work.price_per_1m_input_tokens_micros,
            price_per_1m_output_tokens_micros=work.price_per_1m_output_tokens_micros,
        )
        return self._scripts.finish(
            runner_id=self.runner_id,
            request_id=work.request_id,
            state=ending.state,
            event=encode(ending.event),
            prompt_tokens=ending.prompt_tokens,
            completion_tokens=ending.completion_tokens,
            # A job's attempt waits for the webhooks worker to collect its result.
            result_ttl_s=keys.JOB_ATTEMPT_TTL_S if work.job_id else self._result_ttl_s,
            usage=encode(usage) if self._record_usage else None,
            pipe=pipe,
        )

    def heartbeat(
        self, held_request_ids: Iterable[str], *, engine_steps: int = 0, engine_busy_ms: int = 0
    ) -> None:
        """Prove liveness, extend the leases of what this runner holds, and say how its
        engine progresses: steps so far, and how long the call in progress has run."""
        self._scripts.heartbeat(
            runner_id=self.runner_id,
            lease_ttl_ms=self._lease_ttl_ms,
            held=held_request_ids,
            engine_steps=engine_steps,
            engine_busy_ms=engine_busy_ms,
        )

    def record_engine_stall(
        self, deployment: str, held_request_ids: Iterable[str], error: str
    ) -> int:
        """This runner's engine stalled and the runner is about to kill itself: expire
        the leases of what it holds now (the reaper's next pass takes them as a lost
        runner's), count the stall for `deployment` and record the runner failed with
        `error`, in one step. Returns the leases it expired."""
        return self._scripts.engine_stall(
            runner_id=self.runner_id,
            deployment=deployment,
            counter_field=counter_field(ENGINE_STALLS, (deployment,)),
            error=error,
            held=held_request_ids,
        )

    def leave_pool(self) -> None:
        self._redis.srem(keys.STEMS, self.runner_id)

    def adapter_loaded(self, adapter: str, base: str) -> None:
        """LoRA adapter deployment `adapter` was loaded into this runner of `base` for a
        request (a cold load, counted): whatever failure its status showed is over."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.hincrbyfloat(keys.METRIC_COUNTERS, counter_field(ADAPTER_LOADS, (adapter, base)), 1)
        pipe.hset(keys.deployment_status(adapter), "error", "")
        pipe.execute()

    def adapter_failed(self, adapter: str, error: str) -> None:
        """Adapter `adapter` could not be served here: its deployment shows as failing,
        with the reason, until a runner loads it."""
        self._redis.hset(keys.deployment_status(adapter), "error", error)

    def stop_claiming(self, deployment: str) -> None:
        """This runner claims no more: the next request queued for `deployment` wakes the
        controller (another runner that still claims sets the marker again, see claim.lua)."""
        self._redis.delete(keys.claiming(deployment))

    def try_sleep(self, deployment: str) -> bool:
        return self._scripts.try_sleep(runner_id=self.runner_id, deployment=deployment)

    def leave_sleepers(self, deployment: str) -> bool:
        """Stop being wakeable; False when the controller already took this sleeper."""
        return bool(self._redis.srem(keys.sleepers(deployment), self.runner_id))

    def record_cold_start(self, deployment: str, tier: str, phases_ms: dict[str, float]) -> None:
        """Fold this start's phase times into the deployment's moving averages (for
        Retry-After) and append it to the cold-start stream (for the metrics histogram)."""
        self._scripts.fold_ema(
            deployment=deployment,
            weight=COLD_START_EMA_WEIGHT,
            values={cold_start_field(tier, phase): ms for phase, ms in phases_ms.items()},
        )
        record = ColdStartRecord(deployment=deployment, tier=tier, phases_ms=phases_ms)
        self._redis.xadd(
            keys.COLD_STARTS,
            {"r": encode(record)},
            maxlen=keys.COLD_STARTS_MAX,
            approximate=True,
        )

    def report_stats(self, stats: RunnerStats) -> None:
        """Publish the engine's latest figures for /metrics (they expire with the runner)."""
        report_runner_stats(self._redis, stats)

    def drain_requested(self) -> bool:
        """Whether the controller asked this runner to drain (`PlatformState.drain_ready`)."""
        field = keys.RUNNER_DRAIN_REQUESTED
        return bool(self._redis.hexists(keys.runner(self.runner_id), field))

    def count_scale_down(self, deployment: str) -> None:
        self._redis.hincrby(keys.SCALE_DECISIONS, f"{deployment}|down", 1)

    def serving_runner_count(self, deployment: str) -> int:
        """Runners of `deployment` that are serving or about to (not draining, not gone)."""
        ids = self._redis.smembers(keys.RUNNERS)
        pipe = self._redis.pipeline(transaction=False)
        for runner_id in ids:
            pipe.hmget(keys.runner(reply_text(runner_id)), "deployment", "state")
        count = 0
        for dep, state in pipe.execute():
            if dep and dep.decode() == deployment and state:
                count += RunnerState(state.decode()).will_serve
        return count
