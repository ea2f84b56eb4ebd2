"""Where a runner's GPU-seconds went: serving, loading, idle, asleep or wasted.

The split never changes what is metered, only names it. A GPU segment (meter_gpu.lua)
keeps its exact length, measured on Redis's clock; the runner's own clock decides only the
proportions (`PhaseClock`), which the ledger turns into whole GPU-milliseconds with
`allocate`: largest remainders, so the five uses of every ledger entry add up to its
`gpu_ms` exactly, and so do their sums over hours, deployments and tenants.

The uses, in the runner's time since launch (× the GPUs it holds):
- loading: from launch to READY (the engine starting, weights loading), waking included;
- serving: READY or DRAINING and holding at least one request (tokens being produced);
- idle: READY or DRAINING with nothing held, and a pre-warmed stem waiting in the pool;
- asleep: SLEEPING (vLLM sleep mode);
- wasted: work that bought nothing. A runner launched for demand (its deployment's
  `min_replicas` is 0) that never held a request from launch to exit (a cold start
  refused or drained before it served, a deployment deleted under it): its whole life.
  The time a segment no runner accounted for (the controller closing a runner that
  died, from its last heartbeat): the requests it held were lost with it.
  And serving time thrown away (`PhaseClock.waste`, from `ebb/runners/gpu_shares.py`):
  a continuation's replayed prefill, a job attempt given back without its output, a
  request that failed.

A runner's time before it first holds a request is undecided (it may yet be wasted), so
the runner holds that time back from the ledger until it serves, exits, or has been idle
past its deployment's idle timeout (then only `min_replicas` keeps it). Capacity kept on
purpose is never undecided: a stem in the pre-warmed pool, a runner of a deployment with
`min_replicas` (`PhaseClock.keep`); its time is loading and idle as it goes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from ebb.queue.schema import RunnerState

USES = ("serving", "loading", "idle", "asleep", "wasted")
WASTED = "wasted"


def use_metric(use: str) -> str:
    """The aggregate metric holding a use's GPU-milliseconds (× GPUs), e.g. gpu_idle_ms."""
    return f"gpu_{use}_ms"


USE_METRICS = tuple(use_metric(u) for u in USES)


def allocate(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split the integer `total` in proportion to `weights` (keys among USES), exactly:
    the parts are whole, never negative, and add up to `total`. Rounding goes to the
    largest remainders (ties in USES order). No positive weight: all of it is wasted."""
    shares = {u: float(weights.get(u, 0)) for u in USES if weights.get(u, 0) > 0}
    if total <= 0:
        return dict.fromkeys(USES, 0)
    if not shares:
        return {u: total if u == WASTED else 0 for u in USES}
    whole = sum(shares.values())
    exact = {u: total * w / whole for u, w in shares.items()}
    parts = {u: int(exact.get(u, 0)) for u in USES}
    short = total - sum(parts.values())
    by_remainder = sorted(exact, key=lambda u: (-(exact[u] - parts[u]), USES.index(u)))
    for use in by_remainder[:short]:
        parts[use] += 1
    return parts


def use_of(state: RunnerState, holding: bool) -> str:
    """The use of a runner's time in `state`, holding requests or not."""
    if state is RunnerState.LOADING:
        return "loading"
    if state is RunnerState.SLEEPING:
        return "asleep"
    if state in (RunnerState.READY, RunnerState.DRAINING) and holding:
        return "serving"
    return "idle"


class PhaseClock:
    """A runner's own account of its time by use, between two takes (thread-safe: the
    lifecycle, the heartbeat and the meter tell it from their own threads).

    `enter(use)` closes the time since the last mark into the current use and switches;
    `take()` hands over what was counted since the last take. Until the runner first
    serves, the time is undecided: `take(final=True)` at exit books it all as wasted.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._use = "idle"
        self._mark = clock()
        self._entered = self._mark  # when the current use began
        self._counted: dict[str, float] = {}
        self._waste_ms = 0.0  # serving time thrown away, not yet moved to wasted
        self.served = False
        self.kept = False  # capacity kept on purpose: never wasted for want of serving

    @property
    def use(self) -> str:
        return self._use

    def enter(self, use: str) -> None:
        with self._lock:
            self._close_locked()
            if use != self._use:
                self._entered = self._mark
            self._use = use
            if use == "serving":
                self.served = True

    def waste(self, ms: float) -> None:
        """`ms` of the serving time counted (or about to be) bought nothing: it moves to
        wasted at the next takes, never more than they counted as serving."""
        with self._lock:
            self._waste_ms += max(0.0, ms)

    def idle_s(self) -> float:
        """How long the runner has been idle without a break (0 when it is not idle)."""
        return self._clock() - self._entered if self._use == "idle" else 0.0

    def keep(self) -> None:
        """From now on (and for the time so far) the runner is capacity kept on purpose."""
        self.kept = True

    def take(self, *, final: bool = False) -> dict[str, int]:
        """The milliseconds by use since the last take; at the runner's exit (`final`),
        a runner that never served (and was not kept) books them all as wasted."""
        with self._lock:
            self._close_locked()
            counted, self._counted = self._counted, {}
            moved = min(self._waste_ms, counted.get("serving", 0.0))
            self._waste_ms -= moved
        if moved:
            counted["serving"] -= moved
            counted[WASTED] = counted.get(WASTED, 0.0) + moved
        taken = {u: round(ms) for u, ms in counted.items() if round(ms) > 0}
        if final and not self.served and not self.kept:
            return {WASTED: sum(taken.values())} if taken else {WASTED: 1}
        return taken

    def restart_undecided(self) -> None:
        """The pool's time ends here (a stem assigned a deployment): undecided from now."""
        self.kept = False

    def _close_locked(self) -> None:
        now = self._clock()
        self._counted[self._use] = self._counted.get(self._use, 0.0) + (now - self._mark) * 1000
        self._mark = now
