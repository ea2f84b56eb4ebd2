"""Cold-start tiers: where a new runner for a deployment comes from, fastest first.

The one place that knows the tiers, their order and what each implies. Runner records,
cold-start statistics and metrics carry a tier as its string value (`Tier` is a `StrEnum`,
so `Tier.FORKED == "forked"`); everything that decides by tier asks this module.
"""

from __future__ import annotations

from enum import StrEnum


class Tier(StrEnum):
    # An idle runner of this deployment whose engine sleeps (vLLM sleep mode level 1):
    # the process, its CUDA context and imports survive. GPUs only.
    SLEEPING = "sleeping"
    # A stem from the pre-warmed pool: engine imported and set up, loads the cached weights.
    PREWARMED = "prewarmed"
    # Forked from the fork server, which imported the engine once: loads the cached weights.
    FORKED = "forked"
    # A new interpreter that imports the engine itself, then loads the cached weights.
    FRESH = "fresh"
    # A start that had to fetch or convert the weights before loading them.
    FRESH_FETCH = "fresh_fetch"

    @property
    def rank(self) -> int:
        """Position in `TIER_ORDER`: lower is faster."""
        return TIER_ORDER.index(self)

    @property
    def reuses_process(self) -> bool:
        """The start reuses a process that already imported the engine."""
        return self in WARM_PROCESS_TIERS

    def after_weights_fetch(self) -> Tier:
        """The tier a runner's start is counted under once it had to fetch (or convert)
        its weights: a launched runner's start becomes `fresh_fetch`; a stem's keeps its
        tier, as it always has."""
        return Tier.FRESH_FETCH if self in (Tier.FRESH, Tier.FORKED) else self


# Fastest first: the order in which a new runner gets them.
TIER_ORDER: tuple[Tier, ...] = (
    Tier.SLEEPING,
    Tier.PREWARMED,
    Tier.FORKED,
    Tier.FRESH,
    Tier.FRESH_FETCH,
)
# Starts from a process that already holds the engine's imports.
WARM_PROCESS_TIERS = frozenset({Tier.SLEEPING, Tier.PREWARMED, Tier.FORKED})
# Tiers whose availability depends on warm capacity at the moment of the start (a sleeper
# of the deployment, a stem in the pool, a running fork server); the rest always exist.
CAPACITY_TIERS = frozenset({Tier.SLEEPING, Tier.PREWARMED, Tier.FORKED})


def launch_tier(forks_ready: bool) -> Tier:
    """The tier of a runner the launcher starts now (no sleeper or stem was available)."""
    return Tier.FORKED if forks_ready else Tier.FRESH


class WarmState(StrEnum):
    """Where warm capacity (the fork server) stands; published for the frontdoor."""

    OFF = "off"  # none configured: every launch starts a fresh process
    STARTING = "starting"  # importing the engine: worth waiting for what is not urgent
    READY = "ready"  # new runners start from a process that already imported the engine
    DOWN = "down"  # died; restarted in time
