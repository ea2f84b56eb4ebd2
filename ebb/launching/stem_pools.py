"""Pre-warmed capacity per node pool: how many stems each pool keeps, and the GPUs one
runner takes.

A stem is a runner process with the engine imported and no model, waiting for an
assignment through Redis. On one host there is one pool (EBB_PREWARM stems, anywhere).
On a cluster the operator names node pools (a node label on Kubernetes, a custom
resource on Ray) and how many stems each keeps (EBB_STEM_POOLS); the controller keeps
each pool's count and refills the pool a stem left. A stem on a cluster holds its GPUs
from the start (a pod's or an actor's GPUs are fixed when it is created), so it serves
only deployments whose runners need at most the pool's GPUs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ebb.queue.schema import DeploymentSpec

DEFAULT_POOL = ""
_EXAMPLE = '{"a100": {"stems": 2, "gpus": 1}, "cpu": 1}'


@dataclass(frozen=True)
class StemPool:
    name: str  # DEFAULT_POOL: wherever the launcher's scheduler puts it
    stems: int
    gpus: int = 0  # what each stem of the pool requests (and a runner from it can use)

    def serves(self, gpus_needed: float) -> bool:
        """A stem of this pool can become a runner needing `gpus_needed` GPUs. The default
        pool's stems get their devices at assignment (local GPU placement), so they fit
        any need."""
        return self.name == DEFAULT_POOL or self.gpus >= gpus_needed


def parse_stem_pools(raw: str, *, prewarm: int) -> list[StemPool]:
    """EBB_STEM_POOLS as pools (sorted by name); empty: the default pool of `prewarm`.
    ValueError with the accepted form otherwise."""
    if not raw.strip():
        return [StemPool(DEFAULT_POOL, max(0, prewarm))] if prewarm > 0 else []
    try:
        parsed = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"EBB_STEM_POOLS must be JSON like {_EXAMPLE}") from e
    if not isinstance(parsed, dict):
        raise ValueError(f"EBB_STEM_POOLS must be a JSON object like {_EXAMPLE}")
    return [_pool(name, value) for name, value in sorted(parsed.items())]


def _pool(name: str, value: object) -> StemPool:
    if isinstance(value, dict):
        stems, gpus = value.get("stems", 0), value.get("gpus", 0)
        unknown = set(value) - {"stems", "gpus"}
    else:
        stems, gpus, unknown = value, 0, set()
    ok = (
        name
        and not unknown
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (stems, gpus))
    )
    if not ok:
        raise ValueError(
            f"EBB_STEM_POOLS: pool {name!r} must name a count of stems, or "
            f'{{"stems": N, "gpus": G}} with whole numbers >= 0 (like {_EXAMPLE})'
        )
    return StemPool(name, int(stems), int(gpus))


def stems_wanted(raw: str, *, prewarm: int) -> int:
    """How many stems the controller keeps in all (`ebb up` is ready once they wait)."""
    return sum(p.stems for p in parse_stem_pools(raw, prewarm=prewarm))


def runner_gpus(spec: DeploymentSpec | None, default: float) -> float:
    """The GPUs one runner of `spec` asks its node for: its engine's tensor parallel size
    (vLLM runs one rank per device), else the platform's default; a stem (None) asks
    none beyond its pool's."""
    if spec is None:
        return 0
    return spec.engine.tensor_parallel_size or default
