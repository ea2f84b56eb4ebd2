"""Where `plan.plan` asks a deployment's `scaling` block (`scaling.decide`) instead of
the queue-only rule alone, and turns the decision into actions. Pure.
"""

from __future__ import annotations

from ebb.coldstart.policy import DemandSnapshot, PolicyConfig
from ebb.coldstart.scaling import decide
from ebb.coldstart.scaling_actions import DrainReady, Scaled
from ebb.coldstart.world import Demand, World, serves
from ebb.launching.tiers import Tier, WarmState
from ebb.queue.scaling_spec import QUEUE_ONLY
from ebb.queue.schema import RunnerState


def scale_decision(
    world: World, demand: Demand, snap: DemandSnapshot, config: PolicyConfig
) -> tuple[int, list[Scaled | DrainReady]] | None:
    """(desired runners, the actions that record and carry out the decision); None for a
    deployment on the queue-only block, which the queue-only rule sizes as before."""
    scaling = demand.spec.scaling
    if scaling == QUEUE_ONLY:
        return None
    ready = [
        r.runner_id
        for r in world.runners
        if serves(r, demand.spec) and r.state is RunnerState.READY
    ]
    decision = decide(
        scaling,
        snap,
        demand.measured,
        ready=ready,
        wall_s=world.wall_s,
        cold_start_s=demand.cold_start_s,
        fixed_keep_alive_s=demand.spec.idle_timeout_s,
        config=config,
        start_s=expected_start_s(world, demand),
    )
    actions: list[Scaled | DrainReady] = []
    if decision.worth_logging(snap.serving):
        actions.append(
            Scaled(
                demand.name,
                scaling.policy,
                decision.desired,
                decision.direction,
                decision.reasons,
            )
        )
    why = "; ".join(decision.reasons)
    actions += [DrainReady(r, demand.name, why) for r in decision.drain]
    return decision.desired, actions


def expected_start_s(world: World, demand: Demand) -> float:
    """The measured cold start of the tier the next start would take (a stem from the
    pool, else a fork, else a fresh process); the slowest tier's while unmeasured."""
    if world.waiting_stems:
        tier = Tier.PREWARMED
    elif world.warm is WarmState.READY:
        tier = Tier.FORKED
    else:
        tier = Tier.FRESH
    return demand.measured.cold_starts_s.get(tier.value, demand.cold_start_s)
