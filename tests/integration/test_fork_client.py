"""The controller's side of the fork server, against a stand-in server that "forks"
`sleep` processes: what it reports, what happens when it dies, and its restart."""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import pytest
from support import temp_home, wait_until

from ebb.coldstart import fork_client
from ebb.coldstart.fork_client import Exit, ForkServerClient

pytestmark = pytest.mark.integration

STAND_IN = textwrap.dedent(
    """
    import json, subprocess, sys
    print(json.dumps({"event": "ready"}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        child = subprocess.Popen(["sleep", "60"], start_new_session=True)
        event = {"event": "spawned", "runner_id": request["runner_id"], "pid": child.pid}
        print(json.dumps(event), flush=True)
    """
)


@pytest.fixture
def client(monkeypatch):
    monkeypatch.setattr(fork_client, "_RESTART_BACKOFF_S", 0.2)
    home = temp_home("ebb-forkclient-")
    c = ForkServerClient(dict(os.environ), home / "server.log", (sys.executable, "-c", STAND_IN))
    wait_until(c.ready, 30, "the stand-in server to say ready")
    yield c
    for runner_id in c.runner_ids():
        c.signal(runner_id, signal.SIGKILL)
    c.close()


def test_forked_runners_are_followed_past_their_servers_death(client, tmp_path):
    client.spawn("r-1", "d", "forked", tmp_path / "r-1.log")
    wait_until(lambda: client.pid("r-1"), 10, "the spawned report")
    assert client.alive("r-1")
    client._proc.kill()
    client._proc.wait()
    # Its runner drains on its own (here: keeps sleeping) and is still followed, by pid.
    assert client.poll() == [] and client.alive("r-1")
    assert not client.ready()
    client.signal("r-1", signal.SIGKILL)
    exits = wait_until(client.poll, 10, "the orphan's exit")
    assert exits == [Exit("r-1", -1)] and not client.alive("r-1")


def test_a_start_asked_of_a_dead_server_fails_at_once(client, tmp_path):
    client._proc.kill()
    client._proc.wait()
    client.spawn("r-2", "d", "forked", tmp_path / "r-2.log")
    assert Exit("r-2", -1) in client.poll()
    assert not client.alive("r-2")


def test_a_dead_server_is_restarted_after_a_backoff(client):
    first = client._proc.pid
    client._proc.kill()
    client._proc.wait()

    def restarted() -> bool:
        client.poll()
        return client.ready()

    wait_until(restarted, 30, "a new server")
    assert client._proc.pid != first
