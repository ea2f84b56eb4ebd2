"""A small closed-loop load generator for OpenAI-compatible chat endpoints.

Each of `concurrency` workers sends streamed chat requests back to back until `requests`
have been sent; per request it records the time to the first content token, the total
latency and the completion tokens the server reported in its usage chunk. From those, the
time per output token after the first (TPOT, as vLLM's own benchmarks define it).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

TOPICS = [
    "a lighthouse",
    "the moon",
    "a lost cat",
    "coffee",
    "a river",
    "mountains",
    "robots",
    "a library",
    "winter",
    "the ocean",
    "a train",
    "a garden",
    "music",
    "a storm",
    "friendship",
    "a city at night",
]


@dataclass
class Sample:
    ttft_s: float
    latency_s: float
    completion_tokens: int

    @property
    def tpot_s(self) -> float | None:
        """The time per output token after the first; None for a reply of one token."""
        if self.completion_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.completion_tokens - 1)


@dataclass
class LevelResult:
    concurrency: int
    wall_s: float
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0

    @property
    def requests_per_s(self) -> float:
        return len(self.samples) / self.wall_s

    @property
    def output_tokens_per_s(self) -> float:
        return sum(s.completion_tokens for s in self.samples) / self.wall_s

    @property
    def median_ttft_ms(self) -> float:
        return statistics.median(s.ttft_s for s in self.samples) * 1000

    @property
    def median_tpot_ms(self) -> float | None:
        tpots = [t for s in self.samples if (t := s.tpot_s) is not None]
        return statistics.median(tpots) * 1000 if tpots else None

    @classmethod
    def pooled(cls, rounds: list[LevelResult]) -> LevelResult:
        """Several runs of one level as one: their samples over their summed wall time."""
        return cls(
            concurrency=rounds[0].concurrency,
            wall_s=sum(r.wall_s for r in rounds),
            samples=[s for r in rounds for s in r.samples],
            errors=sum(r.errors for r in rounds),
        )

    def summary(self) -> dict:
        return {
            "concurrency": self.concurrency,
            "requests": len(self.samples),
            "errors": self.errors,
            "requests_per_s": round(self.requests_per_s, 3),
            "output_tokens_per_s": round(self.output_tokens_per_s, 2),
            "median_ttft_ms": round(self.median_ttft_ms, 1),
            "median_tpot_ms": None if (tpot := self.median_tpot_ms) is None else round(tpot, 2),
        }


def chat_body(model: str, i: int, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Write a short story about {TOPICS[i % 16]}."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_one(client: httpx.AsyncClient, url: str, body: dict) -> Sample:
    start = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if (
                ttft is None
                and chunk.get("choices")
                and chunk["choices"][0]["delta"].get("content")
            ):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter() - start
    return Sample(ttft_s=ttft if ttft is not None else end, latency_s=end, completion_tokens=tokens)


async def run_level(
    base_url: str,
    api_key: str,
    model: str,
    *,
    concurrency: int,
    requests: int,
    max_tokens: int,
) -> LevelResult:
    url = base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=concurrency + 4)
    counter = iter(range(requests))
    result = LevelResult(concurrency=concurrency, wall_s=0.0)
    async with httpx.AsyncClient(headers=headers, timeout=300, limits=limits) as client:

        async def worker() -> None:
            for i in counter:
                try:
                    result.samples.append(
                        await stream_one(client, url, chat_body(model, i, max_tokens))
                    )
                except httpx.HTTPError:
                    result.errors += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - start
    return result


def save_results(name: str, payload: dict) -> Path:
    """Write a run's results to bench/results/NAME-TIMESTAMP.json and say where."""
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(payload, indent=2))
    print(f"results: {path}")
    return path
