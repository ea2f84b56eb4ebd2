"""Exactly one controller acts at a time: a leader lease in Redis, renewed or lost.

Every controller process runs a `LeaderElection`. The one holding the lease renews it every
third of a lease period; the others (standbys) try to take it as often, and one gets it
once the leader stopped renewing (it died, hung, or lost Redis) and the lease expired on
the Redis clock. A controller acts only while `leading()`: its lease is valid by its own
monotonic clock, counted from before the renewal it sent, less a margin for clock rates,
so it stops acting before Redis could hand the lease to anyone else.

A clean shutdown releases the lease, so a standby takes over at its next try instead of
after a lease period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Protocol

from ebb.coldstart.clock import SYSTEM_CLOCK, Clock
from ebb.queue.leader_lease import Hold

log = logging.getLogger(__name__)

# A held lease counts as ours for this fraction of its period: clocks on two machines
# run at rates that differ by far less, and the rest is left to the standby's side.
_VALID_FRACTION = 0.9
# Renewals (and a standby's tries) per lease period: one lost renewal is survived.
_TRIES_PER_LEASE = 3


class LeaseStore(Protocol):
    """`ebb.queue.leader_lease.LeaderLease`, or an in-memory one in tests."""

    async def hold(self, holder: str, ttl_ms: int) -> Hold: ...

    async def release(self, holder: str) -> bool: ...


class Leadership(Protocol):
    """What the controller asks before it acts."""

    def leading(self) -> bool:
        """This controller may act now."""
        ...

    @property
    def term(self) -> int:
        """The term it leads (or last led): a new term means state must be re-read."""
        ...


class AlwaysLeader:
    """Leadership of the only controller there is (tests, simulations)."""

    term = 1

    def leading(self) -> bool:
        return True


def default_holder_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class LeaderElection:
    def __init__(
        self,
        store: LeaseStore,
        *,
        lease_s: float,
        holder: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ):
        if lease_s <= 0:
            raise ValueError("the leader lease must be positive")
        self._store = store
        self._lease_s = lease_s
        self.holder = holder or default_holder_id()
        self._clock = clock
        self._valid_until = float("-inf")
        self._term = 0
        self._stopping = asyncio.Event()

    @property
    def term(self) -> int:
        return self._term

    @property
    def try_interval_s(self) -> float:
        return self._lease_s / _TRIES_PER_LEASE

    def leading(self) -> bool:
        return self._clock.monotonic() < self._valid_until

    async def step(self) -> bool:
        """One try to acquire or renew the lease; whether this controller leads after it.

        A failed call to Redis does not end a lease that is still valid: the next try
        may renew it in time."""
        sent_s = self._clock.monotonic()
        was_leading = self.leading()
        try:
            hold = await self._store.hold(self.holder, int(self._lease_s * 1000))
        except Exception:
            log.exception("coldstart: leader lease: renewal failed")
            return self.leading()
        if not hold.held:
            if was_leading:
                log.warning("coldstart: %s lost the leader lease (term %d)", self.holder, hold.term)
            self._valid_until = float("-inf")
            return False
        self._valid_until = sent_s + self._lease_s * _VALID_FRACTION
        if not was_leading or hold.term != self._term:
            log.info("coldstart: %s leads (term %d)", self.holder, hold.term)
        self._term = hold.term
        return True

    async def run(self) -> None:
        """Hold, renew or wait for the lease until `stop`; then release it if held."""
        while not self._stopping.is_set():
            await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.try_interval_s)
        await self.release()

    async def release(self) -> None:
        if self.leading():
            self._valid_until = float("-inf")
            try:
                await self._store.release(self.holder)
            except Exception:  # it expires on its own within a lease period
                log.exception("coldstart: leader lease: release failed")

    def stop(self) -> None:
        self._stopping.set()
