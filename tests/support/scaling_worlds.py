"""Hand-built worlds for the scaling policies' unit tests: one deployment `m` with a
`scaling` block, its ready runners and what was measured, and readers of what `plan`
answered (launches, drains, the `Scaled` reasons). Shared by the policy test modules so
that one place says what such a world is."""

from __future__ import annotations

from ebb.coldstart.plan import DrainReady, Launch, Scaled
from ebb.coldstart.scaling_inputs import Measured
from ebb.coldstart.scaling_tracker import Latency, RunnerLoad
from ebb.coldstart.world import Demand, World
from ebb.queue.scaling_spec import ScalingSpec
from ebb.queue.schema import DeploymentSpec, RunnerRecord, RunnerState

NOW = 1_800_000_000.0


def spec(scaling: ScalingSpec, **kw: object) -> DeploymentSpec:
    fields: dict[str, object] = {"max_replicas": 4, "max_concurrency": 8} | kw
    return DeploymentSpec(name="m", source="s3://m", uid="u1", scaling=scaling, **fields)  # type: ignore[arg-type]


def ready(*ids: str) -> tuple[RunnerRecord, ...]:
    return tuple(
        RunnerRecord(runner_id=i, state=RunnerState.READY, deployment="m", deployment_uid="u1")
        for i in ids
    )


def world(
    scaling: ScalingSpec,
    runners: tuple[RunnerRecord, ...],
    measured: Measured,
    *,
    wall_s: float = NOW,
    cold_start_s: float = 0.0,
    **kw: object,
) -> World:
    """`m` with `runners` ready; `kw` goes to its spec."""
    demand = Demand(
        spec=spec(scaling, **kw),
        ready=len(runners),
        measured=measured,
        cold_start_s=cold_start_s,
    )
    return World(demands=(demand,), runners=runners, wall_s=wall_s)


def launches(actions: list[object]) -> int:
    return sum(isinstance(a, Launch) and a.deployment == "m" for a in actions)


def drains(actions: list[object]) -> list[str]:
    return [a.runner_id for a in actions if isinstance(a, DrainReady)]


def reasons(actions: list[object]) -> str:
    return " | ".join(r for a in actions if isinstance(a, Scaled) for r in a.reasons)


class RecordedLatencies:
    """A scaling source whose runners each hold two requests and whose finished requests
    are `finished` (appended to by the test)."""

    def __init__(self, finished: list[Latency] | None = None) -> None:
        self.finished = finished if finished is not None else []

    async def runner_load(self, runner_ids: list[str]) -> dict[str, RunnerLoad]:
        return {r: RunnerLoad(held=2) for r in runner_ids}

    async def latencies_after(self, cursor: bytes) -> tuple[bytes, list[Latency]]:
        start = int(cursor or b"0")
        return str(len(self.finished)).encode(), self.finished[start:]

    async def cold_start_ms(self, deployment: str) -> dict[str, dict[str, float]]:
        return {}
