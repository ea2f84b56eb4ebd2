"""Request traces for the autoscaling simulator: the Azure LLM inference trace format."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def load_azure_trace(
    path: Path, *, start_s: float = 0.0, duration_s: float | None = None
) -> list[TraceRequest]:
    """The Azure LLM inference trace format (TIMESTAMP, ContextTokens, GeneratedTokens),
    arrivals in seconds from the trace's first request, cut to [start_s, start_s + duration_s)
    and shifted to start at 0."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    stamps = [_seconds(row["TIMESTAMP"]) for row in rows]
    first = min(stamps)
    end = math.inf if duration_s is None else start_s + duration_s
    requests = [
        TraceRequest(at - first - start_s, int(row["ContextTokens"]), int(row["GeneratedTokens"]))
        for at, row in zip(stamps, rows, strict=True)
        if start_s <= at - first < end
    ]
    return sorted(requests, key=lambda r: r.arrival_s)


def _seconds(stamp: str) -> float:
    # Seven fractional digits: more than datetime parses, so the fraction is added apart.
    whole, _, fraction = stamp.partition(".")
    parsed = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    return parsed.timestamp() + (float("0." + fraction) if fraction else 0.0)
