"""`ebb up` as an operator runs it: state survives a restart, Ctrl-C leaves nothing behind."""

from __future__ import annotations

import signal

import psutil
import pytest
from support import Platform, temp_home

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "hi"}]


def ebb_processes(home) -> list[str]:
    return [
        " ".join(p.info["cmdline"] or [])
        for p in psutil.process_iter(["environ", "cmdline", "status"])
        if (p.info.get("environ") or {}).get("EBB_HOME") == str(home)
        and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


def test_a_second_up_on_the_same_home_keeps_keys_and_deployments():
    home = temp_home("ebb-up-")
    first = Platform(home=home, redis_url=None).start()
    with first.admin() as admin:
        assert admin.post("/v1/deployments", json={"name": "kept", "source": "fake://m"}).is_success
        key = admin.post("/v1/keys", json={"tenant": "acme"}).json()["key"]
    first.openai(api_key=key).chat.completions.create(model="kept", messages=MESSAGES, max_tokens=2)
    assert first.stop() == 0
    assert not ebb_processes(home), "the first platform left processes behind"

    second = Platform(home=home, redis_url=None, admin_key=first.admin_key).start()
    try:
        tenant = second.openai(api_key=key)
        assert "kept" in [m.id for m in tenant.models.list().data]
        reply = tenant.chat.completions.create(model="kept", messages=MESSAGES, max_tokens=2)
        assert reply.usage.completion_tokens == 2
    finally:
        assert second.stop() == 0


@pytest.mark.parametrize("fork_server", [False, True], ids=["spawned", "forked"])
def test_ctrl_c_stops_every_process(fork_server):
    home = temp_home("ebb-up-")
    platform = Platform(
        home=home, redis_url=None, env_extra={"EBB_FORK_SERVER": str(int(fork_server))}
    ).start()
    if fork_server:
        platform.wait_for_fork_server()
    with platform.admin() as admin:
        admin.post("/v1/deployments", json={"name": "busy", "source": "fake://m"})
    platform.openai().chat.completions.create(model="busy", messages=MESSAGES, max_tokens=2)
    # A forked runner carries its parent's command line: the server's and its own.
    runner = "ebb fork-server" if fork_server else "ebb runner"
    running = [cmd for cmd in ebb_processes(home) if runner in cmd]
    assert len(running) == (2 if fork_server else 1), running
    platform.proc.send_signal(signal.SIGINT)
    assert platform.proc.wait(timeout=60) == 0
    assert not ebb_processes(home)
