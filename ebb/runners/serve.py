"""The serving loop of a READY runner: claim, batch, step, stream, finish, drain.

One thread runs it, numbered steps per iteration:
  1. claim up to the free batch slots (blocking briefly on the queue signal when idle;
     while busy, only when work was announced since a claim found the queues empty, or
     half a second passed, see `WorkNews`;
     async jobs only into slots no synchronous request wants, see `_job_limit`, a few per
     step, see `job_claims_per_step`; a job gives its slot back when a synchronous request
     finds none, see `_make_room`) and
     collect cancellations meant for this runner;
  2. add claimed requests to the engine, abort cancelled ones;
  3. run one engine step and publish every request's new output in one round trip;
  4. finish requests that completed (terminal event + usage, atomically, once);
  5. drain when idle past the deployment's timeout, or when asked to stop.

Steps 3 and 4 publish on their own thread (`OutputPublisher`) while `run()` runs, once the
next iteration's claim is made: the loop goes on to the next engine step meanwhile. It
waits for what it handed over before anything else that concerns its requests (giving a
job back, going idle, draining, sleeping, returning).

Burst mode (`run(burst=True)`, as arq's burst workers): the loop serves what is queued and
returns `Outcome.IDLE` the first time it is idle with nothing claimed, instead of waiting
for more work. Tests drive the loop in-process this way; runners never use it.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from ebb import tracing
from ebb.queue.continuation import remaining_sampling, replayable
from ebb.queue.gpu_records import GpuDevice
from ebb.queue.observations import RunnerStats
from ebb.queue.priority import critical_room, engine_batch_limit, rank
from ebb.queue.runner_side import ClaimResult, Ending, RunnerQueue
from ebb.queue.schema import (
    ChoiceDelta,
    DeploymentSpec,
    Failed,
    Finished,
    Progress,
    RunnerState,
    SamplingSpec,
    WorkItem,
)
from ebb.runners.adapters import RunnerAdapters
from ebb.runners.core_pinning import Pin
from ebb.runners.engine import (
    EngineAdapter,
    EngineRequestError,
    StepOutput,
    tenant_cache_salt,
)
from ebb.runners.gpu_shares import GpuShares
from ebb.runners.idle import IdleAction, idle_action
from ebb.runners.lifecycle import Lifecycle
from ebb.runners.publisher import OutputPublisher
from ebb.runners.stall import EngineProgress

log = logging.getLogger(__name__)

# How long an idle runner blocks on its queue signal before re-checking timeouts and stops.
_IDLE_WAIT_S = 0.5
# How often an idle runner re-reads its deployment (idle timeout, min replicas, deletion).
_SPEC_REFRESH_S = 2.0
# How often the runner publishes its engine's figures (KV cache, prefix cache, batch).
_STATS_INTERVAL_S = 1.0


_DELETED_MESSAGE = (
    "The deployment this request was sent to was deleted before it ran; it never ran."
)
# A continued request whose output so far cannot be replayed (several choices).
_LOST_UNREPLAYABLE = Failed(
    message="The runner serving this request stopped responding; the request was lost "
    "mid-generation. Retry it.",
    code="runner_lost",
    retryable=True,
)

# With EBB_JOB_SLOTS_BESIDE_SYNC, jobs keep to it until synchronous traffic has been
# quiet this long.
_SYNC_QUIET_S = 1.0


def job_slots(max_concurrency: int) -> int:
    """Batch slots async jobs may hold at once on one runner beside synchronous traffic.

    A quarter of the slots (rounded up) stays free for synchronous requests, which must be
    claimed within their admission window, while a job can wait hours; a runner with a
    single slot still runs jobs (claims prefer synchronous requests anyway). While no
    synchronous request is around, jobs may fill every slot (see `ServingLoop._job_limit`)."""
    return max(1, max_concurrency - math.ceil(max_concurrency / 4))


def job_claims_per_step(max_concurrency: int) -> int:
    """New job attempts a runner claims per iteration: an eighth of its slots (rounded up).

    Every request claimed is prefilled in the next engine step, and a synchronous request
    that arrives meanwhile waits for that step: a runner that took 32 jobs at once (a
    batch's first wave, or a wave of jobs that ended together) spent 2.8 s prefilling them
    on a CPU, where 4 take a tenth of that. Claimed a few per step, a batch still fills
    every slot within a few steps, and its prefills interleave with decoding."""
    return max(1, math.ceil(max_concurrency / 8))


def jobs_beside_sync(configured: int | None, gpus: int) -> int | None:
    """Job slots beside synchronous traffic (EBB_JOB_SLOTS_BESIDE_SYNC; None: `job_slots`).
    Unset, a runner without GPUs takes no new job beside a synchronous request: on a CPU
    every sequence in the batch slows every step, so a batch beside it would raise its
    time to first token by tens of percent; a GPU's decode step barely notices them."""
    if configured is not None:
        return configured
    return None if gpus else 0


class Outcome(enum.Enum):
    DRAINED = "drained"  # everything finished; the runner should exit
    SLEEP = "sleep"  # idle, parked as a sleeper: put the engine to sleep, wait to be woken
    IDLE = "idle"  # burst mode only: nothing queued, nothing held, not draining


@dataclass
class Held:
    work: WorkItem
    prompt_tokens: int = 0
    completion_tokens: int = 0
    published: int = 0  # Progress events published, numbering the next one
    # A continuation's: its attempt (numbering its Progress), and the output tokens its
    # prompt replays (counted as output, not prompt, in its usage).
    attempt: int = 0
    replayed: int = 0
    # For the request's trace (ns since the epoch): when claimed, when its first output.
    claimed_ns: int = 0
    first_output_ns: int | None = None
    # Requests in the batch, summed over the steps that gave it output (its mean batch size).
    batch_sum: int = 0
    batch_steps: int = 0


class ServingLoop:
    def __init__(
        self,
        queue: RunnerQueue,
        engine: EngineAdapter,
        spec: DeploymentSpec,
        stop: threading.Event,
        lifecycle: Lifecycle,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._queue = queue
        self._engine = engine
        self._spec = spec
        # The deployment it serves, for good: one created later under the same name is
        # another deployment (claims refuse, see claim.lua; so does a refreshed spec).
        self._uid = spec.uid
        self._stop = stop
        self._lifecycle = lifecycle
        self._clock = clock
        self.held: dict[str, Held] = {}
        self._draining = False
        self._sleeping = False
        self._last_active = clock()
        self._spec_read_at = clock()
        self._drain_checked_at = clock()
        self._stats_at = -math.inf
        # Called once, with the work item, when the next token this runner publishes is
        # out: the last phase of a cold start (set again after each wake-up).
        self.on_first_output: Callable[[WorkItem], None] | None = None
        # The figures of this runner's GPUs (NVML) for metrics; none on a CPU host. The
        # seam where a GPU inventory's reader plugs in.
        self.read_gpus: Callable[[], list[GpuDevice]] = list
        # The LoRA adapters its requests name (a base's runner; see ebb.runners.adapters).
        self.adapters = RunnerAdapters(Path(), limits=None)
        # Job slots while a synchronous request runs here (EBB_JOB_SLOTS_BESIDE_SYNC);
        # None: `job_slots` whatever runs. See `_job_limit`.
        self.jobs_beside_sync: int | None = None
        # Entered on the serving thread around each `run()`, once the publisher's thread
        # has started (it keeps the cores it had): where the engine computes. The seam
        # where the runner's core pinning plugs in (`core_pinning.own_core`).
        self.engine_thread_placement: Callable[[], AbstractContextManager[Pin | None]] = (
            contextlib.nullcontext
        )
        self._pin: Pin | None = None
        self._sync_seen_at = -math.inf  # the last claim or end of a synchronous request
        self._publisher = OutputPublisher(queue.publish)
        self._news = queue.work_news(spec.name)
        # Read by the heartbeat thread, whose watchdog ends a runner whose engine hangs.
        self.engine_progress = EngineProgress()
        # Each request's share of the engine's time: waste told to the GPU meter.
        self.gpu_shares = GpuShares()

    def held_ids(self) -> list[str]:
        return list(self.held)

    def run(self, *, burst: bool = False) -> Outcome:
        """Serve until drained or parked asleep; returns only with nothing held.

        With `burst`, it also returns (IDLE) once an idle iteration claimed nothing and the
        idle-drain check (step 5, run as usual) decided neither to drain nor to sleep; it
        never blocks waiting for work."""
        log.info("runner: %s serving %s", self._queue.runner_id, self._spec.name)
        self._draining = self._sleeping = False
        self._last_active = self._clock()
        self._publisher.start()
        self._news.start()
        try:
            with self.engine_thread_placement() as self._pin:
                try:
                    outcome = self._serve(burst)
                finally:
                    self._pin = None
            self._publisher.flush()
            return outcome
        finally:
            self._news.stop()
            self._publisher.stop()

    def _serve(self, burst: bool) -> Outcome:
        while True:
            if self._sleeping:  # parked atomically by try_sleep: claim nothing more
                return Outcome.SLEEP
            if self._stop.is_set() and not self._draining:
                self._start_draining("asked to stop")
            claimed = self._claim_and_cancel(wait=not burst)
            # The last step's output, held back so that the claim went first (see
            # `OutputPublisher`), goes out now.
            self._publisher.release()
            self._maybe_report_stats()
            if self._maybe_heed_drain_request():  # asleep: nothing held, nothing claimed
                return Outcome.SLEEP
            if self._engine.has_unfinished():
                self._step()
            elif self._draining and not self.held:
                return Outcome.DRAINED
            elif not self.held:
                self._maybe_drain_idle()
                if burst and not claimed and not (self._draining or self._sleeping):
                    return Outcome.IDLE

    # 1 + 2: claims and cancellations --------------------------------------------------

    def _claim_and_cancel(self, *, wait: bool = True) -> int:
        """Returns how many requests it claimed."""
        free = 0 if self._draining else self._max_slots - len(self.held)
        if free > 0 and not self.held and wait:
            self._publisher.flush()  # nothing to overlap with: out before waiting
            self._queue.wait_for_work(self._spec.name, _IDLE_WAIT_S)
        elif self.held and not self._news.claim_needed():
            return 0  # a claim found both queues empty, and no work was announced since
        held_jobs = sum(1 for h in self.held.values() if h.work.job_id)
        max_jobs = min(free, self._job_limit() - held_jobs, job_claims_per_step(self._max_slots))
        began = self._news.claim_begins()
        result = self._queue.claim(
            self._spec.name,
            max(free, 0),
            max(max_jobs, 0),
            uid=self._uid,
            critical_extra=self._critical_room(),
        )
        self._news.claim_ended(began, queues_empty=result.queues_empty)
        claimed = self._take(result)
        if result.deployment_gone and not self._draining:
            self._start_draining("deployment deleted")
        if result.sync_waiting and not self._draining and len(self.held) >= self._max_slots:
            room = self._make_room(result.sync_waiting)
            if room:
                claimed += self._take(self._queue.claim(self._spec.name, room, 0, uid=self._uid))
        return claimed

    def _take(self, result: ClaimResult) -> int:
        for work in result.claimed:
            self._admit(work, continued=work.request_id in result.continued)
        for request_id in result.cancelled:
            self._abort(request_id)
        return len(result.claimed)

    @property
    def _max_slots(self) -> int:
        return self._spec.max_concurrency

    def _critical_room(self) -> int:
        """Critical requests this runner may take beyond its free slots (`critical_room`,
        in `ebb.queue.priority`): its engine's batch has their places, and its scheduler
        runs them first (`priority`); standard and sheddable work never uses these."""
        if self._draining:
            return 0
        held_critical = sum(1 for h in self.held.values() if rank(h.work.priority) == 0)
        batch = engine_batch_limit(self._max_slots, self._spec.engine.max_num_seqs)
        room = critical_room(self._max_slots, len(self.held), held_critical, batch)
        return max(0, room - max(0, self._max_slots - len(self.held)))

    def _job_limit(self) -> int:
        """Job slots now. While no synchronous request runs here or ran in the last
        second, jobs may fill every slot: a synchronous request that then finds none takes
        one back (`_make_room`), so a batch uses the whole runner when nothing else wants
        it. Beside synchronous traffic, `job_slots` leave a quarter free for it; with
        `jobs_beside_sync` set, at most that many: on CPUs every sequence in the batch
        slows every step, so jobs running beside a synchronous request raise its latency,
        and at 0 the runner claims no new job while one runs or ran in the last second
        (jobs in flight finish), trading batch progress under steady traffic for
        synchronous latency."""
        serving_sync = any(not h.work.job_id for h in self.held.values())
        # Also just after one: a client's next request is usually a few ms away, and jobs
        # claimed in that gap would run beside it all the same.
        recent = self._clock() - self._sync_seen_at < _SYNC_QUIET_S
        if not (serving_sync or recent):
            return self._max_slots
        limit = job_slots(self._max_slots)
        return limit if self.jobs_beside_sync is None else min(limit, self.jobs_beside_sync)

    def _make_room(self, waiting: int) -> int:
        """Give up to `waiting` job attempts back to the job queue so that synchronous
        requests waiting for a slot get theirs now, not when a job ends (a job may run for
        minutes, the admission window is seconds). The youngest go first (the least work
        lost: a job given back keeps its output, and the runner that claims it next goes on
        from it, but that one prefills it again).
        Returns the slots freed. Each runner full of jobs does this for the waiting count
        it sees, so with several such runners a request may free more than one slot."""
        jobs = [h for h in self.held.values() if h.work.job_id]
        jobs.sort(key=lambda h: (h.completion_tokens, -h.claimed_ns))
        # A job given back is queued again: none of this attempt's output may follow.
        self._publisher.flush()
        freed = 0
        for held in jobs[:waiting]:
            request_id = held.work.request_id
            keep = replayable(held.work.sampling)
            if not self._queue.yield_job(self._spec.name, request_id, keep_output=keep):
                continue  # no longer ours, or being cancelled: that path ends it
            del self.held[request_id]
            self.gpu_shares.ended(request_id, thrown_away=not keep)
            with self.engine_progress.calling():
                self._engine.abort([request_id])
            freed += 1
            log.info(
                "runner: gave job attempt %s back after %d tokens: a synchronous request "
                "needed its slot",
                request_id,
                held.completion_tokens,
                extra={"request_id": request_id},
            )
        return freed

    def _admit(self, work: WorkItem, *, continued: bool = False) -> None:
        log.debug("runner: claimed %s", work.request_id)
        held = Held(work, prompt_tokens=len(work.prompt_token_ids), claimed_ns=time.time_ns())
        self.held[work.request_id] = held
        if work.deployment_uid and work.deployment_uid != self._uid:
            # Admitted for an earlier deployment of this name (deleted as it was queued):
            # never run it on another owner's engine.
            held.prompt_tokens = 0  # nothing ran, nothing is billed
            self._end(held, "failed", Failed(message=_DELETED_MESSAGE, code="deployment_deleted"))
            return
        if not work.job_id:
            self._sync_seen_at = self._clock()
        self._last_active = self._clock()
        if continued:
            self._continue(held)
            return
        try:
            self._add(work, work.prompt_token_ids, work.sampling)
        except EngineRequestError as e:
            self._end(held, "failed", Failed(message=str(e), code=e.code))

    def _continue(self, held: Held) -> None:
        """Go on with a request another runner lost (or gave back): replay its output so
        far after the prompt and generate the rest (see ebb.queue.continuation)."""
        work = held.work
        so_far = self._queue.output_so_far(work.request_id)
        held.attempt, held.completion_tokens = so_far.attempt, so_far.completion_tokens
        log.info(
            "runner: continuing %s after %d tokens (continuation %d)",
            work.request_id,
            so_far.completion_tokens,
            so_far.attempt,
            extra={"request_id": work.request_id},
        )
        if so_far.finish_reason or so_far.completion_tokens >= work.sampling.max_tokens:
            # Lost between its last token and its end: only the end is left to say.
            last = ChoiceDelta(index=0, text="", token_count=0, finish_reason="length")
            progress = (
                {} if so_far.finish_reason else {work.request_id: self._progress(held, [last])}
            )
            ending = (held, "finished", Finished(held.prompt_tokens, held.completion_tokens))
            self._end_all([ending], progress)
            return
        if so_far.completion_tokens and not (so_far.replayable and replayable(work.sampling)):
            held.prompt_tokens = held.completion_tokens = 0  # nothing of it is billed
            self._end(held, "failed", _LOST_UNREPLAYABLE)
            return
        held.replayed = len(so_far.token_ids)
        if held.replayed:
            self.gpu_shares.replaying(work.request_id)
        prompt = work.prompt_token_ids + so_far.token_ids
        sampling = remaining_sampling(work.sampling, so_far)
        try:
            self._add(work, prompt, sampling, held.replayed)
        except EngineRequestError as e:
            self._end(held, "failed", Failed(message=str(e), code=e.code))

    def _add(
        self, work: WorkItem, prompt: list[int], sampling: SamplingSpec, continued: int = 0
    ) -> None:
        """Into the engine's batch at its priority class's rank, with its LoRA adapter if
        it names one (loaded here first, outside the engine call the stall watchdog
        times)."""
        lora = self.adapters.for_work(work)
        priority = rank(work.priority)
        with self.engine_progress.calling():
            self._engine.add_request(
                work.request_id,
                prompt,
                sampling,
                continued,
                priority=priority,
                lora=lora,
                cache_salt=tenant_cache_salt(work.tenant),
            )

    def _progress(self, held: Held, choices: list[ChoiceDelta]) -> Progress:
        held.published += 1
        return Progress(choices=choices, seq=held.published, attempt=held.attempt)

    def _abort(self, request_id: str) -> None:
        held = self.held.get(request_id)
        if held is None:
            return
        with self.engine_progress.calling():
            self._engine.abort([request_id])
        log.info(
            "runner: aborted %s after %d tokens (client left)",
            request_id,
            held.completion_tokens,
            extra={"request_id": request_id},
        )
        self._end(held, "cancelled", Failed(message="cancelled by the client", code="cancelled"))

    # 3 + 4: engine step, output, completion ------------------------------------------------

    def _step(self) -> None:
        # The engine starts threads on demand, from this thread (see `Pin`): those that
        # requests admitted since the last step started, and those of this step.
        if self._pin is not None:
            self._pin.free_new_threads()
        began_s = time.monotonic()
        with self.engine_progress.calling():
            outputs = self._engine.step()
        self.gpu_shares.stepped(time.monotonic() - began_s, self.held)
        self.engine_progress.stepped()
        if self._pin is not None:
            self._pin.free_new_threads()
        self._last_active = self._clock()
        progress: dict[str, Progress] = {}
        finished: list[StepOutput] = []
        for out in outputs:
            held = self.held.get(out.request_id)
            if held is None:
                continue  # aborted while the step ran
            # A continuation's replayed tokens are output, already counted once.
            held.prompt_tokens = out.prompt_tokens - held.replayed
            held.completion_tokens = held.replayed + out.completion_tokens
            if out.choices:
                self.gpu_shares.produced(out.request_id)
                progress[out.request_id] = self._progress(held, out.choices)
                held.first_output_ns = held.first_output_ns or time.time_ns()
                held.batch_sum += len(self.held)
                held.batch_steps += 1
            if out.finished:
                finished.append(out)
        endings: list[tuple[Held, str, Finished | Failed]] = [
            (held, "finished", Finished(held.prompt_tokens, held.completion_tokens))
            for held in (self.held[out.request_id] for out in finished)
        ]
        first_out: Callable[[], None] | None = None
        if progress and self.on_first_output is not None:
            first, self.on_first_output = self.on_first_output, None
            first_work = self.held[next(iter(progress))].work
            first_out = functools.partial(first, first_work)
        # The step's output and its completions, in one round trip, after the next claim.
        self._end_all(endings, progress, then=first_out, hold=True)

    def _end(self, held: Held, state: str, event: Finished | Failed) -> None:
        self._end_all([(held, state, event)])

    def _end_all(
        self,
        endings: list[tuple[Held, str, Finished | Failed]],
        progress: dict[str, Progress] | None = None,
        then: Callable[[], None] | None = None,
        *,
        hold: bool = False,
    ) -> None:
        """End held requests: terminal event and usage, once each, in one round trip
        (after publishing `progress`, the output of the step that completed them), handed
        to the publisher (held back until released, with `hold`); `then` runs once that
        is out."""
        for held, state, _ in endings:
            self.held.pop(held.work.request_id, None)
            self.gpu_shares.ended(held.work.request_id, thrown_away=state == "failed")
            if not held.work.job_id:
                self._sync_seen_at = self._clock()
            if held.work.traceparent:
                tracing.record_serving(
                    held.work.traceparent,
                    enqueued_ns=int(held.work.enqueued_at_s * 1e9),
                    claimed_ns=held.claimed_ns,
                    first_output_ns=held.first_output_ns,
                    end_ns=time.time_ns(),
                    prompt_tokens=held.prompt_tokens,
                    completion_tokens=held.completion_tokens,
                )
        ending_ids = [held.work.request_id for held, _, _ in endings]

        def published(done: list[bool]) -> None:
            for ok, request_id in zip(done, ending_ids, strict=True):
                if not ok:
                    log.warning(
                        "runner: %s was no longer ours to finish (lease expired)",
                        request_id,
                        extra={"request_id": request_id},
                    )
            if then is not None:
                then()

        self._publisher.submit(
            progress or {},
            [
                Ending(
                    h.work,
                    state,
                    event,
                    h.prompt_tokens,
                    h.completion_tokens,
                    _ttft_ms(h),
                    _tpot_ms(h, time.time_ns()),
                    _queue_ms(h),
                    h.batch_sum / h.batch_steps if h.batch_steps else None,
                )
                for h, state, event in endings
            ],
            then=published,
            hold=hold,
        )

    def fail_all(self, message: str) -> None:
        """The engine broke: every held request ends with an error, none hangs."""
        failed = Failed(message=message, code="engine_error", retryable=True)
        if self.held:
            self._end_all([(held, "failed", failed) for held in list(self.held.values())])
        self._publisher.flush()

    def _maybe_report_stats(self) -> None:
        now = self._clock()
        if now - self._stats_at < _STATS_INTERVAL_S:
            return
        self._stats_at = now
        engine = self._engine.stats()
        self._queue.report_stats(
            RunnerStats(
                runner_id=self._queue.runner_id,
                deployment=self._spec.name,
                batch_size=len(self.held),
                kv_cache_usage_ratio=engine.kv_cache_usage_ratio,
                prefix_cache_queried_tokens=engine.prefix_cache_queried_tokens,
                prefix_cache_hit_tokens=engine.prefix_cache_hit_tokens,
                gpus=self.read_gpus(),
            )
        )

    # 5: idle drain ----------------------------------------------------------------------

    def _maybe_drain_idle(self) -> None:
        self._publisher.flush()  # idle: whatever ended is out before draining or sleeping
        now = self._clock()
        if now - self._spec_read_at >= _SPEC_REFRESH_S:
            self._spec_read_at = now
            spec = self._queue.deployment(self._spec.name)
            if spec is None or spec.uid != self._uid:
                self._start_draining("deployment deleted")
                return
            self._spec = spec
        action = idle_action(
            idle_s=now - self._last_active,
            idle_timeout_s=self._spec.idle_timeout_s,
            min_replicas=self._spec.min_replicas,
            serving_runners=lambda: self._queue.serving_runner_count(self._spec.name),
            supports_sleep=self._engine.supports_sleep,
        )
        if action is IdleAction.SLEEP:
            self._sleep_unless_work_waits()
            return
        if action is IdleAction.DRAIN and self._queue.try_drain(self._spec.name):
            self._draining = True
            self._lifecycle.adopt(RunnerState.DRAINING)
            self._queue.count_scale_down(self._spec.name)
            log.info(
                "runner: %s idle for %.1fs, draining",
                self._queue.runner_id,
                now - self._last_active,
            )

    def _maybe_heed_drain_request(self) -> bool:
        """The controller's scaling policy gives this runner back: drain (what it holds
        finishes first), or, holding nothing with an engine that can sleep, sleep (as its
        own idle timeout would have had it do: a wake costs seconds, a start far more).
        Read every `_SPEC_REFRESH_S`. True when it is now asleep."""
        now = self._clock()
        if self._draining or now - self._drain_checked_at < _SPEC_REFRESH_S:
            return False
        self._drain_checked_at = now
        if not self._queue.drain_requested():
            return False
        why = "the controller's scaling policy gives it back"
        if self._engine.supports_sleep and not self.held and not self._engine.has_unfinished():
            # try_sleep clears the request; it refuses while work waits (then: serve it,
            # and heed the request at the next read).
            if not self._sleep_unless_work_waits():
                return False
            self._queue.count_scale_down(self._spec.name)
            log.info("runner: %s sleeping (%s)", self._queue.runner_id, why)
            return True
        self._queue.count_scale_down(self._spec.name)
        self._start_draining(why)
        return False

    def _sleep_unless_work_waits(self) -> bool:
        """Park asleep, atomically with the check that nothing waits (`try_sleep`)."""
        if not self._queue.try_sleep(self._spec.name):
            return False
        self._sleeping = True
        self._lifecycle.adopt(RunnerState.SLEEPING)
        return True

    def _start_draining(self, why: str) -> None:
        self._draining = True
        self._lifecycle.to(RunnerState.DRAINING)
        self._queue.stop_claiming(self._spec.name)
        log.info(
            "runner: %s draining (%s), %d in flight", self._queue.runner_id, why, len(self.held)
        )


def _tpot_ms(held: Held, now_ns: int) -> float | None:
    """Per output token after the first (scaling policies keep a p90 of it)."""
    if not held.first_output_ns or held.completion_tokens < 2:
        return None
    return max(0.0, (now_ns - held.first_output_ns) / 1e6 / (held.completion_tokens - 1))


def _queue_ms(held: Held) -> float | None:
    """From the request's enqueue (the frontdoor's clock) to its claim."""
    if not held.claimed_ns or not held.work.enqueued_at_s:
        return None
    return max(0.0, held.claimed_ns / 1e6 - held.work.enqueued_at_s * 1000)


def _ttft_ms(held: Held) -> float | None:
    """From the request's enqueue (the frontdoor's clock) to its first output."""
    if not held.first_output_ns or not held.work.enqueued_at_s:
        return None
    return max(0.0, held.first_output_ns / 1e6 - held.work.enqueued_at_s * 1000)
