"""Deployment versions and traffic splits: the records and the pure rules over them.

A deployment (its public name, the API's `model`) has numbered, immutable versions. Each
version is its own serving unit inside the platform: its own queue, runners, scaling and
prefix owners, all keyed by the unit's name (`unit_name`), so admission, claiming, the
controller and scale-to-zero work per version unchanged. Version 1's unit is the bare
deployment name, which is what every deployment made before versions existed already is.

A unit's spec is composed (`compose`): the deployment's own record gives what applies to
every version (replica bounds, idle timeout, concurrency, admission, owner); the version
gives what it was deployed with (source, engine and serving options, prices, context
length). A version with no traffic holds nothing: its unit keeps no minimum replicas, no
scaling policy beyond its queue, and drains soon after its last request.
"""

from __future__ import annotations

import hashlib
import random
from typing import Literal

import msgspec

from ebb.queue.scaling_spec import QUEUE_ONLY
from ebb.queue.schema import AdapterRef, DeploymentSpec

# "@" is not allowed in deployment names, so a unit name is never a deployment's name.
VERSION_SEPARATOR = _VERSION_SEP = "@v"
# The fields a version fixes; everything else in a DeploymentSpec is the deployment's.
VERSION_FIELDS = (
    "source",
    "max_model_len",
    "price_per_1m_input_tokens_micros",
    "price_per_1m_output_tokens_micros",
    "price_per_gpu_second_micros",
    "prices_set_by_admin",
    "engine",
    "serving",
)
# A version without traffic drains this soon after its last request instead of after the
# deployment's idle timeout: its runners hold GPUs that the serving version may need.
RETIRED_IDLE_S = 2.0
# ...and sizes itself by its queue alone: the deployment's schedule, trend or hybrid
# pre-warm would start runners for a version that no new request can reach.
RETIRED_SCALING = QUEUE_ONLY
# Resolution of a split: traffic shares are whole percents, routing points hundredths.
_POINTS = 10_000


def unit_name(deployment: str, version: int) -> str:
    """The serving unit (queue, runners, scaling) of one version of a deployment."""
    return deployment if version == 1 else f"{deployment}{_VERSION_SEP}{version}"


def split_unit(unit: str) -> tuple[str, int]:
    """(deployment, version) of a unit name; a bare name is version 1."""
    name, sep, number = unit.rpartition(_VERSION_SEP)
    if sep and number.isdigit():
        return name, int(number)
    return unit, 1


def public_name(unit: str) -> str:
    return split_unit(unit)[0]


def adapter_version_key(ref: AdapterRef) -> str:
    """What tells one version of a LoRA adapter from another: its versions share the
    adapter's identity (`uid`) but not its files, so a runner keeps (and claiming's
    affinity matches) each version apart. Version 1's key is the bare uid, as it was
    before adapters had versions."""
    version = split_unit(ref.name)[1]
    return ref.uid if version == 1 else f"{ref.uid}{_VERSION_SEP}{version}"


class VersionRecord(msgspec.Struct, kw_only=True, frozen=True):
    """One immutable version: its spec's VERSION_FIELDS are what it serves with.

    `env_sealed` is the version's environment (secrets such as HF_TOKEN), encrypted
    (`ebb.secrets`); only `env_names` is ever shown."""

    version: int
    created_at_s: float
    spec: DeploymentSpec
    env_names: list[str] = []
    env_sealed: str = ""


RolloutState = Literal["warming", "running", "done", "rolled_back"]


class Rollout(msgspec.Struct, kw_only=True):
    """Moving traffic from one version to another, step by step.

    `steps` are the new version's traffic shares (percent), the last one 100; `step` is the
    index in force, -1 while the new version warms up (no traffic until it has a ready
    runner). `interval_s` > 0: the controller promotes a step every interval while the new
    version is as healthy as the old one (error rate and p99 time to first token within
    the margins), and rolls back when it is not; 0: promotion is by hand."""

    from_version: int
    to_version: int
    strategy: Literal["immediate", "canary"]
    steps: list[int]
    step: int = -1
    state: RolloutState = "warming"
    interval_s: float = 0.0
    started_at_s: float = 0.0
    step_started_at_s: float = 0.0
    max_error_rate_increase: float = 0.05
    max_ttft_increase_pct: float = 50.0
    # Requests each version must have finished in a step before health is judged.
    min_requests: int = 20
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.state in ("warming", "running")

    @property
    def share_pct(self) -> int:
        """The new version's traffic share now."""
        if self.state == "done":
            return 100
        if self.state == "rolled_back" or self.step < 0:
            return 0
        return self.steps[self.step]


class TrafficSplit(msgspec.Struct, kw_only=True):
    """Traffic shares (percent, summing to 100) of the versions that may hold work.

    A version at 0 is still listed while its runners drain what they hold."""

    weights: dict[int, int] = msgspec.field(default_factory=lambda: {1: 100})
    rollout: Rollout | None = None

    @property
    def primary(self) -> int:
        """The version with the most traffic (the newest of equals)."""
        return max(self.weights, key=lambda v: (self.weights[v], v))

    def warming(self, version: int) -> bool:
        r = self.rollout
        return r is not None and r.state == "warming" and r.to_version == version

    def with_share(self, rollout: Rollout) -> TrafficSplit:
        """The split that `rollout`'s state puts in force."""
        weights = dict(self.weights)
        new = rollout.share_pct
        for v in weights:
            if v not in (rollout.from_version, rollout.to_version):
                weights[v] = 0
        weights[rollout.to_version] = new
        weights[rollout.from_version] = 100 - new
        return TrafficSplit(weights=weights, rollout=rollout)


def compose(
    deployment: DeploymentSpec, version: VersionRecord | None, split: TrafficSplit, number: int
) -> DeploymentSpec:
    """The spec a version's unit runs with (see the module docstring)."""
    fields = {f: getattr(version.spec, f) for f in VERSION_FIELDS} if version else {}
    spec = msgspec.structs.replace(deployment, name=unit_name(deployment.name, number), **fields)
    if split.warming(number):
        # Warmed before any traffic moves: one runner comes up and waits for its first.
        return msgspec.structs.replace(spec, min_replicas=max(1, spec.min_replicas))
    if split.weights.get(number, 0) == 0:
        return msgspec.structs.replace(
            spec,
            min_replicas=0,
            idle_timeout_s=min(spec.idle_timeout_s, RETIRED_IDLE_S),
            scaling=RETIRED_SCALING,
        )
    return spec


def route_point(route_key: str | None) -> int:
    """Where a request falls in [0, 10000): a stable hash of the caller's key, so the same
    key keeps landing on the same version while shares ramp up, or random without one."""
    if not route_key:
        return random.randrange(_POINTS)  # noqa: S311 (traffic splitting, not security)
    digest = hashlib.sha256(route_key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % _POINTS


def pick_version(weights: dict[int, int], point: int) -> int:
    """The version whose share covers `point`. Newer versions take the top of the range,
    so a growing share of a new version only ever takes keys from older ones."""
    live = sorted((v, w) for v, w in weights.items() if w > 0)
    if not live:
        return max(weights) if weights else 1
    upper = _POINTS
    for version, weight in sorted(live, reverse=True):
        upper -= weight * _POINTS // 100
        if point >= upper:
            return version
    return live[0][0]
