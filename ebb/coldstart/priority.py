"""Which deployment gets the next cold start when stems or GPUs are scarce: the one with
the most urgent waiting work. Pure; `plan` walks the demands in this order, so that the
earlier ones take the stems and devices first."""

from __future__ import annotations

from collections.abc import Iterable

from ebb.coldstart.world import Demand
from ebb.queue.priority import rank


def by_urgency(demands: Iterable[Demand]) -> list[Demand]:
    """Demands with synchronous work waiting first, by the class of their most urgent
    waiting request (critical first), then by their deployment's own class, then the
    longest wait; the others after, by their deployment's class. Ties keep their order."""

    def urgency(demand: Demand) -> tuple[int, int, int, float]:
        waiting = bool(demand.head_priority) and demand.queue_depth > 0
        if not waiting:
            return (1, 0, rank(demand.spec.priority), 0.0)
        return (0, rank(demand.head_priority), rank(demand.spec.priority), -demand.oldest_wait_s)

    return sorted(demands, key=urgency)
