"""A runner under overload (fake engine batching as vLLM does, real Redis, in-process):
critical requests get the room they would have alone, whatever the slots hold."""

from __future__ import annotations

import asyncio

import pytest
from support import wait_until
from support.serving_harness import serving_harness

from ebb.queue.priority import critical_slots
from ebb.queue.schema import Finished
from ebb.runners.serve import Outcome

pytestmark = pytest.mark.integration

# Five milliseconds a token: a 1500-token request runs for seconds.
SLOW = "fake://m?step_ms=5"
SLOTS = 4


async def test_a_runner_full_of_standard_work_runs_critical_requests_beside_it(redis_url):
    async with serving_harness(redis_url, source=SLOW, max_concurrency=SLOTS) as h:
        standard = [await h.submit(1500) for _ in range(SLOTS)]
        serving = h.start()
        for work in standard:
            await h.wait_running(work.request_id)
        waiting_standard = await h.submit(1500)
        # As many critical requests as the runner takes when idle (5 for 4 slots), each
        # long enough that they must run at once, not one after another.
        critical = [
            await h.submit(200, priority="critical") for _ in range(SLOTS + critical_slots(SLOTS))
        ]
        everyone = {w.request_id for w in standard + critical}
        await asyncio.to_thread(
            wait_until,
            lambda: everyone <= h.engine.batches[-1],
            10,
            "every critical request in the engine beside the full slots",
            poll_s=0.005,
        )
        # ...and in its batch: the engine (batching as vLLM does) has places for them.
        assert len(everyone) <= (h.engine.max_num_seqs or 0)
        for work in critical:
            assert isinstance((await h.events(work.request_id))[-1], Finished)
        # Standard work took no critical room: the fifth standard request still waits,
        # and the four in the slots ran on beside the critical ones.
        assert (await h.state(waiting_standard.request_id))["state"] == "queued"
        for work in standard:
            assert (await h.state(work.request_id))["state"] == "claimed"
        for work in [*standard, waiting_standard]:
            await h.requests.cancel(work)
        assert await asyncio.wait_for(serving, 20) is Outcome.IDLE
