"""A base's GPU time shared among the LoRA adapters it served, by tokens: cost analysis
only (it moves no money; the base's owner pays the GPU time, as metered).

Each hour, the GPU-milliseconds metered to a base deployment (to its owner) are split
among the base's own requests and each adapter's in proportion to their tokens (prompt
plus completion, every caller's, in that hour), exactly: the parts are whole and add up
to the base's metered milliseconds (largest remainders). An hour with GPU time and no
tokens is the base's own. Which deployment is an adapter of which base comes from the
deployments as they are now: an adapter deleted since counts as its base's own.

A tenant sees the split of the bases it owns (its GPU time), with each adapter of
another tenant named by its identity, not by its name or owner.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ebb.billing.entries import split_field

Aggregates = dict[int, dict[str, int]]
_TOKENS = ("prompt_tokens", "completion_tokens")


@dataclass(frozen=True)
class AdapterOf:
    """An adapter deployment as the split needs it."""

    base: str
    owner: str
    uid: str


# (base owner, base, adapter or "" for the base's own requests)
_Key = tuple[str, str, str]


def adapter_gpu_rows(
    aggregates: Aggregates,
    start_ms: int,
    end_ms: int,
    adapters: Mapping[str, AdapterOf],
    viewer: str | None,
) -> list[dict[str, Any]]:
    """One row per (base, adapter or the base's own) in [start_ms, end_ms), for `viewer`
    (None: every tenant's bases, as the admin sees them)."""
    gpu_ms: dict[_Key, int] = defaultdict(int)
    tokens: dict[_Key, int] = defaultdict(int)
    served = {a.base for a in adapters.values()}
    for hour_ms, counts in aggregates.items():
        if start_ms <= hour_ms < end_ms:
            _split_hour(counts, adapters, served, gpu_ms, tokens)
    rows = []
    for key in sorted(gpu_ms):
        base_owner, base, adapter = key
        if viewer is not None and base_owner != viewer:
            continue
        rows.append(
            {
                "base": base,
                "base_owner": base_owner,
                **_adapter_fields(adapter, adapters, viewer),
                "tokens": tokens[key],
                "gpu_ms": gpu_ms[key],
                "gpu_seconds": round(gpu_ms[key] / 1000, 3),
            }
        )
    return rows


def _split_hour(
    counts: Mapping[str, int],
    adapters: Mapping[str, AdapterOf],
    served: set[str],
    gpu_ms: dict[_Key, int],
    tokens: dict[_Key, int],
) -> None:
    """Add one hour's split of every base's GPU time to `gpu_ms` (and the tokens it was
    split by to `tokens`)."""
    by_deployment: dict[str, int] = defaultdict(int)
    metered: dict[tuple[str, str], int] = defaultdict(int)
    for name, n in counts.items():
        owner, deployment, metric = split_field(name)
        if metric in _TOKENS:
            by_deployment[deployment] += n
        elif metric == "gpu_ms" and deployment in served:
            metered[(owner, deployment)] += n
    for (owner, base), total in metered.items():
        parties = {"": by_deployment.get(base, 0)}
        parties.update(
            {a: by_deployment.get(a, 0) for a, of in adapters.items() if of.base == base}
        )
        for party, part in split_by_weight(total, parties).items():
            gpu_ms[(owner, base, party)] += part
            tokens[(owner, base, party)] += parties[party]


def split_by_weight(total: int, weights: Mapping[str, int]) -> dict[str, int]:
    """`total` in whole parts proportional to `weights` (largest remainders, ties by
    key), adding up to `total`; no positive weight: all of it to the key "" (the base's
    own)."""
    whole = sum(w for w in weights.values() if w > 0)
    if whole <= 0:
        return dict.fromkeys(weights, 0) | {"": total}
    parts = {k: total * max(w, 0) // whole for k, w in weights.items()}
    short = total - sum(parts.values())
    remainders = sorted(weights, key=lambda k: (-(total * max(weights[k], 0) % whole), k))
    for key in remainders[:short]:
        parts[key] += 1
    return parts


def _adapter_fields(
    adapter: str, adapters: Mapping[str, AdapterOf], viewer: str | None
) -> dict[str, str | None]:
    """The adapter a row is about, as `viewer` may see it: its name and owner for the
    admin and the adapter's owner, its identity alone for the base's owner."""
    if not adapter:
        return {"adapter": None, "adapter_owner": None}
    of = adapters[adapter]
    if viewer is None or of.owner == viewer:
        return {"adapter": adapter, "adapter_owner": of.owner}
    return {"adapter": of.uid, "adapter_owner": None}
