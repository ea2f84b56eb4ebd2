"""Leader election on a manual clock: one leader at a time, a standby takes over once the
lease expires, a Redis blip inside a lease period is survived, a release hands over at once."""

from __future__ import annotations

from ebb.coldstart.clock import ManualClock
from ebb.coldstart.leader import LeaderElection
from ebb.queue.leader_lease import Hold

LEASE_S = 3.0


class MemoryLease:
    """lua/leader_hold.lua and leader_release.lua on the test's clock."""

    def __init__(self, clock: ManualClock):
        self._clock = clock
        self.holder: str | None = None
        self._expires_s = 0.0
        self.term = 0
        self.down = False

    async def hold(self, holder: str, ttl_ms: int) -> Hold:
        if self.down:
            raise ConnectionError("redis is down")
        if self.holder is not None and self._clock.now_s >= self._expires_s:
            self.holder = None
        if self.holder not in (None, holder):
            return Hold(False, self.term)
        if self.holder is None:
            self.term += 1
        self.holder, self._expires_s = holder, self._clock.now_s + ttl_ms / 1000
        return Hold(True, self.term)

    async def release(self, holder: str) -> bool:
        if self.holder == holder:
            self.holder = None
            return True
        return False


def pair() -> tuple[ManualClock, MemoryLease, LeaderElection, LeaderElection]:
    clock = ManualClock()
    lease = MemoryLease(clock)
    a = LeaderElection(lease, lease_s=LEASE_S, holder="a", clock=clock)
    b = LeaderElection(lease, lease_s=LEASE_S, holder="b", clock=clock)
    return clock, lease, a, b


async def tick(clock: ManualClock, *elections: LeaderElection) -> None:
    """One try interval: each live controller tries once."""
    for e in elections:
        await e.step()
    clock.advance(LEASE_S / 3)


async def test_one_leader_at_a_time_and_renewal_keeps_it():
    clock, lease, a, b = pair()
    assert await a.step() and not await b.step()
    for _ in range(20):
        await tick(clock, a, b)
        assert a.leading() and not b.leading()
    assert (lease.holder, a.term) == ("a", 1)


async def test_the_standby_takes_over_within_a_lease_period_of_the_last_renewal():
    clock, lease, a, b = pair()
    await tick(clock, a, b)
    last_renewal_s = clock.now_s - LEASE_S / 3
    # a dies: it renews no more. b keeps trying every third of a lease.
    while not b.leading():
        assert not (a.leading() and b.leading()), "never two leaders"
        await tick(clock, b)
    assert clock.now_s - last_renewal_s <= LEASE_S + LEASE_S / 3
    assert (lease.holder, b.term) == ("b", 2), "a new term"
    # a's own view ran out before b could take the lease: it stopped acting first.
    assert not a.leading()


async def test_the_old_leader_stops_acting_before_the_lease_can_move():
    clock, _, a, _ = pair()
    await a.step()
    clock.advance(LEASE_S * 0.89)
    assert a.leading()
    clock.advance(LEASE_S * 0.02)
    assert not a.leading(), "a margin below the lease period, on its own clock"


async def test_a_redis_blip_inside_the_lease_is_survived_a_long_outage_is_not():
    clock, lease, a, _ = pair()
    await tick(clock, a)
    lease.down = True
    await tick(clock, a)
    assert a.leading(), "one failed renewal: the lease still holds"
    await tick(clock, a)
    await tick(clock, a)
    assert not a.leading()
    lease.down = False
    await tick(clock, a)
    assert a.leading() and a.term == 2, "re-acquired after it expired: a new term"


async def test_release_hands_over_at_the_standbys_next_try():
    clock, lease, a, b = pair()
    await tick(clock, a, b)
    await a.release()
    assert not a.leading() and lease.holder is None
    assert await b.step() and b.term == 2


async def test_a_leader_that_lost_the_lease_to_another_sees_it_at_its_next_try():
    clock, lease, a, b = pair()
    await a.step()
    lease.holder = "b"  # taken while a was paused (a GC stall, a frozen VM)
    assert not await a.step() and not a.leading()
