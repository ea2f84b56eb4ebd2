"""A runner forked from the fork server on the real engine: vLLM imported once, by the
server, and a deployment at zero answered by a runner that never imported it itself."""

from __future__ import annotations

import pytest
from support import real_engine_platform, wait_for_weights

from ebb.config import DEFAULT_MODEL_SOURCE

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
IMPORT_LOG_LINE = b"preload (vllm imports) took"


@pytest.fixture(scope="module")
def platform(default_local_model):
    with real_engine_platform("ebb-e2e-fork-", EBB_PREWARM="0", EBB_FORK_SERVER="1") as p:
        p.wait_for_fork_server()
        yield p


def test_a_forked_runner_answers_from_zero_without_importing_vllm(platform, admin):
    created = admin.post(
        "/v1/deployments",
        json={"name": "smol-forked", "source": DEFAULT_MODEL_SOURCE, "idle_timeout_s": 60},
    )
    assert created.status_code == 201, created.text
    wait_for_weights(admin, "smol-forked")
    reply = platform.openai(timeout=120).chat.completions.create(
        model="smol-forked", messages=QUESTION, temperature=0, max_tokens=24
    )
    assert "Paris" in reply.choices[0].message.content
    view = admin.get("/v1/deployments/smol-forked").json()
    [runner] = view["runners"]
    assert runner["tier"] == "forked"
    assert {"engine", "total", "first_token"} <= set(view["cold_start_ms"]["forked"])
    runner_log = (platform.home / "logs" / f"runner-{runner['id']}.log").read_bytes()
    assert b"ready for smol-forked via forked" in runner_log
    assert IMPORT_LOG_LINE not in runner_log, "the runner imported vLLM itself"
    assert IMPORT_LOG_LINE in (platform.home / "logs" / "fork-server.log").read_bytes()
