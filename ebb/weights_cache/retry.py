"""Retries with exponential backoff and jitter, for transient fetch errors only."""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

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
    for attempt in itertools.count(1):
        try:
            return call()
        except WeightsTransientError as e:
            if attempt >= attempts:
                raise WeightsTransientError(
                    f"{e.message} (gave up after {attempts} attempts)"
                ) from e
            delay_s = min(backoff_s * 2 ** (attempt - 1), _MAX_DELAY_S)
            delay_s *= random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not security
            logger.warning(
                "weights: %s failed (attempt %d/%d), retrying in %.2fs: %s",
                what,
                attempt,
                attempts,
                delay_s,
                e.message,
            )
            time.sleep(delay_s)
