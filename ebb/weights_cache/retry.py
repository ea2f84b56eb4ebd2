"""Retries with exponential backoff and jitter, for transient fetch errors only."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from ebb.backoff import delay_s, jittered
from ebb.errors import WeightsTransientError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Never wait longer than this between two attempts, however many came before.
_MAX_DELAY_S = 20.0


def with_retries(call: Callable[[], T], what: str, attempts: int, backoff_s: float) -> T:
    """`call()`, retried while it raises WeightsTransientError, at most `attempts` times.

    Any other error propagates at once: retrying bad credentials or a missing object only
    delays the answer. The last transient error propagates with the attempt count added.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except WeightsTransientError as e:
            if attempt >= attempts:
                raise WeightsTransientError(
                    f"{e.message} (gave up after {attempts} attempts)"
                ) from e
            # Many loaders may hit one store at once: spread their retries.
            wait_s = jittered(delay_s(attempt, first_s=backoff_s, cap_s=_MAX_DELAY_S))
            logger.warning(
                "weights: %s failed (attempt %d/%d), retrying in %.2fs: %s",
                what,
                attempt,
                attempts,
                wait_s,
                e.message,
            )
            time.sleep(wait_s)
