"""with_retries: which errors it retries, how long it waits between attempts, and what
the last error says."""

from __future__ import annotations

import random

import pytest

from ebb.errors import WeightsNotFound, WeightsTransientError
from ebb.weights_cache import retry


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits with_retries sleeps, jitter pinned to its top (the unjittered backoff)."""
    slept: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", slept.append)
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    return slept


def _failing(times: int, error: Exception):
    calls = {"n": 0}

    def call() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise error
        return "ok"

    return call, calls


def test_waits_double_from_backoff_and_stop_at_the_cap(waits: list[float]) -> None:
    call, calls = _failing(7, WeightsTransientError("store busy"))
    assert retry.with_retries(call, "fetch x", attempts=8, backoff_s=1.5) == "ok"
    assert calls["n"] == 8
    assert waits == [1.5, 3.0, 6.0, 12.0, 20.0, 20.0, 20.0]


def test_jitter_spreads_each_wait_over_its_upper_half(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", slept.append)
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    call, _ = _failing(3, WeightsTransientError("store busy"))
    retry.with_retries(call, "fetch x", attempts=4, backoff_s=2.0)
    assert slept == [1.0, 2.0, 4.0]


def test_gives_up_after_attempts_and_says_so(waits: list[float]) -> None:
    call, calls = _failing(10, WeightsTransientError("store busy"))
    with pytest.raises(WeightsTransientError, match=r"store busy \(gave up after 3 attempts\)"):
        retry.with_retries(call, "fetch x", attempts=3, backoff_s=0.5)
    assert calls["n"] == 3
    assert waits == [0.5, 1.0]


def test_other_errors_propagate_at_once(waits: list[float]) -> None:
    call, calls = _failing(1, WeightsNotFound("no such object"))
    with pytest.raises(WeightsNotFound):
        retry.with_retries(call, "fetch x", attempts=5, backoff_s=0.5)
    assert calls["n"] == 1
    assert waits == []
