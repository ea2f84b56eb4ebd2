"""The weights part of a deployment's status hash: written by the controller's preparer,
read by the frontdoor (tokenizer, context length), the API and the CLI.

One place for its field names, so writers and readers cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class WeightsState(StrEnum):
    UNKNOWN = "unknown"  # nothing to prepare (test engines), or not looked at yet
    PREPARING = "preparing"  # asked for, or under way: `phase` and `progress` say how far
    READY = "ready"  # in the cache at `path` (a later eviction does not change this)
    FAILED = "failed"  # the last attempt failed: `error` says why; retried with backoff


@dataclass(frozen=True)
class WeightsStatus:
    state: WeightsState = WeightsState.UNKNOWN
    phase: str = ""
    progress: float = 0.0
    error: str = ""
    error_code: str = ""
    path: str = ""
    max_model_len: int = 0

    @classmethod
    def of(cls, status: dict[str, str]) -> WeightsStatus:
        """From a deployment's status hash (`PlatformState.deployment_status`)."""
        try:
            state = WeightsState(status.get("weights", WeightsState.UNKNOWN))
        except ValueError:
            state = WeightsState.UNKNOWN
        return cls(
            state=state,
            phase=status.get("weights_phase", ""),
            progress=_float(status.get("weights_progress")),
            error=status.get("weights_error", ""),
            error_code=status.get("weights_error_code", ""),
            path=status.get("weights_path", ""),
            max_model_len=int(_float(status.get("weights_max_model_len"))),
        )

    def fields(self) -> dict[str, object]:
        """Every field, for `PlatformState.set_deployment_status(name, **fields)`."""
        return {
            "weights": self.state.value,
            "weights_phase": self.phase,
            "weights_progress": self.progress,
            "weights_error": self.error,
            "weights_error_code": self.error_code,
            "weights_path": self.path,
            "weights_max_model_len": self.max_model_len,
        }


def progress_fields(phase: str, progress: float) -> dict[str, object]:
    """Only the progress of a preparation under way (the rest of the status stands)."""
    return {"weights_phase": phase, "weights_progress": round(progress, 4)}


def _float(raw: str | None) -> float:
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        return 0.0
