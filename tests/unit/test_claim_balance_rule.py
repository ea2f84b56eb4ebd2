"""Least-loaded claiming's rule (`ebb.queue.claim_balance`, claim.lua's `left_for_lighter`)
at its boundaries, and the simulator's runners applying it: a burst is split between two
ready runners, where without it the first in launch order took it all."""

from __future__ import annotations

import asyncio

import pytest

from ebb.coldstart.simulation import ScalingSettings, SimulatedPlatform
from ebb.coldstart.simulation_runners import RunnerModel
from ebb.coldstart.simulation_trace import TraceRequest
from ebb.queue.claim_balance import BALANCE_SLACK, leaves_for_peer


def leaves(held_after: int, peer_held: int, *, room: int = 4, waited_ms: float = 0) -> bool:
    return leaves_for_peer(
        held_after=held_after,
        peer_held=peer_held,
        peer_room=room,
        waited_ms=waited_ms,
        wait_ms=200,
    )


def test_a_difference_within_the_slack_is_kept():
    assert BALANCE_SLACK == 1
    assert not leaves(1, 0)  # ties and one more are kept: no ping-pong between equals
    assert not leaves(5, 4)
    assert leaves(2, 0)
    assert leaves(6, 4)


def test_never_past_the_wait_nor_for_a_full_peer_nor_when_off():
    assert leaves(6, 0, waited_ms=199.9)
    assert not leaves(6, 0, waited_ms=200)
    assert not leaves(6, 0, room=0)
    off = {"held_after": 6, "peer_held": 0, "peer_room": 8, "waited_ms": 0}
    assert not leaves_for_peer(**off, wait_ms=0)


def test_of_two_equal_runners_each_keeps_what_the_other_would_leave():
    """Whatever one leaves, the other (seeing it) keeps: they agree on who takes it."""
    for mine in range(8):
        for theirs in range(8):
            if leaves(mine + 1, theirs):
                assert not leaves(theirs + 1, mine + 1)


@pytest.mark.parametrize(("balance_ms", "expected"), [(200, [4, 4]), (0, [0, 8])])
def test_the_simulators_runners_split_a_burst(balance_ms, expected):
    settings = ScalingSettings(min_replicas=2, max_replicas=2, claim_balance_ms=balance_ms)
    platform = SimulatedPlatform(settings, RunnerModel())
    platform.deploy(settings.spec())
    asyncio.run(platform.start())
    for _ in range(8):
        platform.state.enqueue("sim", TraceRequest(0.0, 100, 100))
    asyncio.run(platform.run_until(0.1))  # two ticks: the peer claims what was left it
    runners = [p.runner_id for p in platform.launcher.procs.values() if p.deployment == "sim"]
    held = [platform.state.held.get(r, 0) for r in runners]
    assert sorted(held) == expected
