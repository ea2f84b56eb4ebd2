"""Priority classes at admission: which class a request is queued in, and the refusal a
sheddable request gets under saturation (rules: ebb.queue.priority)."""

from __future__ import annotations

import msgspec

from ebb.queue.priority import shed_depth
from ebb.queue.priority_store import PriorityStore
from ebb.queue.schema import DeploymentSpec, WorkItem


class AdmissionPriority:
    def __init__(self, store: PriorityStore | None, shed_fraction: float):
        self._store = store  # None: every request is standard (tests without Redis)
        self._shed_fraction = shed_fraction

    async def stamp(self, work: WorkItem) -> WorkItem:
        """`work` in its key's class, else its tenant's, else standard."""
        if self._store is None:
            return work
        priority = await self._store.effective(work.key_id, work.tenant)
        return msgspec.structs.replace(work, priority=priority)

    def shed_depth(self, work: WorkItem, depth_limit: int) -> int:
        """The queue depth at which `work` is refused as shed (0: never before full)."""
        return shed_depth(work.priority, depth_limit, self._shed_fraction)

    def shed_message(self, work: WorkItem, spec: DeploymentSpec, depth_limit: int) -> str:
        at = self.shed_depth(work, depth_limit)
        return (
            f"Shed: {spec.name!r} is saturated ({at} or more requests waiting of "
            f"{depth_limit}) and this request's priority class is 'sheddable', refused "
            "first so that critical and standard work can run. Retry after the indicated "
            "time, or ask for a higher priority."
        )
