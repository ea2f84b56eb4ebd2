"""What one scaling rule says about a deployment: out (+1), in (-1) or hold (0), and why."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    direction: int = 0  # +1 add a replica, -1 drain one, 0 keep
    why: str = ""


HOLD = Verdict()
