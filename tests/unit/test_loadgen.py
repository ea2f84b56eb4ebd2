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


def test_time_per_output_token_counts_the_tokens_after_the_first() -> None:
    # 11 tokens: the first at 0.1 s, the ten after it by 1.1 s.
    assert Sample(ttft_s=0.1, latency_s=1.1, completion_tokens=11).tpot_s == 0.1
    assert Sample(ttft_s=0.1, latency_s=0.1, completion_tokens=1).tpot_s is None
    result = LevelResult(
        concurrency=2,
        wall_s=1.0,
        samples=[
            Sample(ttft_s=0.1, latency_s=1.1, completion_tokens=11),
            Sample(ttft_s=0.1, latency_s=2.1, completion_tokens=11),
            Sample(ttft_s=0.1, latency_s=0.1, completion_tokens=1),
        ],
    )
    assert round(result.median_tpot_ms, 6) == 150.0, "the one-token reply has no TPOT"
