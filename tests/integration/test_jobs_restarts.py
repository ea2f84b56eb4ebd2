"""Jobs and webhooks across restarts: the platform (`ebb up`, fake engine) on an external
redis-server with an append-only file that the tests stop and start on the same port and
directory, and platform processes killed with SIGKILL that `ebb up` brings back."""

from __future__ import annotations

import pytest
import redis
from support import Platform, RedisServer, free_port, temp_home, wait_until
from support.platform_processes import crash, pid_of, wait_replaced
from support.reliability import run_restart_scenario
from support.webhook_receiver import Receiver
from test_jobs import FAST_RETRIES, delivered, deploy, job_body, settled, submit

from ebb.queue import keys

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer(port=free_port(), data_dir=temp_home("ebb-jobs-aof-")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def platform(redis_server):
    p = Platform(
        home=temp_home("ebb-jobs-restarts-"), redis_url=redis_server.url, env_extra=FAST_RETRIES
    ).start()
    yield p
    assert p.stop() == 0


def test_worker_killed_mid_schedule_still_delivers(platform, admin, receiver):
    deploy(admin, "restart-chat")
    receiver.down = True
    body = job_body("restart-chat")
    body["webhook"] = {"url": receiver.url, "events": ["job.succeeded"]}
    job = submit(admin, body)
    assert settled(admin, job["id"])["status"] == "succeeded"
    wait_until(lambda: len(receiver.received) >= 2, 30, "two refused attempts")
    old = crash(platform.home, "webhooks")
    refused = len(receiver.received)
    receiver.down = False
    new = wait_replaced(platform.home, "webhooks", old)
    [accepted] = wait_until(lambda: receiver.accepted(job["id"]), 90, "the delivery")
    attempts = receiver.attempts(accepted.webhook_id)
    assert len(attempts) > refused >= 2 and len(attempts) == len(receiver.received)
    assert [a.status for a in attempts] == [503] * (len(attempts) - 1) + [200]
    assert new != old
    [record] = wait_until(lambda: delivered(admin, job["id"], 1), 10, "delivered recorded")
    assert record["webhook_id"] == accepted.webhook_id


def test_queued_jobs_survive_a_redis_restart(platform, admin, redis_server, receiver):
    # The runner takes 6 s to load: the jobs are still queued when Redis goes down.
    deploy(admin, "restart-slow", source="fake://m?load_s=6")
    ids = [submit(admin, job_body("restart-slow", receiver.url))["id"] for _ in range(3)]
    client = redis.Redis.from_url(redis_server.url)
    assert client.zcard(keys.job_queue("restart-slow")) == 3
    client.close()
    redis_server.stop()
    redis_server.start()
    for job_id in ids:
        view = settled(admin, job_id, timeout_s=120)
        assert view["status"] == "succeeded" and view["result"]["choices"]
        wait_until(lambda j=job_id: receiver.accepted(j, "job.succeeded"), 30, "its webhook")
    assert [len(receiver.accepted(j, "job.succeeded")) for j in ids] == [1, 1, 1]


def test_every_process_and_redis_restarted_loses_nothing(platform, admin, redis_server):
    deploy(admin, "restart-all", source="fake://m?step_ms=10", max_concurrency=4)
    receiver = Receiver(fail_first=1).start()
    try:
        figure = run_restart_scenario(
            platform, redis_server, receiver, job_body("restart-all", receiver.url, max_tokens=16)
        )
    finally:
        receiver.stop()
    print("reliability:", figure.line())
    assert set(figure.restarts) == {"frontdoor", "coldstart", "webhooks", "redis"}
    assert figure.submitted >= 10
    assert figure.holds, figure.line()
    assert pid_of(platform.home, "frontdoor")
