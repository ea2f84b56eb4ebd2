"""Claim-path tests at the script level: requests enqueued as the frontdoor would, for
runners (`RunnerQueue`) the test drives by hand. The `queue` fixture itself is in
tests/integration/conftest.py."""

from __future__ import annotations

from ebb.queue.requests import RequestQueue
from ebb.queue.schema import WorkItem


async def enqueue(queue: RequestQueue, *items: WorkItem) -> None:
    """Each item, in order, well within the admission window and depth limit."""
    for item in items:
        await queue.enqueue(item, admission_window_s=60, depth_limit=100)
