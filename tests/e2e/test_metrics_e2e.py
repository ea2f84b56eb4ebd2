"""Serving metrics from the real vLLM engine: a streamed request records TTFT and TPOT,
and a repeated long prompt shows up in the runner's prefix-cache figures."""

from __future__ import annotations

import pytest
from support import real_engine_platform, wait_until
from support.metrics import scrape

from ebb.config import DEFAULT_MODEL_NAME

pytestmark = pytest.mark.e2e

# Long enough to fill several KV-cache blocks, so a repeat finds whole blocks cached.
CONTEXT = " ".join(f"Fact {i}: the river number {i} flows into lake {i % 7}." for i in range(60))
QUESTION = [{"role": "user", "content": CONTEXT + " Which lake does river 12 flow into?"}]


@pytest.fixture(scope="module")
def platform(default_local_model):
    # A fresh runner imports vLLM and loads the model: admit for as long as that takes.
    with real_engine_platform(
        "ebb-e2e-metrics-", default_model=True, EBB_ADMISSION_TIMEOUT_S="300"
    ) as p:
        yield p


def test_real_engine_ttft_tpot_and_prefix_cache(platform, admin):
    client = platform.openai(timeout=300)
    before = scrape(admin)
    for _ in range(2):
        stream = client.chat.completions.create(
            model=DEFAULT_MODEL_NAME, messages=QUESTION, temperature=0, max_tokens=8, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    after = scrape(admin)
    labels = {"deployment": DEFAULT_MODEL_NAME}
    for name in ("ebb_time_to_first_token_seconds", "ebb_time_per_output_token_seconds"):
        assert after.value(name + "_count", **labels) == before.value(name + "_count", **labels) + 2
        assert after.value(name + "_sum", **labels) > before.value(name + "_sum", **labels)

    def prefix_hits():
        s = scrape(admin)
        return s.value("ebb_prefix_cache_hit_tokens_total", **labels) > 0 and s

    s = wait_until(prefix_hits, 30, "the real engine's prefix-cache hits on /metrics")
    assert 0 < s.value("ebb_prefix_cache_hit_ratio", **labels) < 1
    assert s.value("ebb_prefix_cache_queried_tokens_total", **labels) > s.value(
        "ebb_prefix_cache_hit_tokens_total", **labels
    )
    assert s.labels_of("ebb_kv_cache_usage_ratio"), "vLLM's KV-cache usage on /metrics"
