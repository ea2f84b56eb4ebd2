"""News of work for a busy runner: whether its next claim can find anything.

A serving runner claims between engine steps. Each claim is a Redis round trip on the
serving thread; at concurrency 1 on a 2-core CPU host it cost ~1 ms of every ~48 ms
decode step (2.3 % of the thread in py-spy: it wakes Redis's core, then the runner's),
and while a request decodes and both queues are empty, nearly every one finds nothing.

Every script that gives a runner something to claim or cancel also publishes on a
channel named as the key it pushes its wake token onto or adds the cancel to: the
deployment's queue signal (enqueue, rerun_lost, job_submit, job_requeue, job_yield), the
runner's own signal (a claim that left a request for it, see claim.lua) and its cancel
set (cancel, job_cancel). A thread here listens on those three. The serving loop may skip
a claim only while nothing was heard since a claim that found both queues empty, that
claim began with the subscription in place, and it is younger than `max_quiet_s`: the
bound on anything no channel announces (a message lost with a reconnect), and what keeps
the runner's claim-time fields (`free_slots`, `polled_ms`) and the deployment's claiming
marker fresh.

Publishing wakes no runner blocked on the lists, and takes no wake token from them: an
idle runner still blocks on its lists (`RunnerQueue.wait_for_work`), and a busy one never
competes with it for a token.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import redis

log = logging.getLogger(__name__)

# How long the listener waits for a message before it looks at its stop flag again.
_LISTEN_S = 1.0
# After the connection failed: how long before subscribing again.
_RESUBSCRIBE_S = 0.5
# What `stop()` publishes on the runner's own channel to end the listener's wait at once.
_STOP = b"stop"


class WorkNews:
    """Between `start()` and `stop()`, a thread subscribed to `channels`. The caller
    brackets each claim with `claim_begins()` and `claim_ended()`, and asks
    `claim_needed()` before the next one."""

    def __init__(
        self,
        client: redis.Redis,
        channels: list[str],
        *,
        own_channel: str,
        max_quiet_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`own_channel`: one of `channels` that only this listener's runner hears."""
        self._client = client
        self._channels = channels
        self._own_channel = own_channel
        self._max_quiet_s = max_quiet_s
        self._clock = clock
        # Messages heard, subscriptions made and lost: any change since a claim means the
        # next one must be made. Only the listener's thread writes it.
        self._heard = 0
        self._listening = False  # subscribed to every channel, as confirmed by Redis
        self._last_data: object = None  # of the last message heard (tests wait on it)
        # The count heard and the time when the last claim that found the queues empty
        # began; None when the last claim found work left or began unsubscribed.
        self._quiet_since: tuple[int, float] | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._listen, name="work-news", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        # Without Redis, the listener sees the flag after its current wait.
        with contextlib.suppress(redis.RedisError):
            self._client.publish(self._own_channel, _STOP)
        self._thread.join()
        self._thread = None
        self._quiet_since = None

    # --- the serving thread's side ---------------------------------------------------

    def claim_begins(self) -> tuple[int, float] | None:
        """Call as a claim is made; hand what it returns to `claim_ended`."""
        if not self._listening:
            return None
        return self._heard, self._clock()

    def claim_ended(self, began: tuple[int, float] | None, *, queues_empty: bool) -> None:
        self._quiet_since = began if queues_empty else None

    def claim_needed(self) -> bool:
        quiet = self._quiet_since
        return (
            quiet is None
            or not self._listening
            or self._heard != quiet[0]
            or self._clock() - quiet[1] >= self._max_quiet_s
        )

    # --- the listener's thread -------------------------------------------------------

    def _listen(self) -> None:
        while not self._stopping.is_set():
            pubsub = self._client.pubsub()
            try:
                pubsub.subscribe(*self._channels)
                while not self._stopping.is_set():
                    message = pubsub.get_message(timeout=_LISTEN_S)
                    if message is None:
                        continue
                    # redis-py reconnects a lost connection and subscribes again on its
                    # own: confirmations come again, each counting the channels so far.
                    # What was published in between is lost, but the count heard moves
                    # on, and the claim that follows finds it queued.
                    if message["type"] == "subscribe":
                        self._listening = message["data"] == len(self._channels)
                    self._last_data = message["data"]
                    self._heard += 1
            except redis.RedisError as e:
                log.warning("runner: lost its news of work (%s); claims every step", e)
            finally:
                self._listening = False
                self._heard += 1
                pubsub.close()
            self._stopping.wait(_RESUBSCRIBE_S)
