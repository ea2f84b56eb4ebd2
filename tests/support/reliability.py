"""The reliability run: jobs keep arriving while every ebb process and Redis restart once;
in the end jobs submitted = finished = retrievable = delivered, nothing billed twice, and
a receiver saw each event under exactly one webhook id.

Used by the integration test (a small run) and by bench/jobs_reliability.py (the figure).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import redis

from ebb.queue import keys
from support import Platform, RedisServer, wait_until
from support.platform_processes import crash, wait_replaced
from support.webhook_receiver import Receiver

SETTLED = ("succeeded", "failed", "cancelled", "expired")
RESTART_ORDER = ("frontdoor", "coldstart", "webhooks", "redis")


@dataclass
class Figure:
    submitted: int = 0
    finished: int = 0  # succeeded
    retrievable: int = 0  # GET /v1/jobs/{id} returns the result
    delivered: int = 0  # the receiver accepted job.succeeded
    duplicate_receptions: int = 0  # receptions beyond the first, always the same webhook id
    events_with_two_ids: int = 0  # (job, event) pairs announced under two webhook ids
    usage_records: int = 0  # billed finished attempts
    submit_retries: int = 0  # submissions the client had to resend (platform down)
    restarts: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def holds(self) -> bool:
        counts = (self.finished, self.retrievable, self.delivered, self.usage_records)
        return all(c == self.submitted for c in counts) and self.events_with_two_ids == 0

    def line(self) -> str:
        return (
            f"submitted={self.submitted} finished={self.finished} "
            f"retrievable={self.retrievable} delivered={self.delivered} "
            f"billed={self.usage_records} duplicate_receptions={self.duplicate_receptions} "
            f"(same webhook-id) events_with_two_ids={self.events_with_two_ids} "
            f"submit_retries={self.submit_retries} restarts={self.restarts} "
            f"in {self.seconds:.0f}s"
        )


class Submitter(threading.Thread):
    """Submits jobs one after another, each retried under its Idempotency-Key until the
    platform accepts it (it may be restarting)."""

    def __init__(self, platform: Platform, job: dict, gap_s: float):
        super().__init__(daemon=True)
        self._platform = platform
        self._job = job
        self._gap_s = gap_s
        self.stop = threading.Event()
        self.ids: list[str] = []
        self.retries = 0

    def run(self) -> None:
        with self._platform.admin() as client:
            n = 0
            while not self.stop.is_set():
                self.ids.append(self._submit(client, f"reliability-{n}"))
                n += 1
                self.stop.wait(self._gap_s)

    def _submit(self, client: httpx.Client, key: str) -> str:
        while True:
            try:
                response = client.post(
                    "/v1/jobs", json=self._job, headers={"Idempotency-Key": key}, timeout=10
                )
                if response.status_code == 202:
                    return response.json()["id"]
            except httpx.HTTPError:
                pass
            self.retries += 1
            time.sleep(0.2)


def run_restart_scenario(
    platform: Platform,
    redis_server: RedisServer,
    receiver: Receiver,
    job: dict,
    *,
    gap_s: float = 0.3,
    between_restarts_s: float = 2.0,
    settle_timeout_s: float = 300,
) -> Figure:
    figure = Figure()
    started = time.monotonic()
    submitter = Submitter(platform, job, gap_s)
    submitter.start()
    for role in RESTART_ORDER:
        _pause(submitter, between_restarts_s)
        if role == "redis":
            redis_server.stop()
            redis_server.start()
            figure.restarts[role] = f"port {redis_server.port}"
        else:
            old = crash(platform.home, role)
            figure.restarts[role] = f"{old}->{wait_replaced(platform.home, role, old)}"
    _pause(submitter, between_restarts_s)
    submitter.stop.set()
    submitter.join()
    ids = list(dict.fromkeys(submitter.ids))
    figure.submitted = len(ids)
    figure.submit_retries = submitter.retries
    with platform.admin() as client:
        views = [_settled(client, job_id, settle_timeout_s) for job_id in ids]
    figure.finished = sum(v["status"] == "succeeded" for v in views)
    figure.retrievable = sum(bool(v.get("result")) for v in views)
    wait_until(
        lambda: all(receiver.accepted(job_id, "job.succeeded") for job_id in ids),
        settle_timeout_s,
        "every job.succeeded delivery",
    )
    figure.delivered = sum(bool(receiver.accepted(j, "job.succeeded")) for j in ids)
    _count_receptions(figure, receiver, ids)
    figure.usage_records = _billed(redis_server, ids)
    figure.seconds = time.monotonic() - started
    return figure


def _pause(submitter: Submitter, seconds: float) -> None:
    """Let a few more jobs arrive (by count, not by clock) before the next restart."""
    want = len(submitter.ids) + max(1, int(seconds / 0.3))
    wait_until(lambda: len(submitter.ids) >= want, 120, "more submissions")


def _settled(client: httpx.Client, job_id: str, timeout_s: float) -> dict:
    def view() -> dict | None:
        try:
            body = client.get(f"/v1/jobs/{job_id}").json()
        except (httpx.HTTPError, json.JSONDecodeError):
            return None
        return body if body.get("status") in SETTLED else None

    return wait_until(view, timeout_s, f"job {job_id} to settle", poll_s=0.2)


def _count_receptions(figure: Figure, receiver: Receiver, ids: list[str]) -> None:
    wanted = set(ids)
    accepted = [r for r in receiver.accepted() if r.job_id in wanted]
    per_id = Counter(r.webhook_id for r in accepted)
    figure.duplicate_receptions = sum(n - 1 for n in per_id.values())
    ids_per_event: dict[tuple[str, str], set[str]] = {}
    for r in accepted:
        ids_per_event.setdefault((r.job_id, r.event), set()).add(r.webhook_id)
    figure.events_with_two_ids = sum(len(s) > 1 for s in ids_per_event.values())


def _billed(redis_server: RedisServer, ids: list[str]) -> int:
    client = redis.Redis.from_url(redis_server.url)
    jobs = set(ids)
    records = [json.loads(f[b"r"]) for _, f in client.xrange(keys.USAGE)]
    client.close()
    return sum(
        r["state"] == "finished" and r["request_id"].rsplit(".", 1)[0] in jobs for r in records
    )
