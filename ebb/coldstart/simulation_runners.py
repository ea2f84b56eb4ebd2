"""Simulated runner processes: a `Launcher` (and `WarmStarts`) whose runners start,
serve and drain on a `ManualClock` against an `InMemoryState`.

What a runner does is the platform's: it comes up through its tier, a stem joins the pool
and loads the deployment it is assigned, it claims queued requests into its free batch
slots (leaving one for a peer with more room, as claim.lua does: `claim_balance`), and,
holding nothing, decides to drain with the runner's own `idle_action` and the atomic
guard of try_drain.lua (`InMemoryState.try_drain`). What is modelled: a request takes
prompt / prefill rate + output / decode rate seconds however many share the batch, and a
start takes its tier's time. Engines here have no sleep mode (the CPU case)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ebb.coldstart.clock import ManualClock
from ebb.coldstart.fork_client import Exit
from ebb.coldstart.scaling_tracker import Latency
from ebb.coldstart.simulation_state import InMemoryState, Queued
from ebb.coldstart.simulation_trace import TraceRequest
from ebb.launching.tiers import Tier, WarmState
from ebb.queue import keys
from ebb.queue.claim_balance import leaves_for_peer
from ebb.queue.schema import RunnerState
from ebb.runners.idle import IdleAction, idle_action

log = logging.getLogger(__name__)

# Called with each request a runner claims, and the runner.
ClaimObserver = Callable[[Queued, "SimRunner"], None]


@dataclass(frozen=True)
class RunnerModel:
    """How fast a runner serves and starts. Defaults: the default model on a 2-core CPU
    machine (bench.serving, bench.coldstart), rounded."""

    prefill_tokens_per_s: float = 2000.0
    decode_tokens_per_s: float = 25.0
    prewarmed_start_s: float = 2.0
    forked_start_s: float = 2.0
    fresh_start_s: float = 10.0
    # A new stem is usable this long after it is launched (imports), unless forked.
    stem_import_s: float = 8.0
    # The latency model's shape (`latency_model`): a fixed cost per prefill, and TPOT
    # growing by this much per other request in the batch (0: flat, the defaults).
    prefill_base_s: float = 0.0
    tpot_per_batch_s: float = 0.0

    def prefill_s(self, prompt_tokens: int) -> float:
        return self.prefill_base_s + prompt_tokens / self.prefill_tokens_per_s

    def tpot_s(self, batch: int) -> float:
        """Per output token with `batch` requests (itself included) in the batch."""
        return 1 / self.decode_tokens_per_s + self.tpot_per_batch_s * max(0, batch - 1)

    def service_s(self, request: TraceRequest, batch: int = 1) -> float:
        """Its time in a slot, taken at the batch it joined for its whole decode."""
        return self.prefill_s(request.prompt_tokens) + request.output_tokens * self.tpot_s(batch)

    def start_s(self, tier: str) -> float:
        return {Tier.PREWARMED: self.prewarmed_start_s, Tier.FORKED: self.forked_start_s}.get(
            Tier(tier), self.fresh_start_s
        )

    def cold_starts_ms(self) -> dict[str, dict[str, float]]:
        """The measured cold starts these speeds would leave behind (for Retry-After)."""
        tiers = (Tier.PREWARMED, Tier.FORKED, Tier.FRESH)
        return {tier.value: {"total": self.start_s(tier) * 1000} for tier in tiers}


# The latency model's constants fitted on the real engine by `bench.latency_calibrate`
# (vLLM on CPU, the default model, random prompts of 16-768 tokens, batches of 1-16, on
# this 2-core machine while others ran): TTFT 4.71 ms per prompt token (the fitted
# intercept, -0.09 s, taken as 0), TPOT 77.6 ms + 8.0 ms per request in the batch. Its
# prefill is ~10x slower than `RunnerModel`'s defaults (bench.serving's, through the
# HTTP API on a quieter machine); `bench.autoscale --runner calibrated` runs on it, and
# `from_calibration` gives it from that run's file (tests/unit/test_autoscale_runner_file).
CALIBRATED = RunnerModel(
    prefill_tokens_per_s=1 / 0.0047141,
    decode_tokens_per_s=1 / (0.0776 + 0.00799),
    tpot_per_batch_s=0.00799,
)


def from_calibration(calibration: Mapping[str, Any]) -> tuple[RunnerModel, str]:
    """The runner model a `bench.latency_calibrate` result gives, and where its start
    times came from.

    `calibration["constants"]` is the fitted lines: TTFT = `prefill_base_s` +
    `prefill_per_token_s` x prompt tokens (a negative intercept, a fitting artefact, is
    taken as 0) and TPOT = `tpot_base_s` + `tpot_per_batch_s` x batch. Start times come
    from `calibration["starts"]` (the engine's import and load, timed in-process) where
    the run measured them, else `RunnerModel`'s defaults. KeyError or ValueError when a
    constant is missing or not positive where it must be."""
    c = {k: float(v) for k, v in calibration["constants"].items()}
    if c["prefill_per_token_s"] <= 0 or c["tpot_base_s"] + c["tpot_per_batch_s"] <= 0:
        raise ValueError(f"calibrated constants give no positive speed: {c}")
    speeds = RunnerModel(
        prefill_tokens_per_s=1 / c["prefill_per_token_s"],
        prefill_base_s=max(0.0, c["prefill_base_s"]),
        # The model's TPOT is its rate's at a batch of 1, plus the slope per other request.
        decode_tokens_per_s=1 / (c["tpot_base_s"] + c["tpot_per_batch_s"]),
        tpot_per_batch_s=max(0.0, c["tpot_per_batch_s"]),
    )
    starts = calibration.get("starts")
    if not starts:
        return speeds, "start times: RunnerModel's defaults (the file measured none)"
    import_s, load_s = float(starts["engine_import_s"]), float(starts["engine_load_s"])
    model = replace(
        speeds,
        # A stem or a fork has the engine imported: it only loads; a fresh process does both.
        prewarmed_start_s=load_s,
        forked_start_s=load_s,
        fresh_start_s=import_s + load_s,
        stem_import_s=import_s,
    )
    return model, (
        f"start times: measured by the calibrate run (engine import {import_s:.2f} s, load "
        f"{load_s:.2f} s, in-process: without the runner process's own start)"
    )


@dataclass
class SimRunner:
    runner_id: str
    tier: Tier
    launched_s: float
    deployment: str = ""  # "" for a stem until it is assigned
    # When it joins the pool (a stem) or is READY (a runner with its deployment); a stem's
    # ready time is set once it is assigned.
    pooled_at_s: float | None = None
    ready_at_s: float | None = None
    ready: bool = False
    fails: bool = False  # fails while loading (a broken deployment)
    exited: bool = False
    busy_until_s: list[float] = field(default_factory=list)
    last_active_s: float = 0.0


class SimulatedLauncher:
    """Runners as `SimRunner`s; `forks` stands for a fork server that is up throughout
    (set `warm` to play it starting or down)."""

    def __init__(
        self,
        clock: ManualClock,
        state: InMemoryState,
        model: RunnerModel,
        *,
        forks: bool = True,
        failing: frozenset[str] = frozenset(),
        balance_wait_ms: int = 0,
    ):
        """`balance_wait_ms`: least-loaded claiming's wait (`EBB_CLAIM_BALANCE_MS`; 0:
        the runners claim in turn, the first in launch order first)."""
        self._clock, self._state, self.model = clock, state, model
        self.balance_wait_ms = balance_wait_ms
        self.warm = WarmState.READY if forks else WarmState.OFF
        # Deployments whose runners fail while loading.
        self.failing = failing
        self.procs: dict[str, SimRunner] = {}
        self._exits: list[Exit] = []
        self.launches: list[tuple[str, str | None, Tier]] = []
        state.cold_starts_ms = model.cold_starts_ms()

    # --- Launcher and WarmStarts ---------------------------------------------------------

    def launch(self, runner_id: str, deployment: str | None, tier: Tier) -> None:
        now = self._clock.now_s
        proc = SimRunner(runner_id, tier, now, deployment or "", fails=deployment in self.failing)
        if deployment is None:
            forked = self.warm is WarmState.READY
            proc.pooled_at_s = now if forked else now + self.model.stem_import_s
        else:
            proc.ready_at_s = now + self.model.start_s(tier)
        self.procs[runner_id] = proc
        self.launches.append((runner_id, deployment, tier))

    def poll(self) -> list[Exit]:
        exits, self._exits = self._exits, []
        return exits

    def alive(self, runner_id: str) -> bool:
        proc = self.procs.get(runner_id)
        return proc is not None and not proc.exited

    def stop_all(self, grace_s: float) -> None:
        for runner_id in list(self.procs):
            self.exit(runner_id, 0)

    def warm_state(self) -> WarmState:
        return self.warm

    # --- what the processes do ------------------------------------------------------------

    def exit(self, runner_id: str, code: int) -> None:
        """The process ends (its record says what it last wrote, if anything)."""
        proc = self.procs.pop(runner_id, None)
        if proc is not None:
            proc.exited = True
            self._exits.append(Exit(runner_id, code))

    def kill(self, runner_id: str) -> None:
        """SIGKILL: gone without a word in its record."""
        self.exit(runner_id, -9)

    def advance(self) -> None:
        """Starts that progressed by now: stems join the pool, assigned stems begin
        loading, loads finish (READY) or fail (FAILED, exit 1)."""
        now = self._clock.now_s
        for proc in list(self.procs.values()):
            if proc.ready:
                continue
            record = self._state.records[proc.runner_id]
            if proc.pooled_at_s is not None and proc.ready_at_s is None:
                if record.state is RunnerState.STARTING and now >= proc.pooled_at_s:
                    self._state.join_pool(proc.runner_id)
                elif record.deployment:  # assigned (the record's deployment was "")
                    assigned_s = self._clock.seconds_at(record.assigned_ms)
                    proc.ready_at_s = assigned_s + self.model.start_s(Tier.PREWARMED)
                    proc.deployment = record.deployment
                    proc.fails = record.deployment in self.failing
                    self._state.update_runner(proc.runner_id, state=RunnerState.LOADING)
            if proc.ready_at_s is not None and now >= proc.ready_at_s:
                self._come_up(proc)

    def _come_up(self, proc: SimRunner) -> None:
        if proc.fails:
            self._state.update_runner(
                proc.runner_id, state=RunnerState.FAILED, error="failed to load: simulated"
            )
            self._state.logs[proc.runner_id] = ["loading", "failed to load: simulated"]
            self.exit(proc.runner_id, 1)
            return
        proc.ready = True
        proc.last_active_s = self._clock.now_s
        self._state.update_runner(
            proc.runner_id, state=RunnerState.READY, ready_ms=self._clock.ms()
        )

    def serve(self, deployment: str, on_claim: ClaimObserver | None = None) -> list[str]:
        """One turn of each READY runner's serving loop: finish, claim, and, idle past
        the timeout, drain (exiting at once: it holds nothing). Returns who drained."""
        now = self._clock.now_s
        queue = self._state.queues.setdefault(deployment, deque())
        serving = [p for p in self.procs.values() if p.ready and p.deployment == deployment]
        for proc in serving:  # what ended by now, on every runner before any claims
            if proc.busy_until_s:
                proc.busy_until_s = [t for t in proc.busy_until_s if t > now]
                if not proc.busy_until_s:
                    proc.last_active_s = now
        drained: list[str] = []
        for proc in serving:
            draining = self._state.records[proc.runner_id].state is RunnerState.DRAINING
            if not draining:
                self._claim(proc, serving, queue, on_claim)
            self._state.held[proc.runner_id] = len(proc.busy_until_s)
            if not proc.busy_until_s and (draining or self._idle_drains(proc, deployment)):
                if draining:
                    self._exit_drained(proc)
                drained.append(proc.runner_id)
        return drained

    def _claim(
        self,
        proc: SimRunner,
        serving: list[SimRunner],
        queue: deque[Queued],
        on_claim: ClaimObserver | None,
    ) -> None:
        """As claim.lua: oldest first into the free slots, looking at no more than the
        free slots and `CLAIM_SCAN_EXTRA` more; a request left for the peer with the
        most room stays queued, in its place."""
        now = self._clock.now_s
        slots = self._state.deployments[proc.deployment].max_concurrency
        want = slots - len(proc.busy_until_s)
        peer_held = self._lightest_peer_held(proc, serving, slots)
        left: list[Queued] = []
        scanned = 0
        while queue and len(proc.busy_until_s) < slots and scanned < want + keys.CLAIM_SCAN_EXTRA:
            queued = queue.popleft()
            scanned += 1
            if peer_held is not None and leaves_for_peer(
                held_after=len(proc.busy_until_s) + 1,
                peer_held=peer_held + len(left),
                peer_room=slots - peer_held - len(left),
                waited_ms=(now - queued.enqueued_s) * 1000,
                wait_ms=self.balance_wait_ms,
            ):
                left.append(queued)
                continue
            batch = len(proc.busy_until_s) + 1
            proc.busy_until_s.append(now + self.model.service_s(queued.request, batch))
            proc.last_active_s = now
            self._record_first_token(proc.deployment, queued, now, batch)
            if on_claim is not None:
                on_claim(queued, proc)
        queue.extendleft(reversed(left))

    def _lightest_peer_held(
        self, proc: SimRunner, serving: list[SimRunner], slots: int
    ) -> int | None:
        """What the least-loaded other READY runner with room holds (None: none)."""
        held = [
            len(peer.busy_until_s)
            for peer in serving
            if peer is not proc
            and self._state.records[peer.runner_id].state is RunnerState.READY
            and len(peer.busy_until_s) < slots
        ]
        return min(held, default=None)

    def _record_first_token(self, deployment: str, queued: Queued, now: float, batch: int) -> None:
        """Its time to first token (queue wait and prefill) and per output token, with
        what a runner reports for the latency model."""
        request = queued.request
        first_s = now + self.model.prefill_s(request.prompt_tokens)
        self._state.served.append(
            Latency(
                deployment,
                self._clock.time() + (first_s - now),
                first_s - queued.enqueued_s,
                self.model.tpot_s(batch),
                prompt_tokens=request.prompt_tokens,
                completion_tokens=request.output_tokens,
                queue_s=now - queued.enqueued_s,
                batch_size=batch,
            )
        )

    def _exit_drained(self, proc: SimRunner) -> None:
        self._state.update_runner(
            proc.runner_id, state=RunnerState.EXITED, exited_ms=self._clock.ms()
        )
        self._state.held.pop(proc.runner_id, None)
        self.exit(proc.runner_id, 0)

    def _idle_drains(self, proc: SimRunner, deployment: str) -> bool:
        spec = self._state.deployments[deployment]
        action = idle_action(
            idle_s=self._clock.now_s - proc.last_active_s,
            idle_timeout_s=spec.idle_timeout_s,
            min_replicas=spec.min_replicas,
            serving_runners=lambda: self._state.serving_runner_count(deployment),
            supports_sleep=False,
        )
        if action is not IdleAction.DRAIN or not self._state.try_drain(deployment, proc.runner_id):
            return False
        # Nothing held: the drain is over as it begins; the runner records its exit.
        self._state.update_runner(
            proc.runner_id, state=RunnerState.EXITED, exited_ms=self._clock.ms()
        )
        self.exit(proc.runner_id, 0)
        return True
