"""Preparing deployments' weights before anything needs them, in processes the controller
owns.

Every pass (`PASS_INTERVAL_S`), for each deployment whose source has weights to prepare
(see `ebb.engines`), by its weights status (`ebb.queue.weights_status`):
  - READY: nothing to do (an eviction later leaves it READY: a runner fetches again, and
    a frontdoor that finds the files gone sets it back to PREPARING);
  - FAILED: prepared again once its backoff has passed, the error standing meanwhile;
  - otherwise (new, PREPARING, unknown after a restart): joined to the preparation of its
    source under way, or marked READY from one that finished, or a new preparation.
A preparation is one short-lived `ebb prepare SOURCE` process per source (what it costs
in memory — torch for a GGUF conversion, boto3 — leaves with it); its progress lines go
into the status of every deployment of that source. Concurrent preparations of one
source by other processes (a runner's own `ensure`) are safe: the weight cache locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from ebb import backoff
from ebb.coldstart.clock import SYSTEM_CLOCK, Clock
from ebb.coldstart.environments import preparation_environment, secret_values
from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.queue import observations
from ebb.queue.platform import PlatformState
from ebb.queue.schema import DeploymentSpec
from ebb.queue.version_store import VersionStore
from ebb.queue.versions import split_unit
from ebb.queue.weights_status import WeightsState, WeightsStatus, progress_fields
from ebb.secrets import SecretBox
from ebb.weights_cache.preparation import (
    PrepareDone,
    PrepareFailed,
    PrepareProgress,
    decode_message,
)

log = logging.getLogger(__name__)

PASS_INTERVAL_S = 0.5
# Backoff between attempts at a source whose preparation failed.
RETRY_FIRST_S = 10.0
RETRY_MAX_S = 300.0
# The code of a failure that is not one of the weights errors' own.
_ERROR_CODE = "weights_error"
# Lines of a crashed preparation's log quoted in its error.
_LOG_TAIL_LINES = 5


@dataclass
class _Preparation:
    """One `ebb prepare` process and the deployments whose status follows it."""

    source: str
    followers: set[str]
    task: asyncio.Task[PrepareDone | PrepareFailed] | None = None
    # It fetched or converted the weights (not only found them cached): for metrics.
    fetched: bool = False
    # The version that asked first: its credentials (HF_TOKEN, S3 keys), and only those,
    # go into the process's environment (`preparation_environment`), opened just before
    # it starts.
    asked_by: str = ""
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class _Failure:
    failed: PrepareFailed
    attempts: int
    retry_at_s: float


@dataclass
class _Known:
    """What the preparer has learnt of each source in this process's life."""

    done: dict[str, PrepareDone] = field(default_factory=dict)
    failures: dict[str, _Failure] = field(default_factory=dict)


class Preparer:
    def __init__(
        self,
        settings: Settings,
        state: PlatformState,
        engines: EngineRegistry,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ):
        self._settings = settings
        self._state = state
        self._engines = engines
        self._clock = clock
        self._running: dict[str, _Preparation] = {}
        self._known = _Known()
        settings.logs_dir.mkdir(parents=True, exist_ok=True)

    async def run(
        self, stopping: asyncio.Event, leading: Callable[[], bool] = lambda: True
    ) -> None:
        """Prepare, pass after pass, while `leading()` (a standby controller waits)."""
        log.info("coldstart: preparer up")
        while not stopping.is_set():
            try:
                if leading():
                    await self.reconcile()
            except Exception:
                # Redis restarting or a bug in one pass: log and go on with the next.
                log.exception("coldstart: preparing weights failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), PASS_INTERVAL_S)
        for preparation in self._running.values():
            if preparation.task is not None:
                preparation.task.cancel()

    async def reconcile(self) -> None:
        # Per serving unit: a new version's weights are ready before traffic moves to it.
        specs = [s for s in await self._state.serving_units() if self._prepares(s)]
        statuses = await self._state.deployment_statuses([s.name for s in specs])
        for spec in specs:
            await self._consider(spec, WeightsStatus.of(statuses[spec.name]))

    def _prepares(self, spec: DeploymentSpec) -> bool:
        try:
            return self._engines.entry_for(spec.source).prepares_weights
        except Exception:  # a source no engine serves any more: nothing to prepare
            return False

    async def _consider(self, spec: DeploymentSpec, weights: WeightsStatus) -> None:
        if weights.state is WeightsState.READY:
            return
        source = spec.source
        running = self._running.get(source)
        if running is not None:
            if spec.name not in running.followers:
                running.followers.add(spec.name)
                await self._write(spec.name, WeightsStatus(WeightsState.PREPARING))
            return
        done = self._known.done.get(source)
        if done is not None and Path(done.path).is_dir():
            await self._write(spec.name, _ready(done))
            return
        failure = self._known.failures.get(source)
        if failure is not None and self._clock.monotonic() < failure.retry_at_s:
            if weights.state is not WeightsState.FAILED:
                await self._write(spec.name, _failed(failure.failed))
            return
        self._start(source, spec.name, show_preparing=weights.state is not WeightsState.FAILED)

    def _start(self, source: str, first: str, *, show_preparing: bool) -> None:
        preparation = _Preparation(source, {first}, asked_by=first)
        preparation.task = asyncio.create_task(self._prepare(preparation, show_preparing))
        self._running[source] = preparation

    async def _prepare(
        self, preparation: _Preparation, show_preparing: bool
    ) -> PrepareDone | PrepareFailed:
        source = preparation.source
        try:
            if show_preparing:  # a retry after a failure keeps showing that failure
                for name in sorted(preparation.followers):
                    await self._write(name, WeightsStatus(WeightsState.PREPARING))
            preparation.env = await self._version_env(preparation.asked_by)
            outcome = await self._run_process(preparation)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("coldstart: preparing %s failed", source)
            outcome = PrepareFailed(f"Preparing the weights of {source} failed: {e}", _ERROR_CODE)
        finally:
            self._running.pop(source, None)
        await self._settle(preparation, outcome)
        return outcome

    async def _settle(
        self, preparation: _Preparation, outcome: PrepareDone | PrepareFailed
    ) -> None:
        source = preparation.source
        if isinstance(outcome, PrepareDone):
            self._known.done[source] = outcome
            self._known.failures.pop(source, None)
            status = _ready(outcome)
            log.info("coldstart: weights of %s ready at %s", source, outcome.path)
            if preparation.fetched:
                kind = source.split(":", 1)[0]
                await observations.count_async(
                    self._state.redis,
                    observations.WEIGHTS_FETCHED_BYTES,
                    (kind,),
                    outcome.size_bytes,
                )
        else:
            attempts = self._known.failures.get(source, _Failure(outcome, 0, 0.0)).attempts + 1
            delay_s = backoff.delay_s(attempts, first_s=RETRY_FIRST_S, cap_s=RETRY_MAX_S)
            retry_at_s = self._clock.monotonic() + delay_s
            self._known.failures[source] = _Failure(outcome, attempts, retry_at_s)
            status = _failed(outcome)
            log.warning(
                "coldstart: preparing %s failed (attempt %d, next in %.0f s): %s",
                source,
                attempts,
                delay_s,
                outcome.message,
            )
        for name in sorted(preparation.followers):
            await self._write(name, status)

    async def _version_env(self, unit: str) -> dict[str, str]:
        """The environment of `unit`'s version, opened (ValueError without the key)."""
        name, number = split_unit(unit)
        record = await VersionStore(self._state.redis).version(name, number)
        return SecretBox(self._settings.secrets_key).open(record.env_sealed if record else "")

    async def _run_process(self, preparation: _Preparation) -> PrepareDone | PrepareFailed:
        log_path = self._settings.logs_dir / f"prepare-{_short_hash(preparation.source)}.log"
        env = preparation_environment(self._settings, preparation.env)
        with log_path.open("ab") as log_file:
            log_start = log_file.tell()  # earlier attempts' lines are not this one's
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "ebb",
                "prepare",
                preparation.source,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                env=env,
            )
        log.info("coldstart: preparing %s (pid %d)", preparation.source, proc.pid)
        assert proc.stdout is not None
        outcome: PrepareDone | PrepareFailed | None = None
        try:
            async for line in proc.stdout:
                message = _decoded(line)
                if isinstance(message, PrepareProgress):
                    preparation.fetched |= message.phase in ("download", "convert")
                    for name in sorted(preparation.followers):
                        fields = progress_fields(message.phase, message.fraction)
                        await self._state.set_deployment_status(name, **fields)
                elif message is not None:
                    outcome = message
            code = await proc.wait()
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        if outcome is None:
            outcome = PrepareFailed(
                f"Preparing the weights of {preparation.source} crashed (exit status "
                f"{code}): {_tail(log_path, log_start)}",
                _ERROR_CODE,
            )
        if isinstance(outcome, PrepareFailed):
            # The message becomes the deployment's `error`, which its tenant reads.
            outcome.message = _redacted(outcome.message, secret_values(env))
        return outcome

    async def _write(self, name: str, status: WeightsStatus) -> None:
        await self._state.set_deployment_status(name, **status.fields())


def _ready(done: PrepareDone) -> WeightsStatus:
    return WeightsStatus(
        WeightsState.READY, progress=1.0, path=done.path, max_model_len=done.max_model_len
    )


def _failed(failed: PrepareFailed) -> WeightsStatus:
    return WeightsStatus(WeightsState.FAILED, error=failed.message, error_code=failed.code)


def _decoded(line: bytes) -> PrepareProgress | PrepareDone | PrepareFailed | None:
    try:
        return decode_message(line)
    except msgspec.DecodeError:
        # Libraries may print to stdout; only our lines are the protocol.
        log.info("coldstart: prepare output: %s", line.decode(errors="replace").rstrip())
        return None


def _short_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def _tail(path: Path, start: int) -> str:
    """The last lines `path` got from offset `start` on."""
    try:
        with path.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    lines: deque[str] = deque(text.splitlines(), _LOG_TAIL_LINES)
    return " | ".join(lines) or "(no output)"


def _redacted(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "[redacted]")
    return text
