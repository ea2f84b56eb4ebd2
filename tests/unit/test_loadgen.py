"""`bench/loadgen.py`: rounds of one level pooled into one result (`bench.serving --rounds`)."""

from __future__ import annotations

from bench.loadgen import LevelResult, Sample


def _samples(*ttfts_s: float) -> list[Sample]:
    return [Sample(ttft_s=t, latency_s=1.0, completion_tokens=10) for t in ttfts_s]


def test_rounds_pool_into_their_samples_over_their_summed_wall_time() -> None:
    first = LevelResult(concurrency=8, wall_s=2.0, samples=_samples(0.1, 0.2), errors=1)
    second = LevelResult(concurrency=8, wall_s=6.0, samples=_samples(0.3, 0.4, 0.5, 0.6))

    pooled = LevelResult.pooled([first, second])

    assert pooled.concurrency == 8
    # 6 requests in 8 s: not the mean of the rounds' rates (1.0 and 0.67 req/s).
    assert pooled.requests_per_s == 6 / 8
    assert pooled.output_tokens_per_s == 60 / 8
    assert pooled.median_ttft_ms == 350.0
    assert pooled.errors == 1
