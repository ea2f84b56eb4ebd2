"""Prefix-aware claiming on the real engine: median time to first token of requests that
share long prompt prefixes, served by two runners, with prefix-aware claiming and without.

    .venv/bin/python -m bench.prefix [--sessions 12 --turns 4 --concurrency 2] [--fake]
                                     [--affinity-ms 500]

Each session has its own ~1,000-token system prompt; its turns arrive interleaved with
the other sessions' in a fixed shuffled order. Plain claiming spreads a session's turns
over both runners, so each runner prefills each system prompt once; prefix-aware
claiming keeps a session on the runner that holds its prefix in vLLM's prefix cache.
Both contenders run the same workload, one platform each (EBB_PREFIX_AFFINITY_MS
`--affinity-ms`, the platform's default unless given, and 0), in the same run. Beside the
TTFTs, the share of prompt tokens the runners found in their prefix caches (what affinity
changes, whatever a prefill costs on this machine). With `--fake`, the fake engine stands
in for vLLM: it models a prefix cache (a prefill costs `prefill_ms_per_1k_tokens` for the
prompt tokens its recent prompts do not cover), so the same comparison runs in seconds
without weights.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys

import httpx

from bench.loadgen import save_results, stream_one
from bench.serving import KV_CACHE_GIB, REPO

sys.path.insert(0, str(REPO / "tests"))

from support import TEST_WEIGHTS_DIR, Platform, temp_home, wait_until  # noqa: E402
from support.metrics import scrape  # noqa: E402

from ebb.config import DEFAULT_MODEL_SOURCE, Settings  # noqa: E402

SENTENCES = [
    "The archive keeps every letter the lighthouse keepers wrote since the first lamp.",
    "Each keeper recorded the weather, the ships that passed and the state of the lens.",
    "Storms are described in detail, with the hour they began and the damage they left.",
    "Visitors were rare, and each one is named along with the reason for the visit.",
]


def system_prompt(session: int) -> str:
    """About 1,000 tokens, different from every other session's from the first token."""
    rng = random.Random(session)
    lines = [f"Session {session}: you answer questions about archive volume {session}."]
    lines += [rng.choice(SENTENCES) for _ in range(60)]
    return " ".join(lines)


def workload(sessions: int, turns: int) -> list[tuple[int, int]]:
    order = [(s, t) for s in range(sessions) for t in range(turns)]
    random.Random(7).shuffle(order)
    return order


def prefix_cache_tokens(platform: Platform) -> tuple[float, float]:
    """(prompt tokens looked up, of those found cached), summed over the runners' last
    reported stats (`/metrics`)."""
    with platform.admin() as admin:
        metrics = scrape(admin)
    return (
        metrics.value("ebb_prefix_cache_queried_tokens_total"),
        metrics.value("ebb_prefix_cache_hit_tokens_total"),
    )


def settled_hit_ratio(platform: Platform) -> float:
    """The runners' prefix cache hit ratio once their stats (reported about every second)
    have stopped moving, i.e. cover every request of the run."""
    seen: list[tuple[float, float]] = []

    def steady() -> bool:
        seen.append(prefix_cache_tokens(platform))
        return len(seen) >= 2 and seen[-1] == seen[-2] and seen[-1][0] > 0

    wait_until(steady, 60, "the runners' prefix cache stats", poll_s=1.5)
    queried, hits = seen[-1]
    return hits / queried


async def run(platform: Platform, order: list[tuple[int, int]], concurrency: int) -> list[float]:
    url = platform.base_url + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {platform.admin_key}"}
    pending = iter(order)
    ttfts: list[float] = []
    async with httpx.AsyncClient(headers=headers, timeout=600) as client:

        async def worker() -> None:
            for session, turn in pending:
                body = {
                    "model": "smol",
                    "messages": [
                        {"role": "system", "content": system_prompt(session)},
                        {"role": "user", "content": f"What happened in year {turn + 1}?"},
                    ],
                    "max_tokens": 8,
                    "temperature": 0,
                    "stream": True,
                }
                ttfts.append((await stream_one(client, url, body)).ttft_s)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ttfts


# The fake engine's prefix cache: a prefill costs this per 1,000 prompt tokens it does not
# hold, none for cached ones. Its tokens are bytes (a session's system prompt is ~5,000),
# so an uncached one takes ~300 ms, about what the default model's does on these cores.
FAKE_SOURCE = "fake://m?ctx=16384&step_ms=5&prefill_ms_per_1k_tokens=60"


def start(affinity_ms: int, fake: bool) -> Platform:
    engine_env = (
        {"EBB_TEST_ENGINES": "1"}
        if fake
        else {"EBB_WEIGHTS_CACHE_DIR": str(TEST_WEIGHTS_DIR), "EBB_KV_CACHE_GIB": KV_CACHE_GIB}
    )
    platform = Platform(
        home=temp_home("ebb-bench-prefix-"),
        redis_url=None,
        env_extra={**engine_env, "EBB_PREFIX_AFFINITY_MS": str(affinity_ms)},
    ).start(timeout_s=600)
    with platform.admin() as admin:
        admin.post(
            "/v1/deployments",
            json={
                "name": "smol",
                "source": FAKE_SOURCE if fake else DEFAULT_MODEL_SOURCE,
                "min_replicas": 2,
                "max_replicas": 2,
                "idle_timeout_s": 3600,
                "max_model_len": 16384 if fake else 2048,
            },
        ).raise_for_status()
        wait_until(
            lambda: admin.get("/v1/deployments/smol").json()["replicas"]["ready"] == 2,
            900,
            "two ready runners",
            poll_s=0.5,
        )
    return platform


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument(
        "--affinity-ms",
        type=int,
        default=Settings.model_fields["prefix_affinity_ms"].default,
        help="EBB_PREFIX_AFFINITY_MS of the prefix-aware platform",
    )
    parser.add_argument(
        "--fake",
        action="store_true",
        help=f"the fake engine's prefix cache ({FAKE_SOURCE}) instead of vLLM's",
    )
    args = parser.parse_args()
    order = workload(args.sessions, args.turns)
    medians: dict[str, float] = {}
    means: dict[str, float] = {}
    hit_ratios: dict[str, float] = {}
    for name, affinity_ms in (("prefix-aware", args.affinity_ms), ("plain", 0)):
        platform = start(affinity_ms, args.fake)
        try:
            ttfts = asyncio.run(run(platform, order, args.concurrency))
            hit_ratios[name] = settled_hit_ratio(platform)
        finally:
            platform.stop()
        medians[name] = statistics.median(ttfts) * 1000
        means[name] = statistics.mean(ttfts) * 1000
        print(
            f"{name:>12}: TTFT median {medians[name]:.0f} ms, mean {means[name]:.0f} ms over "
            f"{len(ttfts)} requests; prompt tokens found in prefix caches "
            f"{hit_ratios[name]:.0%}"
        )
    ratio = medians["prefix-aware"] / medians["plain"]
    mean_ratio = means["prefix-aware"] / means["plain"]
    print(f"prefix-aware / plain TTFT: median {ratio:.2f}, mean {mean_ratio:.2f}")
    save_results(
        "prefix",
        {
            "args": vars(args),
            "median_ttft_ms": medians,
            "mean_ttft_ms": means,
            "prefix_cache_hit_ratio": hit_ratios,
            "ratio": ratio,
            "mean_ratio": mean_ratio,
        },
    )


if __name__ == "__main__":
    main()
