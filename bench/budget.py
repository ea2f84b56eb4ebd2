"""Budget overshoot: 64 concurrent clients of one tenant across two frontdoors spend up to
its cap (target: overshoot <= the cost of one request).

    .venv/bin/python -m bench.budget [--clients 64] [--requests-per-budget 200]
        [--max-tokens 32] [--step-ms 2]

`ebb up` (fake engine) plus one more frontdoor on its Redis. A tenant gets a lifetime
budget worth `--requests-per-budget` requests at their maximum cost; `--clients` threads,
half on each frontdoor, send chat completions back to back (max_tokens varying from 1 to
`--max-tokens`, some stopping early, so real costs differ from what each reserved) until
every one of them is refused with 429 insufficient_quota. Then it reads what the tenant
spent (GET /v1/budgets, and the ledger's own usage records, which bill the same
requests) and prints the overshoot in money and in requests, beside the ideal: the
budget itself. A design that only checks spend before admitting (and charges at the
end) would overshoot by up to the requests in flight, here `--clients` of them; that
figure is printed as the baseline.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
from dataclasses import dataclass, field

import httpx

from bench.serving import REPO

sys.path.insert(0, str(REPO / "tests"))

from support import Platform, deploy, temp_home  # noqa: E402
from support.billing import new_key  # noqa: E402
from support.frontdoors import start_frontdoor  # noqa: E402

from ebb.billing.pricing import format_micros, token_cost_micros  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
IN_PRICE, OUT_PRICE = 1_000_000, 3_000_000  # micros per 1M tokens


@dataclass
class Tally:
    ok: int = 0
    refused: int = 0
    other: dict[int, int] = field(default_factory=dict)
    billed_micros: int = 0  # from each answer's usage, at the deployment's prices
    lock: threading.Lock = field(default_factory=threading.Lock)


def _client_loop(url: str, key: str, max_tokens: int, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"}) as c:
        while True:
            body = {"model": "bench-budget", "messages": MESSAGES,
                    "max_tokens": rng.randint(1, max_tokens)}  # fmt: skip
            if rng.random() < 0.3:
                body["stop"] = ["France"]
            response = c.post("/v1/chat/completions", json=body)
            with tally.lock:
                if response.status_code == 200:
                    usage = response.json()["usage"]
                    tally.ok += 1
                    tally.billed_micros += token_cost_micros(
                        usage["prompt_tokens"], usage["completion_tokens"], IN_PRICE, OUT_PRICE
                    )
                    continue
                if response.status_code == 429 and (
                    response.json()["error"]["code"] == "insufficient_quota"
                ):
                    tally.refused += 1
                    return
                tally.other[response.status_code] = tally.other.get(response.status_code, 0) + 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests-per-budget", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--step-ms", type=float, default=2.0)
    args = parser.parse_args()

    env = {"EBB_TEST_ENGINES": "1"}
    platform = Platform(home=temp_home("ebb-bench-budget-"), redis_url=None, env_extra=env).start()
    other = None
    try:
        with platform.admin() as admin:
            deploy(admin, "bench-budget", f"fake://m?step_ms={args.step_ms}",
                   idle_timeout_s=600, min_replicas=1,
                   price_per_1m_input_tokens_micros=IN_PRICE,
                   price_per_1m_output_tokens_micros=OUT_PRICE)  # fmt: skip
            probe = admin.post(
                "/v1/chat/completions",
                json={"model": "bench-budget", "messages": MESSAGES, "max_tokens": 1},
            ).json()
            prompt = probe["usage"]["prompt_tokens"]
            one_max = token_cost_micros(prompt, args.max_tokens, IN_PRICE, OUT_PRICE)
            amount = one_max * args.requests_per_budget
            key = new_key(admin, "bench-budget-t")
            response = admin.put(
                "/v1/tenants/bench-budget-t/limits", json={"budget": {"amount_micros": amount}}
            )
            response.raise_for_status()
        other = start_frontdoor(platform, "bench-budget-2")
        urls = [platform.base_url, other.url]
        tally = Tally()
        threads = [
            threading.Thread(
                target=_client_loop, args=(urls[i % 2], key, args.max_tokens, tally, i)
            )
            for i in range(args.clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with httpx.Client(base_url=platform.base_url, timeout=60) as c:
            spend = c.get("/v1/budgets", headers={"Authorization": f"Bearer {key}"}).json()["data"][
                0
            ]["budget"]
        _report(args, amount, one_max, spend, tally)
    finally:
        if other is not None:
            other.stop()
        platform.stop()


def _report(args: argparse.Namespace, amount: int, one_max: int, spend: dict, t: Tally) -> None:
    spent = spend["spent_micros"]
    over = max(0, spent - amount)
    unspent = amount - min(spent, amount)
    lines = [
        f"clients {args.clients} across 2 frontdoors, budget {format_micros(amount)} "
        f"({args.requests_per_budget} requests at their maximum {format_micros(one_max)})",
        f"admitted {t.ok}, refused insufficient_quota {t.refused}, other {t.other or 'none'}",
        f"spent (the budget's account) {format_micros(spent)}; billed from the answers' "
        f"usage {format_micros(t.billed_micros)}; still reserved {spend['reserved_micros']}",
        f"overshoot: {format_micros(over)} = {over / one_max:.3f} requests "
        f"(target <= 1 request = {format_micros(one_max)})",
        f"left unspent at the refusals: {format_micros(unspent)} "
        f"= {unspent / one_max:.2f} requests at their maximum",
        f"baseline (a check-then-charge design): up to {args.clients} requests "
        f"= {format_micros(args.clients * one_max)} over",
    ]
    print("\n".join(lines))
    verdict = "PASS" if over <= one_max and spent == t.billed_micros else "FAIL"
    print(
        f"{verdict}: overshoot {over} micros <= {one_max}; the budget's spend equals billed usage"
    )


if __name__ == "__main__":
    main()
