"""What every GPU-second bought, per tenant and deployment: the split by use
(`gpu_split.py`), the design's yardstick (output tokens per GPU-second) and what a million
output tokens cost once the idle, loading and wasted GPU time is counted in.

Every figure comes from the same hourly aggregates as the usage report, so the seconds by
use of a row add up to its metered seconds, and its costs by use to its cost, exactly.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ebb.billing.entries import split_field
from ebb.billing.gpu_split import USES, allocate, use_metric
from ebb.billing.pricing import divide_half_up

Aggregates = dict[int, dict[str, int]]
_SUMMED = ("gpu_ms", "completion_tokens", *(use_metric(u) for u in USES))


def gpu_cost_rows(
    aggregates: Aggregates,
    start_ms: int,
    end_ms: int,
    tenant: str | None,
    gpu_second_cost_micros: int,
) -> list[dict[str, Any]]:
    """One row per (tenant, deployment) with GPU time in [start_ms, end_ms) (`tenant`:
    that tenant's only; None: every tenant's), sorted. A row's tenant is the one billed
    for the GPU time (the deployment's owner); its output tokens are the deployment's,
    whoever called it (of those the query sees), since the GPUs produced them all."""
    sums: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: dict.fromkeys(_SUMMED, 0))
    output: dict[str, int] = defaultdict(int)
    for hour_ms, counts in aggregates.items():
        if not start_ms <= hour_ms < end_ms:
            continue
        for name, n in counts.items():
            owner, deployment, metric = split_field(name)
            if tenant is not None and owner != tenant:
                continue
            if metric == "completion_tokens":
                output[deployment] += n
            elif metric in _SUMMED:
                sums[(owner, deployment)][metric] += n
    for (_, deployment), counts in sums.items():
        counts["completion_tokens"] = output[deployment]
    return [
        cost_row(owner, deployment, counts, gpu_second_cost_micros)
        for (owner, deployment), counts in sorted(sums.items())
        if counts["gpu_ms"]
    ]


def cost_row(
    tenant: str, deployment: str, counts: dict[str, int], gpu_second_cost_micros: int
) -> dict[str, Any]:
    """One row of `gpu_cost_rows` from its summed metrics."""
    gpu_ms, output = counts["gpu_ms"], counts["completion_tokens"]
    ms_by_use = {u: counts[use_metric(u)] for u in USES}
    per_1m: int | None = None
    per_1m_by_use: dict[str, int] | None = None
    if output and gpu_second_cost_micros:
        # Every GPU-second the deployment held, whatever it bought, over its output.
        per_1m = divide_half_up(gpu_ms * gpu_second_cost_micros * 1000, output)
        per_1m_by_use = allocate(per_1m, ms_by_use)
    return {
        "tenant": tenant,
        "deployment": deployment,
        "gpu_ms": gpu_ms,
        "gpu_seconds": round(gpu_ms / 1000, 3),
        "gpu_ms_by_use": ms_by_use,
        "share_by_use": {u: round(ms / gpu_ms, 4) for u, ms in ms_by_use.items()},
        "completion_tokens": output,
        "tokens_per_gpu_second": round(output * 1000 / gpu_ms, 3),
        "tokens_per_serving_gpu_second": (
            round(output * 1000 / ms_by_use["serving"], 3) if ms_by_use["serving"] else None
        ),
        "gpu_second_cost_micros": gpu_second_cost_micros,
        "gpu_cost_micros_per_1m_output_tokens": per_1m,
        "gpu_cost_micros_per_1m_output_tokens_by_use": per_1m_by_use,
    }


def unsplit_gpu_ms(aggregates: Aggregates) -> list[tuple[int, str, int, int]]:
    """(hour, "tenant|deployment", GPU ms by use summed, GPU ms metered) wherever the two
    differ: the split must account for every metered GPU-millisecond."""
    gaps = []
    for hour_ms, counts in sorted(aggregates.items()):
        pairs: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for name, n in counts.items():
            owner, deployment, metric = split_field(name)
            if metric == "gpu_ms":
                pairs[f"{owner}|{deployment}"][1] += n
            elif metric in _SUMMED and metric != "completion_tokens":
                pairs[f"{owner}|{deployment}"][0] += n
        gaps += [(hour_ms, who, used, gpu) for who, (used, gpu) in pairs.items() if used != gpu]
    return gaps
