"""At most one reversal per gap: a scale-in soon after a scale-out (or the reverse) waits.

Pure; the memory of the last moves is the controller's (`Measured.last_out_s/last_in_s`).
"""

from __future__ import annotations

from ebb.coldstart.scaling_inputs import Measured


def reversal_wait_s(direction: int, measured: Measured, now_s: float, gap_s: float) -> float:
    """How much longer a move in `direction` (+1 out, -1 in) must wait (0: go ahead)."""
    last_opposite = measured.last_in_s if direction > 0 else measured.last_out_s
    return max(0.0, last_opposite + gap_s - now_s)
