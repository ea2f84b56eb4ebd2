"""Frontdoor rolling restart under load: streams cut (target 0).

    .venv/bin/python -m bench.frontdoor_roll [--clients 8] [--tokens 150] [--rounds 2]
        [--drain-s 30] [--workers 1]

`ebb up` (fake engine, 20 ms a token) plus two more frontdoors on its Redis behind a
round-robin client-side "load balancer". Clients stream chat completions back to back
while each frontdoor in turn is taken out of the balancer, SIGTERMed (it drains:
EBB_FRONTDOOR_DRAIN_S) and replaced by a new one, `--rounds` times over. A stream counts
as cut when its connection breaks or it ends without `[DONE]` and its whole text; a cut
stream is then resumed on another frontdoor (`Last-Event-ID`), which says whether its
client could still have had the rest. Connection refusals (a request that reached a
stopping frontdoor's port) are retried on the other and counted apart.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass, field

import httpx

from bench.serving import REPO

sys.path.insert(0, str(REPO / "tests"))

from support import Platform, deploy, temp_home, wait_until  # noqa: E402
from support.frontdoors import Frontdoor, chat_text, sse_events, start_frontdoor  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@dataclass
class Tally:
    completed: int = 0
    cut: int = 0
    resumed_whole: int = 0
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


class Balancer:
    """The frontdoors in service, taken in turn."""

    def __init__(self, frontdoors: list[Frontdoor]):
        self._lock = threading.Lock()
        self.frontdoors = list(frontdoors)
        self._turn = itertools.count()

    def pick(self) -> str:
        with self._lock:
            return self.frontdoors[next(self._turn) % len(self.frontdoors)].url

    def replace(self, old: Frontdoor, new: Frontdoor | None) -> None:
        with self._lock:
            self.frontdoors.remove(old)
            if new is not None:
                self.frontdoors.append(new)


def one_stream(balancer: Balancer, key: str, tokens: int, tally: Tally) -> None:
    body = {"model": "roll", "messages": MESSAGES, "max_tokens": tokens, "stream": True}
    # Resumable: ask for event ids, to resume from the last one seen.
    headers = {"Authorization": f"Bearer {key}", "X-Ebb-Resumable": "1"}
    events: list = []
    request_id = ""
    while True:
        url = balancer.pick()
        try:
            with (
                httpx.Client(base_url=url, timeout=120, headers=headers) as c,
                c.stream("POST", "/v1/chat/completions", json=body) as r,
            ):
                request_id = r.headers.get("x-request-id", "")
                for event in sse_events(r):
                    events.append(event)
            break
        except httpx.ConnectError:
            tally.add(refused=1)
        except httpx.TransportError:
            break  # cut mid-stream
    if events and events[-1].data == "[DONE]" and len(chat_text(events)) == tokens:
        tally.add(completed=1)
        return
    tally.add(cut=1)
    if request_id and events:
        with httpx.Client(base_url=balancer.pick(), timeout=120, headers=headers) as c:
            rest = c.get(
                f"/v1/chat/completions/{request_id}/stream",
                headers={"Last-Event-ID": events[-1].id or ""},
            )
        if len(chat_text(events + list(sse_events(rest)))) == tokens:
            tally.add(resumed_whole=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--drain-s", type=int, default=30)
    parser.add_argument("--workers", type=int, default=1, help="EBB_FRONTDOOR_WORKERS")
    args = parser.parse_args()
    os.environ["EBB_TEST_ENGINES"] = "1"  # fake:// sources, for every process started
    platform = Platform(home=temp_home("ebb-bench-roll-"), redis_url=None).start()
    env = {
        "EBB_FRONTDOOR_DRAIN_S": str(args.drain_s),
        "EBB_FRONTDOOR_WORKERS": str(args.workers),
    }
    try:
        with platform.admin() as admin:
            deploy(admin, "roll", "fake://m?step_ms=20", idle_timeout_s=300)
            key = admin.post("/v1/keys", json={"tenant": "t-roll"}).json()["key"]
        names = itertools.count()
        balancer = Balancer([start_frontdoor(platform, f"fd{next(names)}", **env) for _ in "ab"])
        tally, stop = Tally(), threading.Event()

        def client() -> None:
            while not stop.is_set():
                one_stream(balancer, key, args.tokens, tally)

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for t in threads:
            t.start()
        wait_until(lambda: tally.completed >= args.clients, 120, "load to be running")
        exit_codes = []
        for _ in range(args.rounds):
            for old in list(balancer.frontdoors):
                balancer.replace(old, start_frontdoor(platform, f"fd{next(names)}", **env))
                exit_codes.append(old.stop(signal.SIGTERM, timeout_s=args.drain_s + 30))
        stop.set()
        for t in threads:
            t.join(timeout=300)
        for frontdoor in balancer.frontdoors:
            frontdoor.stop()
    finally:
        platform.stop()
    print(
        json.dumps(
            {
                "restarts": len(exit_codes),
                "clients": args.clients,
                "workers_per_frontdoor": args.workers,
                "drain_s": args.drain_s,
                "tokens_per_stream": args.tokens,
                "streams_completed": tally.completed,
                "streams_cut": tally.cut,
                "cut_then_resumed_whole": tally.resumed_whole,
                "connections_refused_then_retried": tally.refused,
                "frontdoor_exit_codes": sorted(set(exit_codes)),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
