"""`ebb usage --costs`: where each deployment's GPU-seconds went (serving, loading, idle,
asleep, wasted), output tokens per GPU-second, and the GPU cost of 1M output tokens with
the idle and wasted time counted in (the API's `gpu_costs`, billing/gpu_costs.py)."""

from __future__ import annotations

from rich.table import Table

from ebb.billing.gpu_split import USES
from ebb.billing.pricing import format_micros
from ebb.cli.api import JsonObject


def gpu_costs_table(rows: list[JsonObject]) -> Table:
    table = Table(
        "tenant",
        "deployment",
        "GPU s",
        *(f"{use} s" for use in USES),
        "tokens / GPU s",
        "GPU cost / 1M output",
        "of it idle",
        "of it wasted",
    )
    for row in rows:
        ms = row["gpu_ms_by_use"]
        by_use = row["gpu_cost_micros_per_1m_output_tokens_by_use"]
        cost = row["gpu_cost_micros_per_1m_output_tokens"]
        table.add_row(
            row["tenant"],
            row["deployment"],
            f"{row['gpu_seconds']:.1f}",
            *(f"{ms[use] / 1000:.1f}" for use in USES),
            f"{row['tokens_per_gpu_second']:.2f}",
            "-" if cost is None else format_micros(cost),
            "-" if by_use is None else format_micros(by_use["idle"]),
            "-" if by_use is None else format_micros(by_use["wasted"]),
        )
    return table
