"""The clock a runner times its cold start's phases with (folded into the deployment's
cold-start statistics when it goes READY)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class ColdStartClock:
    """Phase durations of one cold start, measured from `start_ms`."""

    start_ms: float
    phases_ms: dict[str, float] = field(default_factory=dict)
    _mark: float = 0.0

    def __post_init__(self) -> None:
        self._mark = self.start_ms

    def lap(self, phase: str) -> None:
        now = time.time() * 1000
        self.phases_ms[phase] = self.phases_ms.get(phase, 0.0) + now - self._mark
        self._mark = now

    def total(self) -> float:
        return self._mark - self.start_ms
