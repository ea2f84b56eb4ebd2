"""The job collector: turns what runners did with job attempts into job outcomes and events.

Runners treat a job attempt like any request (claim, stream events, finish once); the
reaper fails an attempt whose runner went silent. Each pass, in order:
  1. expire jobs still queued past their TTL deadline;
  2. for every watched job (claimed attempts, settled jobs with events to announce):
     a. claimed -> mark the job running;
     b. finished -> build the OpenAI response (chat, completion or embeddings list)
        from the attempt's events: succeeded;
     c. failed and retryable (runner lost, engine broke) with attempts left -> queue the
        next attempt; otherwise failed with the reason; cancelled -> cancelled;
     d. announce the job's new events (one delivery each for the subscribed ones), and
        stop watching it once it is settled and announced.
All decisions are read from Redis and applied by scripts conditioned on the job's current
attempt, so a pass interrupted anywhere (a crash, a Redis restart) is simply redone by
the next one, and several collectors can run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

import msgspec
from redis.exceptions import RedisError

from ebb.config import Settings
from ebb.openai.response_builder import (
    EMBEDDINGS_ENDPOINT,
    EndpointKind,
    ResponseBuilder,
    embedding_response,
    embedding_vectors,
    usage,
)
from ebb.queue import observations
from ebb.queue.budgets import BudgetStore
from ebb.queue.delivery_store import delivery_record_ttl_s
from ebb.queue.deployment_condition import waiting_for
from ebb.queue.job_schema import (
    JobErrorInfo,
    JobEvent,
    JobRecord,
    JobStatus,
    attempt_request_id,
)
from ebb.queue.job_store import Announcement, JobStore
from ebb.queue.platform import PlatformState
from ebb.queue.ratelimits import RateLimitStore
from ebb.queue.schema import Failed, Finished, Progress
from ebb.webhooks.job_budgets import settle_job_budget
from ebb.webhooks.job_limits import give_back_unused
from ebb.webhooks.views import event_body

log = logging.getLogger(__name__)

# Jobs expired per pass; the rest wait for the next one.
_EXPIRE_BATCH = 256
# Error codes of attempts that another attempt may fix (the work itself was fine).
_RETRYABLE_CODES = frozenset({"runner_lost", "engine_error"})


def new_webhook_id() -> str:
    return "msg_" + uuid.uuid4().hex


class JobCollector:
    def __init__(
        self, store: JobStore, settings: Settings, ratelimits: RateLimitStore | None = None
    ):
        self._store = store
        self._state = PlatformState(store.redis)
        # Settles each job's rate-limit reservation once it ends (None: not this collector's).
        self._ratelimits = ratelimits
        # And its spend-cap reservation, with them (job_budgets).
        self._budgets = (
            BudgetStore(
                store.redis,
                delivery_ttl_s=delivery_record_ttl_s(
                    settings.webhook_give_up_s, settings.job_retention_s
                ),
            )
            if ratelimits is not None
            else None
        )
        self._settings = settings
        self._delivery_ttl_s = delivery_record_ttl_s(
            settings.webhook_give_up_s, settings.job_retention_s
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Pass after pass until `stop`; a runner claiming or finishing a job attempt wakes
        the next pass at once, the poll period bounds the wait otherwise."""
        log.info("jobs: collector up (poll %.2fs)", self._settings.job_poll_s)
        while not stop.is_set():
            try:
                await self.pass_once()
                await self._store.wait_for_activity(self._settings.job_poll_s)
            except Exception:
                # Redis restarting or a bug in one job: log, breathe, and go on.
                log.exception("jobs: collector pass failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        # One last pass collects what runners finished while the platform was stopping.
        with contextlib.suppress(Exception):
            await self.pass_once()

    async def pass_once(self) -> None:
        for job_id in await self._store.past_deadline(_EXPIRE_BATCH):
            await self._expire(job_id)
        # Two round trips read every watched job and its attempt's state; only the jobs
        # with something to do cost more.
        records = [r for r in await self._store.get_many(await self._store.watched()) if r]
        states = await self._store.attempt_states([r.request_id for r in records])
        for record, state in zip(records, states, strict=True):
            if _needs_look(record, state):
                await self.look_at(record)

    async def look_at(self, record: JobRecord) -> None:
        try:
            if not record.status.is_terminal and await self._advance(record):
                record = await self._store.get(record.job_id) or record
            await self._announce(record)
        except RedisError:
            raise  # the whole pass waits for Redis
        except Exception as e:
            # One job that cannot be collected must not stall every other: it fails with
            # the reason, and is announced like any failed job on the next pass.
            log.exception("jobs: %s could not be collected", record.job_id)
            if not record.status.is_terminal:
                error = JobErrorInfo("internal", f"The job's result could not be read: {e}")
                await self._settle(record, {}, JobStatus.FAILED, error)

    async def _expire(self, job_id: str) -> None:
        record = await self._store.get(job_id)
        ttl_s = (record.expires_ms - record.created_ms) / 1000 if record else 0
        condition = await self._waiting_for(record) if record else ""
        waited = f", waiting for {condition}" if condition else ""
        error = JobErrorInfo(
            "expired",
            f"No runner started the job within its ttl_s ({ttl_s:g}s{waited}); it never "
            "ran and costs nothing. Submit it again, with a longer ttl_s if the model is busy.",
        )
        if await self._store.expire(job_id, error) == "expired":
            log.info("jobs: %s expired in the queue", job_id)
            deployment = record.deployment if record else ""
            await observations.count_async(
                self._store.redis, observations.JOBS, (deployment, "expired")
            )
            if record is not None and self._ratelimits is not None:
                await give_back_unused(self._ratelimits, record, ran=False)
            if record is not None and self._budgets is not None:
                await settle_job_budget(self._budgets, record, ran=False)

    async def _waiting_for(self, record: JobRecord) -> str:
        """What the job waited on: what it was parked for, else its deployment's state."""
        if record.waiting_for:
            return record.waiting_for
        return waiting_for(await self._state.deployment_status(record.work.deployment))

    # --- 2a-c: follow the current attempt ------------------------------------------------

    async def _advance(self, record: JobRecord) -> bool:
        """Apply what the current attempt did; True when the job changed."""
        attempt = await self._store.attempt_state(record.request_id)
        state = attempt.get("state")
        if state == "claimed":
            if record.status is JobStatus.RUNNING:
                return False
            return await self._store.update(
                record.job_id, record.request_id, status=JobStatus.RUNNING, **_start(attempt)
            )
        if state == "finished":
            return await self._succeed(record, attempt)
        if state == "cancelled":
            return await self._settle(record, attempt, JobStatus.CANCELLED, None)
        if state == "failed":
            return await self._after_failure(record, attempt)
        if state == "expired":
            return False  # its TTL deadline passed in the queue: step 1 settles it
        if state is None:
            error = JobErrorInfo("lost", "The job's attempt record disappeared.")
            return await self._settle(record, attempt, JobStatus.FAILED, error)
        return False  # queued: a runner will claim it

    async def _succeed(self, record: JobRecord, attempt: dict[str, str]) -> bool:
        if record.endpoint == EMBEDDINGS_ENDPOINT:
            return await self._succeed_embedding(record, attempt)
        builder = ResponseBuilder(
            EndpointKind.of_job_endpoint(record.endpoint),
            request_id=record.job_id,
            model=record.deployment,
            created_s=record.created_ms // 1000,
            n=record.work.sampling.n,
            logprobs=record.work.sampling.logprobs is not None,
            tools=record.tools,
        )
        for event in await self._store.attempt_events(record.request_id):
            if isinstance(event, Progress):
                builder.add(event)
            elif isinstance(event, Finished):
                return await self._settle(
                    record,
                    attempt,
                    JobStatus.SUCCEEDED,
                    None,
                    result=builder.response(event),
                    usage=usage(event),
                )
        error = JobErrorInfo("lost", "The job's attempt finished without its output.")
        return await self._settle(record, attempt, JobStatus.FAILED, error)

    async def _succeed_embedding(self, record: JobRecord, attempt: dict[str, str]) -> bool:
        events = await self._store.attempt_events(record.request_id)
        finished = next((e for e in events if isinstance(e, Finished)), None)
        inputs = len(record.work.sampling.embed_input_lengths) or 1
        progress = [e for e in events if isinstance(e, Progress)]
        vectors = embedding_vectors(progress, inputs) if finished is not None else None
        if finished is None or vectors is None:
            error = JobErrorInfo("lost", "The job's attempt finished without its vectors.")
            return await self._settle(record, attempt, JobStatus.FAILED, error)
        result = embedding_response(
            vectors,
            model=record.deployment,
            prompt_tokens=finished.prompt_tokens,
            encoding_format=record.encoding_format,
        )
        return await self._settle(
            record, attempt, JobStatus.SUCCEEDED, None, result=result, usage=usage(finished)
        )

    async def _after_failure(self, record: JobRecord, attempt: dict[str, str]) -> bool:
        error, retryable = await self._failure(record.request_id, attempt)
        if record.cancel_requested:
            return await self._settle(record, attempt, JobStatus.CANCELLED, None)
        if retryable and record.attempt < record.max_attempts:
            work = msgspec.structs.replace(
                record.work, request_id=attempt_request_id(record.job_id, record.attempt + 1)
            )
            outcome = await self._store.requeue(record, work, error)
            if outcome == 1:
                log.warning(
                    "jobs: %s attempt %d ended (%s); queued attempt %d",
                    record.job_id,
                    record.attempt,
                    error.code,
                    record.attempt + 1,
                )
                await self._store.release_attempt(record.request_id)
                return True
            if outcome == 0:
                return False
            return await self._settle(record, attempt, JobStatus.CANCELLED, None)
        if retryable:
            error = JobErrorInfo(
                error.code,
                f"The job failed {record.attempt} times; the last attempt: {error.message}",
            )
        return await self._settle(record, attempt, JobStatus.FAILED, error)

    async def _failure(self, request_id: str, attempt: dict[str, str]) -> tuple[JobErrorInfo, bool]:
        """Why an attempt failed, and whether another attempt may succeed."""
        events = await self._store.attempt_events(request_id)
        failed = next((e for e in reversed(events) if isinstance(e, Failed)), None)
        if failed is None:
            code = attempt.get("error") or "lost"
            failed = Failed(message="The runner running the job was lost.", code=code)
        retryable = failed.retryable or failed.code in _RETRYABLE_CODES
        return JobErrorInfo(failed.code, failed.message), retryable

    async def _settle(
        self,
        record: JobRecord,
        attempt: dict[str, str],
        status: JobStatus,
        error: JobErrorInfo | None,
        **outcome: object,
    ) -> bool:
        if "usage" not in outcome and "prompt_tokens" in attempt:
            # What the attempt generated before it ended, as billed.
            outcome["usage"] = _usage(attempt)
        done = await self._store.update(
            record.job_id,
            record.request_id,
            status=status,
            finished_ms=int(attempt.get("finished_ms") or 0) or int(time.time() * 1000),
            error=error,
            **_start(attempt),
            **outcome,
        )
        if done:
            log.info("jobs: %s %s after %d attempt(s)", record.job_id, status, record.attempt)
            await observations.count_async(
                self._store.redis, observations.JOBS, (record.deployment, str(status))
            )
            await self._store.release_attempt(record.request_id)
            if self._ratelimits is not None:
                used = outcome.get("usage") or {}
                ran = bool(record.started_ms or attempt.get("claimed_ms"))
                total = used.get("total_tokens", 0) if isinstance(used, dict) else 0
                await give_back_unused(self._ratelimits, record, ran=ran, used_tokens=total)
            if self._budgets is not None:
                ran = bool(record.started_ms or attempt.get("claimed_ms"))
                await settle_job_budget(self._budgets, record, ran=ran, usage=outcome.get("usage"))
        return done

    # --- 2d: events ------------------------------------------------------------------

    async def _announce(self, record: JobRecord) -> None:
        due: list[JobEvent] = []
        if record.started_ms and JobEvent.STARTED not in record.announced:
            due.append(JobEvent.STARTED)
        if record.status.is_terminal:
            ending = JobEvent.ending(record.status)
            if ending not in record.announced:
                due.append(ending)
        if not due and not record.status.is_terminal:
            return
        subscribed = set(record.webhook_events) if record.webhook_url else set()
        announcements = [
            Announcement(event, new_webhook_id(), event_body(event, record))
            if event in subscribed
            else Announcement(event, "-", "")
            for event in due
        ]
        created = await self._store.announce(
            record, announcements, delivery_ttl_s=self._delivery_ttl_s
        )
        if created:
            log.info("jobs: %s announced %d event(s)", record.job_id, created)


def _needs_look(record: JobRecord, attempt_state: str | None) -> bool:
    """Whether a watched job may have moved on: anything but a running attempt whose
    start was already recorded and announced."""
    running = attempt_state == "claimed" and record.status is JobStatus.RUNNING
    return not running or JobEvent.STARTED not in record.announced


def _start(attempt: dict[str, str]) -> dict[str, object]:
    """The attempt's claim: when it started and on which runner."""
    if not attempt.get("claimed_ms"):
        return {}
    return {"started_ms": int(attempt["claimed_ms"]), "runner_id": attempt.get("runner", "")}


def _usage(attempt: dict[str, str]) -> dict[str, int]:
    prompt = int(attempt.get("prompt_tokens") or 0)
    completion = int(attempt.get("completion_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
