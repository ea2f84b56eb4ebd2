"""Continuity: streams whose runner is SIGKILLed at a random token position.

    .venv/bin/python -m bench.continuity [--kills 100] [--cold-kills 10] [--tokens 150]
        [--source fake://c?step_ms=10] [--real]

`ebb up` (the fake engine by default; `--real` deploys the default model on vLLM, from
the weights the test session converted). Each trial streams a greedy answer of
`--tokens` tokens with logprobs and SIGKILLs the runner holding it after a random number
of chunks; the answer must go on on another runner (continuation by token replay).
Reported, per mode: streams completed (a finish_reason, no error event), duplicated and
missing tokens (tokens delivered against `--tokens`), the share of answers identical to
an uninterrupted one (baseline, same run), and the seam: the longest pause between two
chunks after the kill (median, p90, max). Modes: `warm`, a second ready runner takes the
continuation; `cold`, one runner: the continuation waits for a replacement to start.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field

import httpx

from bench.serving import REPO

sys.path.insert(0, str(REPO / "tests"))

from support import (  # noqa: E402
    TEST_WEIGHTS_DIR,
    Platform,
    deploy,
    deployment,
    temp_home,
    wait_until,
)

from ebb.config import DEFAULT_MODEL_SOURCE  # noqa: E402
from ebb.queue import keys  # noqa: E402

MESSAGES = [{"role": "user", "content": "Tell me about the capital of France."}]


@dataclass
class Trial:
    completed: bool
    delivered: int  # tokens delivered (logprob entries)
    text: str
    seam_s: float  # the longest pause between chunks after the kill


@dataclass
class Mode:
    name: str
    trials: list[Trial] = field(default_factory=list)

    def summary(self, reference: str, tokens: int) -> dict[str, object]:
        seams = sorted(t.seam_s for t in self.trials)
        n = len(self.trials)
        return {
            "kills": n,
            "streams_completed": sum(t.completed for t in self.trials),
            "duplicated_tokens": sum(max(0, t.delivered - tokens) for t in self.trials),
            "missing_tokens": sum(max(0, tokens - t.delivered) for t in self.trials),
            "greedy_identical_pct": round(
                100 * sum(t.text == reference for t in self.trials) / max(n, 1), 1
            ),
            "seam_s_median": round(statistics.median(seams), 3) if seams else None,
            "seam_s_p90": round(seams[int(0.9 * (n - 1))], 3) if seams else None,
            "seam_s_max": round(seams[-1], 3) if seams else None,
        }


def body(model: str, tokens: int) -> dict[str, object]:
    return {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": tokens,
        "temperature": 0,
        "logprobs": True,
        "stream": True,
    }


def ready(admin: httpx.Client, model: str) -> list[dict]:
    return [r for r in deployment(admin, model)["runners"] if r["state"] == "ready"]


def stream(
    platform: Platform, admin: httpx.Client, model: str, tokens: int, kill_after: int | None
) -> Trial:
    """One streamed answer; its runner SIGKILLed after `kill_after` content chunks."""
    text, delivered, completed, errored = [], 0, False, False
    times: list[float] = []
    killed_at: int | None = None
    with admin.stream("POST", "/v1/chat/completions", json=body(model, tokens), timeout=600) as r:
        request_id = r.headers["x-request-id"]
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:
                errored = True
                continue
            if not chunk.get("choices"):
                continue
            choice = chunk["choices"][0]
            logprobs = (choice.get("logprobs") or {}).get("content") or []
            if logprobs or choice["delta"].get("content"):
                times.append(time.perf_counter())
            text.append(choice["delta"].get("content") or "")
            delivered += len(logprobs)
            completed = completed or choice.get("finish_reason") is not None
            if kill_after is not None and killed_at is None and len(times) >= kill_after:
                kill_holder(platform, admin, model, request_id)
                killed_at = len(times)
    after_kill = times[(killed_at or 1) - 1 :]  # from the last chunk before it
    gaps = [b - a for a, b in itertools.pairwise(after_kill)]
    return Trial(completed and not errored, delivered, "".join(text), max(gaps, default=0.0))


def kill_holder(platform: Platform, admin: httpx.Client, model: str, request_id: str) -> None:
    holder = platform.redis().hget(keys.request(request_id), "runner")
    pids = [r["pid"] for r in ready(admin, model) if holder and r["id"] == holder.decode()]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def run_mode(
    platform: Platform,
    admin: httpx.Client,
    name: str,
    source: str,
    runners: int,
    kills: int,
    tokens: int,
    rng: random.Random,
) -> tuple[Mode, str]:
    """Deploy `runners` always-ready runners; the uninterrupted reference, then `kills`
    trials."""
    model = f"cont-{name}"
    deploy(admin, model, source, min_replicas=runners, max_replicas=runners, idle_timeout_s=600)
    wait_until(lambda: len(ready(admin, model)) == runners, 900, f"{runners} ready runners")
    reference = stream(platform, admin, model, tokens, None).text
    mode = Mode(name)
    for i in range(kills):
        trial = stream(platform, admin, model, tokens, rng.randint(1, tokens - 1))
        mode.trials.append(trial)
        print(f"continuity: {name} {i + 1}/{kills}: seam {trial.seam_s:.3f}s", flush=True)
        wait_until(lambda: len(ready(admin, model)) == runners, 900, "the runner replaced")
    admin.delete(f"/v1/deployments/{model}")
    return mode, reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=100, help="warm-mode kills")
    parser.add_argument("--cold-kills", type=int, default=10, help="cold-mode kills")
    parser.add_argument("--tokens", type=int, default=150)
    parser.add_argument("--source", default="fake://c?step_ms=10")
    parser.add_argument("--real", action="store_true", help="the default model on vLLM")
    parser.add_argument("--seed", type=int, default=36)
    args = parser.parse_args()
    source = DEFAULT_MODEL_SOURCE if args.real else args.source
    env = (
        {"EBB_WEIGHTS_CACHE_DIR": str(TEST_WEIGHTS_DIR)} if args.real else {"EBB_TEST_ENGINES": "1"}
    )
    platform = Platform(home=temp_home("ebb-continuity-"), redis_url=None, env_extra=env)
    platform.start(timeout_s=600)
    rng = random.Random(args.seed)
    results: dict[str, object] = {"source": source, "tokens": args.tokens}
    try:
        with platform.admin() as admin:
            for name, runners, kills in (("warm", 2, args.kills), ("cold", 1, args.cold_kills)):
                if kills:
                    mode, reference = run_mode(
                        platform, admin, name, source, runners, kills, args.tokens, rng
                    )
                    results[name] = mode.summary(reference, args.tokens)
    finally:
        platform.stop()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
