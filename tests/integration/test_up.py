"""`ebb up` as an operator runs it: state survives a restart, Ctrl-C leaves nothing behind."""

from __future__ import annotations

import signal

import psutil
import pytest
from support import Platform, temp_home
from support.metrics import scrape

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


def test_up_says_what_a_person_needs_and_keeps_the_admin_key_out_of_log_files(tmp_path):
    # A fresh weight cache: `ebb up` converts the default model (GGUF), the step that used
    # to print tqdm bars and transformers' advice; httpx polled /readyz on every line.
    home = temp_home("ebb-up-quiet-")
    platform = Platform(
        home=home,
        redis_url=None,
        default_model=True,
        env_extra={"EBB_WEIGHTS_CACHE_DIR": str(tmp_path / "weights")},
    ).start(timeout_s=600)
    try:
        platform.openai().models.list()
        with platform.admin() as admin:
            fetched = scrape(admin).value("ebb_weights_fetched_bytes_total", source="gguf")
        assert fetched > 100_000_000  # the converted checkpoint (~270 MB), counted once
    finally:
        assert platform.stop() == 0
    output = platform.log_path.read_text()
    for noise in ("it/s", "[transformers]", "/readyz", "HTTP Request", "Traceback"):
        assert noise not in output, (noise, output)
    lines = output.splitlines()
    assert any(line.startswith("started: redis-server") for line in lines), output
    [ready] = [line for line in lines if line.startswith("ready: ")]
    assert ready == (
        f"ready: {platform.base_url}/v1  admin key: {platform.admin_key}  logs: {home / 'logs'}"
    )
    assert len(lines) <= 8, output
    logs = list((home / "logs").iterdir())
    assert {p.name for p in logs} >= {"up.log", "frontdoor.log", "coldstart.log", "redis.log"}
    for path in logs:
        assert platform.admin_key not in path.read_text(errors="replace"), path
