"""Priority classes: who waits under saturation. Pure rules, shared by the frontdoor (shed
at admission), the queue scripts (claim order), the controller (which deployment gets
the next cold start) and placement (classes never share a GPU).

A request's class is its API key's, else its tenant's, else `standard`. Queues are
sorted sets scored by enqueue time; a class adds a fixed offset to that score
(`score_offset_ms`), far larger than any timestamp, so a claim (lowest score first) takes
every critical request before any standard one and every standard before any sheddable
one, and within a class the oldest first. `enqueued_ms_of_score` undoes it, and
`class_of_score` reads the class back (the controller's view of a queue's head).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

Priority = Literal["critical", "standard", "sheddable"]
PRIORITIES: tuple[Priority, ...] = get_args(Priority)
DEFAULT_PRIORITY: Priority = "standard"

# Larger than any epoch-ms timestamp until the year 2286, and small enough that every
# score stays an exact integer in a double (< 2**53).
SCORE_SPAN_MS = 10**13


def rank(priority: str) -> int:
    """0 for the most urgent class; an unknown or empty class counts as `standard`."""
    return PRIORITIES.index(priority) if priority in PRIORITIES else 1


def class_name(priority: str) -> Priority:
    """`priority` itself, or `standard` for an empty or unknown one (older records)."""
    return PRIORITIES[rank(priority)]


def score_offset_ms(priority: str) -> int:
    """What a request of `priority` adds to its enqueue time in its queue's score."""
    return (rank(priority) - 1) * SCORE_SPAN_MS


def class_of_score(score: float) -> Priority:
    """The class of a queued request scored `score` (see `score_offset_ms`)."""
    return PRIORITIES[min(2, max(0, math.floor(score / SCORE_SPAN_MS) + 1))]


def enqueued_ms_of_score(score: float) -> float:
    """The enqueue time (ms) a queue score stands for, whatever its class."""
    return score - score_offset_ms(class_of_score(score))


def class_score_ranges() -> list[tuple[int, int]]:
    """[low, high) of the scores of each class, most urgent first."""
    return [(score_offset_ms(p), score_offset_ms(p) + SCORE_SPAN_MS) for p in PRIORITIES]


def effective_priority(key_priority: str | None, tenant_priority: str | None) -> Priority:
    """A key's own class overrides its tenant's; neither set: `standard`."""
    for chosen in (key_priority, tenant_priority):
        if chosen in PRIORITIES:
            return chosen
    return DEFAULT_PRIORITY


def critical_slots(max_concurrency: int) -> int:
    """Critical requests a runner takes beyond its `max_concurrency` when those slots are
    full of critical work (a quarter of them, at least one)."""
    return max(1, max_concurrency // 4)


def engine_batch_limit(max_concurrency: int, configured: int | None = None) -> int:
    """The engine's batch (vLLM's `max_num_seqs`) for a runner of `max_concurrency` slots,
    unless the deployment `configured` one: the slots, full of standard and sheddable
    work, plus every critical request the runner takes (`critical_room`). vLLM never
    preempts a running sequence for a waiting one's place in the batch, so a critical
    request the batch had no place for would wait for a lower class's to end. Sequences
    beyond the slots share the same KV cache: when it runs out, vLLM's priority policy
    preempts the least urgent ones."""
    return configured or 2 * max_concurrency + critical_slots(max_concurrency)


def critical_room(max_concurrency: int, held: int, held_critical: int, batch_limit: int) -> int:
    """Critical requests a runner holding `held` requests (`held_critical` of them
    critical) may still claim: up to `max_concurrency + critical_slots` critical ones
    whatever else it holds, so that under overload critical work has the room it has
    alone and waits for no standard or sheddable request to end; never more than the
    engine's `batch_limit` in all. Standard and sheddable work takes only free slots."""
    own = max_concurrency + critical_slots(max_concurrency) - held_critical
    return max(0, min(own, batch_limit - held))


def shed_depth(priority: str, depth_limit: int, shed_fraction: float) -> int:
    """The queue depth at which a request of `priority` is refused at once (0: never
    before the queue is full). Only sheddable work is shed early: once the queue holds
    `shed_fraction` of its limit, the platform is saturated and its room is kept for the
    classes that must not wait behind it."""
    if priority != "sheddable" or shed_fraction >= 1:
        return 0
    return max(1, math.floor(depth_limit * shed_fraction))
