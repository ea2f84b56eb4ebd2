"""The fake engine's prefix cache: a prompt whose start it served recently prefills
faster (its prefill pause covers only the tokens the cache lacks)."""

from __future__ import annotations

import pytest

from ebb.queue.schema import SamplingSpec
from ebb.testing import fake_engine
from ebb.testing.fake_engine import FakeEngine, common_prefix_len
from ebb.testing.fake_model import FakeModel


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([5], [6]) == 0


def test_a_cached_prefix_is_not_prefilled_again(monkeypatch: pytest.MonkeyPatch):
    pauses: list[float] = []
    monkeypatch.setattr(fake_engine.time, "sleep", pauses.append)
    engine = FakeEngine(FakeModel.parse("fake://m?step_ms=0&prefill_ms_per_1k_tokens=100"))
    system = list(range(1000))
    sampling = SamplingSpec(max_tokens=1)

    engine.add_request("a", [*system, 1], sampling)
    engine.step()
    engine.add_request("b", [*system, 2, 3], sampling)  # all but its last 2 tokens cached
    engine.step()
    engine.add_request("c", [7, *system], sampling)  # a different start: nothing cached
    engine.step()
    assert pauses == pytest.approx([0.1001, 0.0002, 0.1001])
    stats = engine.stats()
    assert stats.prefix_cache_hit_tokens == 1000
    assert stats.prefix_cache_queried_tokens == 1001 + 1002 + 1001


def test_a_prefix_is_found_only_under_the_salt_that_cached_it():
    engine = FakeEngine(FakeModel.parse("fake://m?step_ms=0"))
    system = list(range(500))
    sampling = SamplingSpec(max_tokens=1)
    engine.add_request("a", [*system, 1], sampling, cache_salt="tenant:a")
    engine.step()
    engine.add_request("b", [*system, 2], sampling, cache_salt="tenant:b")  # another tenant
    engine.step()
    assert engine.stats().prefix_cache_hit_tokens == 0
    engine.add_request("a2", [*system, 3], sampling, cache_salt="tenant:a")
    engine.step()
    assert engine.stats().prefix_cache_hit_tokens == 500
