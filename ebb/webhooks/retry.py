"""When to attempt a webhook delivery again, and when to give up.

Exponential backoff from `base_s`, each delay capped at `max_delay_s`, with "equal jitter"
(half fixed, half random) so that a receiver that was down for everyone is not hit by
every retry at the same instant when it comes back; given up once `give_up_s` have passed
since the event. With the defaults (5 s, 1 h, 24 h) that is about 40 attempts.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from ebb import backoff


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float = 5.0
    max_delay_s: float = 3600.0
    give_up_s: float = 86400.0

    def delay_s(self, failed_attempts: int, rand: Callable[[], float] = random.random) -> float:
        """Wait after the `failed_attempts`-th failed attempt (1 for the first)."""
        ceiling = backoff.delay_s(
            max(failed_attempts, 1), first_s=self.base_s, cap_s=self.max_delay_s
        )
        return ceiling / 2 + rand() * ceiling / 2

    def next_attempt_ms(
        self,
        *,
        failed_attempts: int,
        created_ms: int,
        now_ms: int,
        rand: Callable[[], float] = random.random,
    ) -> int | None:
        """When to try next, or None to give up (the retry period is over)."""
        next_ms = now_ms + int(self.delay_s(failed_attempts, rand) * 1000)
        if next_ms - created_ms > self.give_up_s * 1000:
            return None
        return next_ms
