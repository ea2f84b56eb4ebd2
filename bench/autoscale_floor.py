"""How few cold-start waits a trace allows, and where a policy's waits came from.

Two floors, each measured on the same simulator and runner model as the rows:

- `unavoidable`: the requests that arrive before the first runner could be ready — the
  trace's first arrival plus the fastest start tier the deployment has (a pooled stem or
  a fork, else a fresh process). A deployment at zero that knows nothing before its first
  request cannot serve them sooner, whatever it starts and however many: no policy that
  starts from zero runners waits less.
- `reactive`: the trace replayed with runners started the instant the need exceeds them
  (no scale-up delay) and never given back. What is left are rises to a level of need
  never reached before, each waiting one start: a policy that acts only on need it has
  seen (any keep-alive, the hybrid histogram included) and starts a runner for each
  such rise waits at least this much. Two ways below it: a forecast (`trend`) starts a
  runner before the need arrives; and a policy that starts none for a short rise leaves
  those requests waiting for a busy runner's slot, which is not a cold-start wait (the
  queue rule's 2 s delay does this for a rise that passes within it).

`by_minute` counts a result's cold waits per minute of arrival, to say which part of the
trace they come from (a ramp from zero, a rise to a new level later).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ebb.coldstart.policy import PolicyConfig
from ebb.coldstart.simulation import (
    RunnerModel,
    ScalingSettings,
    SimulationResult,
    TraceRequest,
    simulate,
)
from ebb.launching.tiers import Tier
from ebb.queue.scaling_spec import QUEUE_ONLY


@dataclass(frozen=True)
class Floor:
    unavoidable: int  # requests before the first runner could be ready
    fastest_start_s: float
    reactive: int  # cold waits with instant scale-up and no runner given back
    reactive_runner_s: float
    reactive_by_minute: dict[int, int]


def fastest_start_s(settings: ScalingSettings, model: RunnerModel) -> float:
    """The quickest start the deployment's platform offers: a pooled stem when the pool
    is on, a fork when the fork server is, else a fresh process."""
    tiers = [Tier.FRESH]
    if settings.prewarm > 0:
        tiers.append(Tier.PREWARMED)
    if settings.fork_server:
        tiers.append(Tier.FORKED)
    return min(model.start_s(tier) for tier in tiers)


def unavoidable_waits(trace: Sequence[TraceRequest], start_s: float) -> int:
    """Requests arriving before the first arrival + `start_s` (no runner can be up for
    them when the deployment starts from zero)."""
    if not trace:
        return 0
    first = min(r.arrival_s for r in trace)
    return sum(r.arrival_s < first + start_s for r in trace)


def by_minute(arrivals_s: Sequence[float]) -> dict[int, int]:
    """Cold waits per minute of arrival (minute 0 is the trace's first), in order."""
    return dict(sorted(Counter(int(a // 60) for a in arrivals_s).items()))


def cold_waits(result: SimulationResult) -> int:
    return result.admitted_after_start + result.refused_while_starting


def measure_floor(
    trace: list[TraceRequest],
    base: ScalingSettings,
    model: RunnerModel = RunnerModel(),
    scale_up: PolicyConfig = PolicyConfig(),
) -> Floor:
    """Both floors for `trace` on the deployment `base` describes (its `scaling` block
    is left out: the reactive replay is the queue rule alone, with no delay). The
    reactive replay's idle timeout outlasts the trace, so no runner is given back."""
    start_s = fastest_start_s(base, model)
    span_s = trace[-1].arrival_s - trace[0].arrival_s if trace else 0.0
    never = replace(base, idle_timeout_s=span_s + 3600.0, scaling=QUEUE_ONLY)
    result = simulate(trace, never, model, replace(scale_up, scale_up_after_s=0.0))
    return Floor(
        unavoidable=unavoidable_waits(trace, start_s),
        fastest_start_s=start_s,
        reactive=cold_waits(result),
        reactive_runner_s=result.runner_seconds,
        reactive_by_minute=by_minute(result.cold_wait_arrivals_s),
    )
