"""The delivery worker: sends due webhook deliveries, signed, and schedules the retries.

Each pass takes the deliveries that are due (each under an in-flight lease in Redis, see
delivery_store) and starts one attempt per delivery:
  1. check the URL again and pin the connection to the checked address (ssrf);
  2. wait for a slot of the receiving endpoint (at most N attempts in flight per endpoint);
  3. POST the frozen body with Standard Webhooks headers, signed with the tenant's
     current secret (and the previous one during a rotation's overlap), 10 s timeout,
     no redirects;
  4. record the attempt (status, latency, error) and either mark the delivery delivered
     (any 2xx), schedule the next attempt with backoff and jitter, or give up after the
     retry period.
Nothing about the schedule lives only in this process: a worker killed at any point
leaves every delivery due or leased in Redis, and the next worker sends it. A receiver
may therefore see an event twice, always under the same webhook-id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from collections import Counter

import httpx
from opentelemetry.context import Context

from ebb import tracing
from ebb.config import Settings
from ebb.queue.delivery_store import DeliveryStore
from ebb.queue.job_schema import DeliveryAttempt, DeliveryRecord, JobEvent
from ebb.queue.webhook_secrets import WebhookSecrets
from ebb.webhooks.retry import RetryPolicy
from ebb.webhooks.signing import new_secret, webhook_headers
from ebb.webhooks.ssrf import UnsafeUrl, parse_url, resolve_target

log = logging.getLogger(__name__)

# Attempts one worker has in flight at most (waiting for an endpoint slot included).
MAX_IN_FLIGHT = 256
# The idle loop re-checks the schedule at least this often (retries become due by time).
_IDLE_CHECK_S = 0.5
# Attempts one worker takes on per endpoint slot; more wait in Redis, due again shortly.
_BACKLOG_PER_SLOT = 4
_DEFER_MS = 1000
USER_AGENT = "ebb-webhooks/0.1"


def new_owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Deliverer:
    def __init__(
        self,
        store: DeliveryStore,
        secrets: WebhookSecrets,
        settings: Settings,
        http: httpx.AsyncClient,
        *,
        owner: str | None = None,
    ):
        self._store = store
        self._secrets = secrets
        self._settings = settings
        self._http = http
        self.owner = owner or new_owner_id()
        self._policy = RetryPolicy(
            base_s=settings.webhook_retry_base_s,
            max_delay_s=settings.webhook_retry_max_delay_s,
            give_up_s=settings.webhook_give_up_s,
        )
        self._allowed = settings.webhook_allowed_networks
        # An attempt holds its lease through the endpoint wait and the request itself;
        # it is renewed every quarter lease while in flight.
        self._lease_ms = int((settings.webhook_timeout_s * 3 + 30) * 1000)
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        self._job_tails: dict[str, asyncio.Task[None]] = {}  # each job's last attempt in flight
        self._backlog: Counter[str] = Counter()  # attempts in flight per endpoint
        self._backlog_max = settings.webhook_endpoint_concurrency * _BACKLOG_PER_SLOT

    async def run(self, stop: asyncio.Event) -> None:
        log.info("webhooks: delivery worker %s up", self.owner)
        renewer = asyncio.create_task(self._renew_leases(stop))
        while not stop.is_set():
            try:
                await self.dispatch_due()
                wait_s = await self._store.seconds_to_next_due()
                await self._store.wait_for_new(min(wait_s or _IDLE_CHECK_S, _IDLE_CHECK_S))
            except Exception:
                log.exception("webhooks: delivery pass failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        renewer.cancel()
        await self.drain(grace_s=self._settings.webhook_timeout_s + 1)

    async def dispatch_due(self) -> int:
        """Start an attempt for every due delivery (up to the in-flight cap)."""
        free = MAX_IN_FLIGHT - len(self._in_flight)
        if free <= 0:
            return 0
        records = await self._store.claim_due(free, lease_ms=self._lease_ms, owner=self.owner)
        # A job's events go out in the order they happened (job.started first); retries
        # of an earlier event do not hold back later ones.
        records.sort(key=lambda r: (r.created_ms, r.event is not JobEvent.STARTED))
        deferred = []
        for record in records:
            if record.webhook_id in self._in_flight:
                continue  # our own lease ran out while we wait; the attempt is under way
            endpoint = _endpoint(record.url)
            if self._backlog[endpoint] >= self._backlog_max:
                # A slow receiver must not take every attempt slot of this worker.
                deferred.append(record.webhook_id)
                continue
            self._backlog[endpoint] += 1
            previous = self._job_tails.get(record.job_id)
            task = asyncio.create_task(self._attempt(record, after=previous))
            self._in_flight[record.webhook_id] = task
            self._job_tails[record.job_id] = task
            task.add_done_callback(
                functools.partial(self._forget, record=record, endpoint=endpoint)
            )
        await self._store.renew(deferred, lease_ms=_DEFER_MS, owner=self.owner)
        return len(records) - len(deferred)

    def _forget(self, task: asyncio.Task[None], record: DeliveryRecord, endpoint: str) -> None:
        self._in_flight.pop(record.webhook_id, None)
        self._backlog[endpoint] -= 1
        if self._job_tails.get(record.job_id) is task:
            del self._job_tails[record.job_id]

    async def drain(self, grace_s: float) -> None:
        """Wait for attempts in flight; ones cut short are retried once their lease ends."""
        tasks = list(self._in_flight.values())
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _renew_leases(self, stop: asyncio.Event) -> None:
        interval_s = self._lease_ms / 4000
        while not stop.is_set():
            await asyncio.sleep(interval_s)
            try:
                await self._store.renew(
                    list(self._in_flight), lease_ms=self._lease_ms, owner=self.owner
                )
            except Exception:
                log.exception("webhooks: renewing leases failed")

    async def _attempt(self, record: DeliveryRecord, after: asyncio.Task[None] | None) -> None:
        if after is not None:
            await asyncio.wait([after])
        started_ns = time.time_ns()
        try:
            attempt = await self._send(record)
        except Exception as e:  # a bug must not leave the delivery leased forever
            log.exception("webhooks: attempt of %s failed", record.webhook_id)
            attempt = DeliveryAttempt(at_ms=_now_ms(), latency_ms=0.0, error=f"internal: {e}")
        number = record.attempts + 1
        if attempt.error is None:
            outcome, next_ms = "delivered", 0
        else:
            next_at = self._policy.next_attempt_ms(
                failed_attempts=number, created_ms=record.created_ms, now_ms=_now_ms()
            )
            outcome, next_ms = ("retry", next_at) if next_at else ("failed", 0)
        if tracing.active():
            attributes: dict[str, str | int] = {
                "ebb.job_id": record.job_id,
                "ebb.webhook_id": record.webhook_id,
            }
            attributes.update({"ebb.attempt": number, "ebb.outcome": outcome})
            # Under the job's own trace when it was traced, else a trace of its own.
            parent = record.traceparent or Context()
            tracing.record_span(
                "ebb.webhook_delivery", parent, started_ns, time.time_ns(), attributes
            )
        log.info(
            "webhooks: %s %s of job %s attempt %d -> %s (%s)",
            record.event,
            record.webhook_id,
            record.job_id,
            number,
            outcome,
            attempt.error or attempt.status_code,
        )
        try:
            await self._store.record(
                record.webhook_id,
                owner=self.owner,
                attempt=attempt,
                outcome=outcome,
                next_ms=next_ms,
            )
        except Exception:
            # Redis is away: the delivery stays leased and is attempted again (same
            # webhook id) once the lease ends.
            log.exception("webhooks: recording attempt %d of %s failed", number, record.webhook_id)

    async def _send(self, record: DeliveryRecord) -> DeliveryAttempt:
        at_ms = _now_ms()
        try:
            target = await resolve_target(record.url, self._allowed)
        except UnsafeUrl as e:
            return DeliveryAttempt(at_ms=at_ms, latency_ms=0.0, error=str(e))
        secrets = await self._secrets.ensure(record.tenant, new_secret())
        body = record.body.encode()
        headers = webhook_headers(secrets.signing_secrets(), record.webhook_id, at_ms // 1000, body)
        headers["content-type"] = "application/json"
        headers["host"] = target.host_header
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        slot = self._slots.setdefault(
            target.endpoint, asyncio.Semaphore(self._settings.webhook_endpoint_concurrency)
        )
        timeout_s = self._settings.webhook_timeout_s
        async with slot:
            started = time.monotonic()
            try:
                # The whole exchange has one deadline (a receiver trickling its answer byte
                # by byte gets no more), and the answer's body is never read.
                async with (
                    asyncio.timeout(timeout_s),
                    self._http.stream(
                        "POST",
                        target.pinned_url(),
                        content=body,
                        headers=headers,
                        extensions=extensions,
                        timeout=timeout_s,
                    ) as response,
                ):
                    status = response.status_code
            except (TimeoutError, httpx.TimeoutException):
                return _failed(at_ms, started, f"no answer within {timeout_s:g}s")
            except httpx.HTTPError as e:
                return _failed(at_ms, started, f"{type(e).__name__}: {e}")
        latency_ms = (time.monotonic() - started) * 1000
        error = None if 200 <= status < 300 else f"HTTP {status}"
        return DeliveryAttempt(at_ms=at_ms, latency_ms=latency_ms, status_code=status, error=error)


def _endpoint(url: str) -> str:
    try:
        scheme, host, port = parse_url(url)
    except UnsafeUrl:
        return ""
    return f"{scheme}://{host}:{port}"


def _failed(at_ms: int, started: float, error: str) -> DeliveryAttempt:
    return DeliveryAttempt(at_ms=at_ms, latency_ms=(time.monotonic() - started) * 1000, error=error)


def _now_ms() -> int:
    return int(time.time() * 1000)
