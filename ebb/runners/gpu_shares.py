"""Each held request's share of the engine's time, so that work thrown away is told to the
GPU meter as wasted rather than serving (ebb/billing/gpu_split.py).

A step's time is shared evenly among the requests the runner held during it (a batch step
computes for all of them). Thrown away, on this runner:
- a continuation's replay: what it took to prefill the output another runner had already
  produced (a lost runner's, or a job attempt given back), up to its first new token;
- a job attempt given back whose output is dropped (not replayable), and a request that
  failed (the engine refused or broke): all its share.
Used on the serving thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class GpuShares:
    def __init__(self) -> None:
        self._ms: dict[str, float] = {}
        self._replaying: set[str] = set()
        # Told the milliseconds of engine time thrown away (the runner's GPU meter).
        self.on_waste: Callable[[float], None] = lambda ms: None

    def stepped(self, seconds: float, held: Iterable[str]) -> None:
        """One engine step of `seconds` ran for the requests in `held`."""
        ids = list(held)
        share_ms = seconds * 1000 / len(ids) if ids else 0.0
        self._ms = {rid: self._ms.get(rid, 0.0) + share_ms for rid in ids}

    def replaying(self, request_id: str) -> None:
        """`request_id` continues another runner's output: its prefill redoes that work."""
        self._replaying.add(request_id)

    def produced(self, request_id: str) -> None:
        """`request_id` produced output this step: a replay's prefill is over."""
        if request_id in self._replaying:
            self._replaying.discard(request_id)
            self.on_waste(self._ms.get(request_id, 0.0))

    def ended(self, request_id: str, *, thrown_away: bool) -> None:
        """`request_id` left this runner; `thrown_away`: none of its work counts."""
        self._replaying.discard(request_id)
        ms = self._ms.pop(request_id, 0.0)
        if thrown_away and ms:
            self.on_waste(ms)
