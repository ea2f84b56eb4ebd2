"""Priority classes at admission: which class a request is queued in, and the refusal a
sheddable request gets under saturation (rules: ebb.queue.priority)."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from ebb.queue.priority import Priority, shed_depth
from ebb.queue.priority_store import PriorityStore
from ebb.queue.schema import DeploymentSpec, WorkItem

# How long a caller's class, once read, serves its next requests: a class changed through
# the API reaches every frontdoor within this, and a busy key costs one read per period
# instead of one per request. Bounded: callers come and go.
_FRESH_S = 1.0
_KEPT = 4096


class AdmissionPriority:
    def __init__(
        self,
        store: PriorityStore | None,
        shed_fraction: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._store = store  # None: every request is standard (tests without Redis)
        self._shed_fraction = shed_fraction
        self._clock = clock
        self._known: dict[tuple[str, str], tuple[float, Priority]] = {}

    async def stamp(self, work: WorkItem) -> WorkItem:
        """`work` in its key's class, else its tenant's, else standard."""
        if self._store is None:
            return work
        return msgspec.structs.replace(
            work, priority=await self._class_of(self._store, work.key_id, work.tenant)
        )

    async def caller_shed_depth(self, key_id: str, tenant: str, depth_limit: int) -> int:
        """`shed_depth` for a request of this caller not built yet (the early check,
        before tokenizing); its class is read once and serves its `stamp` too."""
        if self._store is None:
            return 0
        priority = await self._class_of(self._store, key_id, tenant)
        return shed_depth(priority, depth_limit, self._shed_fraction)

    async def _class_of(self, store: PriorityStore, key_id: str, tenant: str) -> Priority:
        caller = (key_id, tenant)
        now = self._clock()
        known = self._known.get(caller)
        if known is not None and now - known[0] < _FRESH_S:
            return known[1]
        priority = await store.effective(*caller)
        if len(self._known) >= _KEPT:
            self._known.clear()
        self._known[caller] = (now, priority)
        return priority

    def forget(self) -> None:
        """A class was just set through this frontdoor: read it again for the next request."""
        self._known.clear()

    def shed_depth(self, work: WorkItem, depth_limit: int) -> int:
        """The queue depth at which `work` is refused as shed (0: never before full)."""
        return shed_depth(work.priority, depth_limit, self._shed_fraction)

    def shed_message(self, work: WorkItem, spec: DeploymentSpec, depth_limit: int) -> str:
        return shed_message(spec, self.shed_depth(work, depth_limit), depth_limit)


def shed_message(spec: DeploymentSpec, at: int, depth_limit: int) -> str:
    """Why a sheddable request was refused: `at` of `depth_limit` were waiting."""
    return (
        f"Shed: {spec.name!r} is saturated ({at} or more requests waiting of "
        f"{depth_limit}) and this request's priority class is 'sheddable', refused "
        "first so that critical and standard work can run. Retry after the indicated "
        "time, or ask for a higher priority."
    )
