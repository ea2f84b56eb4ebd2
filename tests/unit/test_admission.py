"""Retry-After estimates and the error taxonomy's HTTP shape."""

from __future__ import annotations

import asyncio

import pytest

from ebb.coldstart.estimate import DEFAULT_COLD_START_S, StartingRunner, retry_after_s
from ebb.errors import CapacityError, InvalidRequest, NotFound, RateLimited
from ebb.frontdoor.execution import RetryAfterCache


def test_retry_soon_when_a_runner_is_ready():
    assert retry_after_s(ready_runners=1, cold_starts_ms={}, stems_available=False) == 1


def test_retry_after_the_measured_cold_start_of_the_tier_it_will_get():
    measured = {"prewarmed": {"total": 2400.0}, "fresh": {"total": 12600.0}}
    assert retry_after_s(ready_runners=0, cold_starts_ms=measured, stems_available=True) == 3
    assert retry_after_s(ready_runners=0, cold_starts_ms=measured, stems_available=False) == 13


def test_a_start_under_way_is_waited_for_not_a_new_one():
    measured = {"prewarmed": {"total": 2400.0}, "fresh": {"total": 12600.0}}
    fresh_for_10s = [StartingRunner("fresh", elapsed_s=10.0)]
    # A stem is free again, but the request's runner is the fresh one already loading: it
    # is ready in 2.6 s, not in a pre-warmed start's 2.4 s from now.
    assert (
        retry_after_s(
            ready_runners=0, cold_starts_ms=measured, stems_available=True, starting=fresh_for_10s
        )
        == 3
    )
    # Of several starts, the first expected to finish; one overdue means "any moment".
    both = [StartingRunner("fresh", elapsed_s=1.0), StartingRunner("prewarmed", elapsed_s=0.5)]
    overdue = [StartingRunner("prewarmed", elapsed_s=30.0)]
    assert (
        retry_after_s(
            ready_runners=0, cold_starts_ms=measured, stems_available=False, starting=both
        )
        == 2
    )
    assert (
        retry_after_s(
            ready_runners=0, cold_starts_ms=measured, stems_available=False, starting=overdue
        )
        == 1
    )


def test_without_measurements_the_default_estimate_is_used():
    assert retry_after_s(ready_runners=0, cold_starts_ms={}, stems_available=True) == int(
        DEFAULT_COLD_START_S
    )


@pytest.mark.parametrize(
    ("error", "status", "kind", "retryable"),
    [
        (InvalidRequest("bad", param="n"), 400, "invalid_request_error", False),
        (NotFound("gone"), 404, "invalid_request_error", False),
        (RateLimited("slow down", retry_after_s=3), 429, "rate_limit_error", True),
        (CapacityError("busy", retry_after_s=5), 503, "server_error", True),
    ],
)
def test_errors_map_to_status_and_openai_shape(error, status, kind, retryable):
    body = error.to_body()["error"]
    assert error.status_code == status and error.retryable is retryable
    assert (
        body["type"] == kind
        and body["message"]
        and set(body) == {"message", "type", "param", "code"}
    )


def test_a_sleeping_runner_is_the_fastest_tier_when_there_is_one():
    measured = {"sleeping": {"total": 900.0}, "prewarmed": {"total": 2400.0}}
    with_sleeper = retry_after_s(
        ready_runners=0, cold_starts_ms=measured, stems_available=True, sleepers_available=True
    )
    without = retry_after_s(ready_runners=0, cold_starts_ms=measured, stems_available=True)
    assert (with_sleeper, without) == (1, 3)


def test_with_the_pool_empty_a_forked_start_is_expected_before_a_fresh_one():
    measured = {"prewarmed": {"total": 1500.0}, "forked": {"total": 1700.0}}
    measured["fresh"] = {"total": 9800.0}
    assert retry_after_s(ready_runners=0, cold_starts_ms=measured, stems_available=False) == 2
    # The fork server not up (starting, or turned off): a fresh start it is.
    assert (
        retry_after_s(
            ready_runners=0, cold_starts_ms=measured, stems_available=False, forks_available=False
        )
        == 10
    )


class _CountingState:
    """The reads a Retry-After estimate makes, counted."""

    def __init__(self) -> None:
        self.reads = 0

    async def runners(self) -> list:
        self.reads += 1
        await asyncio.sleep(0)  # concurrent refusals arrive while it reads
        return []

    async def cold_start_ms(self, deployment: str) -> dict:
        return {"fresh": {"total": 12600.0}}

    async def fork_server_state(self) -> str:
        return "off"


async def test_a_burst_of_refusals_shares_one_retry_after_estimate():
    state = _CountingState()
    now = [100.0]
    cache = RetryAfterCache(state, clock=lambda: now[0])  # type: ignore[arg-type]  # duck-typed
    estimates = await asyncio.gather(*(cache.of("d") for _ in range(50)))
    assert set(estimates) == {13} and state.reads == 1
    assert await cache.of("other") == 13 and state.reads == 2  # per deployment
    now[0] += 5  # past the estimate's freshness
    await cache.of("d")
    assert state.reads == 3
