"""The `ebb` CLI against a live platform on the fake engine: every command the console has,
its --json output, and the exit codes scripts rely on (0 ok, 1 refused, 2 usage, 3
unreachable)."""

from __future__ import annotations

import json
import subprocess

import pytest
from support import Platform, free_port, temp_home, wait_until

from ebb.testing.fake_model import FAKE_REPLY

pytestmark = pytest.mark.integration

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def platform():
    p = Platform(home=temp_home("ebb-cli-"), redis_url=None).start()
    yield p
    assert p.stop() == 0


def ebb(platform: Platform, *args: str, **env: str) -> subprocess.CompletedProcess:
    return platform.cli(*args, **env)


def ok_json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_deploy_show_scale_chat_delete(platform):
    created = ok_json(
        ebb(platform, "deploy", "cli-a", "--source", "fake://m?step_ms=5", "--max", "2", "--json")
    )
    assert (created["name"], created["max_replicas"]) == ("cli-a", 2)

    listed = ok_json(ebb(platform, "deployments", "--json"))
    assert "cli-a" in [d["name"] for d in listed["data"]]
    table = ebb(platform, "deployments")
    assert table.returncode == 0 and "cli-a" in table.stdout and "fake://m" in table.stdout

    scaled = ok_json(
        ebb(platform, "scale", "cli-a", "--max", "3", "--idle-timeout", "30", "--json")
    )
    assert (scaled["max_replicas"], scaled["idle_timeout_s"]) == (3, 30)

    # The answer streams to stdout alone; timing and usage go to stderr.
    chat = ebb(platform, "chat", "cli-a", QUESTION, "--max-tokens", "8")
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout == FAKE_REPLY[:8] + "\n"
    assert "time to first token" in chat.stderr and "8 completion tokens" in chat.stderr

    reply = ok_json(ebb(platform, "chat", "cli-a", QUESTION, "--max-tokens", "5", "--json"))
    assert reply["choices"][0]["message"]["content"] == FAKE_REPLY[:5]

    shown = ok_json(ebb(platform, "deployments", "show", "cli-a", "--json"))
    ready = [r for r in shown["runners"] if r["state"] == "ready"]
    assert len(ready) == 1 and any(line.endswith("ready") for line in ready[0]["log_tail"])
    detail = ebb(platform, "deployments", "show", "cli-a")
    assert detail.returncode == 0
    assert f"last log lines of {ready[0]['id']}" in detail.stdout and "cold starts" in detail.stdout

    status = ok_json(ebb(platform, "status", "--json"))
    assert "cli-a" in [d["name"] for d in status["data"]]
    assert ready[0]["id"] in ebb(platform, "status").stdout
    # The test platform runs without a pool or a fork server; the admin sees both.
    assert status["platform"]["pool"]["target"] == 0
    assert "fork server: off" in ebb(platform, "status").stdout

    usage = ok_json(ebb(platform, "usage", "--json"))
    row = next(r for r in usage["data"] if r["deployment"] == "cli-a")
    assert (row["requests"], row["completion_tokens"]) == (2, 13)

    deleted = ok_json(ebb(platform, "deployments", "delete", "cli-a", "--json"))
    assert deleted == {"object": "deployment.deleted", "name": "cli-a", "deleted": True}
    gone = ebb(platform, "deployments", "show", "cli-a")
    assert gone.returncode == 1 and "No deployment named 'cli-a'" in gone.stderr


def test_piped_output_is_not_cut_at_80_columns_and_usage_says_all_time(platform):
    source = "fake://a-model-with-a-long-name?step_ms=5&note=" + "x" * 60
    ok_json(ebb(platform, "deploy", "cli-wide", "--source", source, "--json"))
    try:
        # COLUMNS="" removes the variable: a script piping the output, with no terminal.
        table = ebb(platform, "deployments", COLUMNS="")
        assert table.returncode == 0, table.stderr
        [row] = [line for line in table.stdout.splitlines() if "cli-wide" in line]
        assert source in row, row
        usage = ebb(platform, "usage", COLUMNS="")
        assert usage.returncode == 0, usage.stderr
        first = usage.stdout.splitlines()[0]
        # No --start: the whole ledger, not a range starting in 1970.
        assert first.startswith("usage all time until ") and "1970" not in first, first
    finally:
        ebb(platform, "deployments", "delete", "cli-wide", "--yes")


def test_keys_and_a_tenant_key(platform):
    created = ok_json(ebb(platform, "keys", "create", "--tenant", "acme", "--name", "ci", "--json"))
    secret, key_id = created["key"], created["id"]
    listed = ok_json(ebb(platform, "keys", "list", "--json"))
    assert [k["tenant"] for k in listed["data"] if k["id"] == key_id] == ["acme"]
    assert secret not in json.dumps(listed), "listing keys must not reveal their secrets"

    # EBB_API_KEY makes the CLI call as the tenant: reading works, admin actions are refused.
    usage = ok_json(ebb(platform, "usage", "--json", EBB_API_KEY=secret))
    assert usage["object"] == "usage"
    refused = ebb(platform, "keys", "list", EBB_API_KEY=secret)
    assert refused.returncode == 1 and "admin key" in refused.stderr

    revoked = ebb(platform, "keys", "revoke", key_id)
    assert revoked.returncode == 0 and key_id in revoked.stdout
    after = ebb(platform, "usage", EBB_API_KEY=secret)
    assert after.returncode == 1 and "Incorrect or revoked API key" in after.stderr
    again = ebb(platform, "keys", "revoke", key_id)
    assert again.returncode == 1 and "No active key" in again.stderr


def test_refusals_exit_1_with_the_platforms_reason(platform):
    bounds = ebb(platform, "deploy", "cli-b", "--source", "fake://m", "--min", "3", "--max", "1")
    assert bounds.returncode == 1
    assert "min_replicas (3) must not exceed max_replicas (1)" in bounds.stderr
    assert bounds.stdout == ""

    bad_name = ebb(platform, "deploy", "Not A Name", "--source", "fake://m")
    assert bad_name.returncode == 1 and "name" in bad_name.stderr

    assert ebb(platform, "deploy", "cli-c", "--source", "fake://m", "--json").returncode == 0
    twice = ebb(platform, "deploy", "cli-c", "--source", "fake://m", "--create-only")
    assert twice.returncode == 1 and "already exists" in twice.stderr

    unknown_model = ebb(platform, "chat", "no-such-model", QUESTION)
    assert unknown_model.returncode == 1 and "does not exist" in unknown_model.stderr


def test_usage_errors_exit_2(platform):
    nothing = ebb(platform, "scale", "cli-c")
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr
    assert ebb(platform, "deploy", "cli-d").returncode == 2  # --source is required
    assert ebb(platform, "chat", "cli-c", "hi", "--temperature", "9").returncode == 2

    keyless = ebb(platform, "deployments", EBB_ADMIN_KEY="", EBB_HOME=str(temp_home("ebb-nokey-")))
    assert keyless.returncode == 2 and "no API key" in keyless.stderr


def test_unreachable_platform_exits_3(platform):
    result = ebb(platform, "deployments", "--json", EBB_PORT=str(free_port()))
    assert result.returncode == 3
    assert "cannot reach ebb" in result.stderr and result.stdout == ""


def test_versions_rollout_history_rollback(platform):
    ok_json(ebb(platform, "deploy", "cli-v", "--source", "fake://m", "--json"))
    second = ebb(platform, "deploy", "cli-v", "--source", "fake://m?step_ms=1")
    assert second.returncode == 0, second.stderr
    assert "deployed version 2 of cli-v" in second.stdout

    canary = ok_json(ebb(platform, "rollout", "cli-v", "--canary", "10", "--json"))
    assert canary["rollout"]["steps"] == [10, 50, 100]
    early = ebb(platform, "rollout", "cli-v")  # one rollout at a time
    assert early.returncode == 1 and "being rolled out" in early.stderr

    def warm() -> bool:
        return ok_json(ebb(platform, "deployments", "history", "cli-v", "--json"))["traffic"] == {
            "1": 90,
            "2": 10,
        }

    wait_until(warm, 60, "the canary to take its first share")
    promoted = ok_json(ebb(platform, "rollout", "cli-v", "--promote", "--json"))
    assert promoted["traffic"] == {"1": 50, "2": 50}
    table = ebb(platform, "deployments", "history", "cli-v")
    assert table.returncode == 0 and "fake://m?step_ms=1" in table.stdout
    assert "50 %" in table.stdout and "rollout v1 → v2" in table.stdout

    back = ok_json(ebb(platform, "rollback", "cli-v", "--json"))
    assert back["traffic"] == {"1": 100, "2": 0}
    assert back["rollout"]["state"] == "rolled_back"
