"""What a deployment's queued work is waiting on, read from its status hash: the passing
states that hold async work back without failing it (issue 36). A job shows it while
queued (`waiting_for`) and names it if its TTL ends first."""

from __future__ import annotations

from collections.abc import Mapping

from ebb.queue.weights_status import WeightsState, WeightsStatus


def waiting_for(status: Mapping[str, str]) -> str:
    """The condition holding the deployment's work back ("" when none is known): its
    weights being prepared, fitting on no GPU (with why), or its runners failing to start
    (with the error; the controller keeps retrying)."""
    if WeightsStatus.of(dict(status)).state is WeightsState.PREPARING:
        return "weights_preparing"
    if status.get("unschedulable"):
        return f"deployment_unschedulable ({status['unschedulable']})"
    if status.get("error"):
        return f"deployment_failing ({status['error']})"
    return ""
