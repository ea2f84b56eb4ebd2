"""Least-loaded claiming: when a runner leaves a queued request for a peer with more room.

The rule lives in `lua/claim.lua` (`left_for_lighter`), where claims are atomic; this is
its statement in Python, for the simulator (`ebb.coldstart.simulation_runners`) to apply
the same rule, and for tests to pin its boundaries.

Runners of a deployment claim in a race (every one is woken by the queue's signal), so
without it one runner may fill its batch while another has room: every request of the
fuller one decodes in a bigger batch (a slower TPOT), and the deployment's p90 TPOT is
its fullest runner's whatever the runner count.
"""

from __future__ import annotations

# The difference in held requests tolerated between a runner and its lightest peer once
# the runner took the request. At least 1: at 0, two runners of equal load would each
# leave the request for the other until the wait ran out.
BALANCE_SLACK = 1


def leaves_for_peer(
    *,
    held_after: int,
    peer_held: int,
    peer_room: int,
    waited_ms: float,
    wait_ms: float,
    slack: int = BALANCE_SLACK,
) -> bool:
    """Whether a runner that would hold `held_after` requests were it to take this one
    leaves it for its lightest live, ready peer, which holds `peer_held` (counting what
    this claim already left for it) with `peer_room` free slots. Never past `wait_ms` of
    waiting (0: off), nor for a peer without room. Runners of one deployment have the
    same slots, so holding fewer and having more room are the same order (claim.lua
    compares room)."""
    if wait_ms <= 0 or waited_ms >= wait_ms or peer_room <= 0:
        return False
    return held_after - peer_held > slack
