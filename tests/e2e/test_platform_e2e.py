"""The real platform end to end: `ebb up` with the default model on the real vLLM engine,
driven by the official `openai` client and plain HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import httpx
import openai
import pytest
from platform_processes import pid_of, processes
from support import real_engine_platform, wait_for_weights, wait_until

from ebb.config import DEFAULT_MODEL_NAME, DEFAULT_MODEL_SOURCE
from ebb.queue import keys
from ebb.runners.load_reserve import guest_reports_free_pages

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform(default_local_model):
    with real_engine_platform(
        "ebb-e2e-", default_model=True, EBB_PREWARM="1", EBB_FORK_SERVER="1"
    ) as p:
        yield p


@pytest.fixture(scope="module")
def client(platform):
    return platform.openai(timeout=120)


def deployment(admin: httpx.Client, name: str) -> dict:
    return admin.get(f"/v1/deployments/{name}").json()


def test_models_list_has_the_default_model(client):
    assert DEFAULT_MODEL_NAME in [m.id for m in client.models.list().data]


def test_paris_non_streamed_from_zero(platform, client, admin):
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME, messages=QUESTION, temperature=0, max_tokens=32
    )
    assert "Paris" in reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    runners = deployment(admin, DEFAULT_MODEL_NAME)["runners"]
    assert [r["tier"] for r in runners if r["state"] == "ready"] == ["prewarmed"], (
        "the first request at zero must be served by the pre-warmed stem"
    )
    # On a guest that reports free pages to its host (a host without GPUs, the default
    # EBB_STEM_LOAD_RESERVE_GIB=auto), the stem joined the pool with its load reserve
    # written and freed all of it for the load; elsewhere it wrote none.
    [stem] = [r["id"] for r in runners if r["state"] == "ready"]
    stem_log = (platform.home / "logs" / f"runner-{stem}.log").read_text()
    if guest_reports_free_pages():
        assert "load reserve written: 1.50 GiB" in stem_log
        assert "load reserve released: 1.50 of 1.50 GiB written" in stem_log
    else:
        assert "no load reserve: this machine does not report free pages" in stem_log


def test_paris_streamed_with_usage(client):
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=QUESTION,
        temperature=0,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_the_long_lived_processes_never_load_torch(platform, admin):
    # After requests were served: the weights were prepared by a short-lived `ebb prepare`
    # the controller ran, the frontdoor only read the tokenizer: neither maps torch.
    assert deployment(admin, DEFAULT_MODEL_NAME)["weights"] == "ready"
    for role in ("frontdoor", "coldstart"):
        maps = Path(f"/proc/{pid_of(platform.home, role)}/maps").read_text()
        assert "libtorch" not in maps, f"the {role} process has torch loaded"


def test_json_mode_returns_parseable_json(client):
    # As with OpenAI's JSON mode, the prompt itself asks for JSON; the grammar guarantees it.
    messages = [
        {"role": "system", "content": "You answer with a single JSON object and nothing else."},
        {
            "role": "user",
            "content": 'What is the capital of France? Answer as JSON with the key "capital".',
        },
    ]
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=messages,
        temperature=0,
        max_tokens=64,
        response_format={"type": "json_object"},
    )
    assert reply.choices[0].finish_reason == "stop"
    answer = json.loads(reply.choices[0].message.content)
    assert isinstance(answer, dict) and "Paris" in json.dumps(answer)


def test_json_schema_is_followed(client):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=QUESTION,
        temperature=0,
        max_tokens=256,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema},
        },
    )
    assert set(json.loads(reply.choices[0].message.content)) == {"city"}


def cores_of_threads(pid: int) -> dict[int, str]:
    """Each thread of a process (by id) and the cores it may run on ("0-1", "1")."""
    cores = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # it ended meanwhile
            status = (task / "status").read_text()
            cores[int(task.name)] = status.split("Cpus_allowed_list:")[1].split()[0]
    return cores


def test_the_serving_engine_has_a_core_of_its_own_and_its_grammar_threads_do_not(platform):
    # After the JSON tests: the runner's engine started its grammar compiler threads from
    # its serving thread, pinned. Pinned only where torch serves on one thread: ebb's
    # default (every core but one) on 2 cores, or an OMP_NUM_THREADS of 1. The runner logs
    # which it was.
    allowed = sorted(os.sched_getaffinity(0))
    threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 2) - 1))
    logs = "".join(p.read_text() for p in (platform.home / "logs").glob("runner-*.log"))
    if threads != 1 or len(allowed) < 2:
        assert "engine thread not pinned" in logs
        return
    assert f"engine thread pinned to core {allowed[-1]}" in logs, re.findall(r"engine .*", logs)
    # Runners, and the fork server with the runners it forked (they keep its command line).
    found = processes(platform.home, "runner") + processes(platform.home, "fork-server")
    runners = {p.pid: cores_of_threads(p.pid) for p in found}
    pinned = {pid for pid, cores in runners.items() if cores[pid] == str(allowed[-1])}
    assert len(pinned) == 1, f"one serving engine, on core {allowed[-1]}: {runners}"
    every_core = cores_of_threads(os.getpid())[os.getpid()]
    for pid, cores in runners.items():
        others = {tid: c for tid, c in cores.items() if tid != pid}
        assert set(others.values()) <= {every_core}, f"runner {pid}: a thread beside it pinned"


def test_completions_with_logprobs_and_stop(client):
    reply = client.completions.create(
        model=DEFAULT_MODEL_NAME,
        prompt="The capital of France is",
        max_tokens=8,
        temperature=0,
        logprobs=2,
        stop=["."],
    )
    choice = reply.choices[0]
    assert "." not in choice.text
    assert len(choice.logprobs.tokens) == reply.usage.completion_tokens
    assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)


def pool_filled(admin: httpx.Client) -> bool:
    pool = admin.get("/v1/status").json()["pool"]
    return pool["prewarmed"] >= pool["target"]


def test_scale_from_zero_and_back_to_zero_and_the_pool_refills(client, admin):
    wait_until(lambda: pool_filled(admin), 120, "the pre-warmed pool to refill")
    created = admin.post(
        "/v1/deployments",
        json={
            "name": "smol-brief",
            "source": DEFAULT_MODEL_SOURCE,
            "idle_timeout_s": 3,
        },
    )
    assert created.status_code == 201, created.text
    assert wait_for_weights(admin, "smol-brief", 60)["status"] == "scaled_to_zero"
    reply = client.chat.completions.create(
        model="smol-brief", messages=QUESTION, temperature=0, max_tokens=24
    )
    assert "Paris" in reply.choices[0].message.content
    view = wait_until(
        lambda: (
            (d := deployment(admin, "smol-brief"))["status"] == "scaled_to_zero"
            and all(r["state"] == "exited" for r in d["runners"])
            and d
        ),
        120,
        "the runner to drain and exit after its idle timeout",
    )
    assert {r["state"] for r in view["runners"]} == {"exited"}
    assert [r["tier"] for r in view["runners"]] == ["prewarmed"]
    wait_until(lambda: pool_filled(admin), 120, "the pool to refill after the stem was used")


def test_runner_not_ready_in_time_gives_503_and_the_request_never_runs(
    client, admin, platform_redis
):
    # A real engine cannot load in 0.5 s (a pre-warmed stem's load alone takes ~0.75 s on
    # 2 cores, and a 1 s window let one through), while the controller, woken by the
    # enqueue, has begun the start well inside it: the request must be refused, not run late.
    created = admin.post(
        "/v1/deployments",
        json={
            "name": "smol-impatient",
            "source": DEFAULT_MODEL_SOURCE,
            "admission_timeout_s": 0.5,
            "idle_timeout_s": 5,
        },
    )
    assert created.status_code == 201, created.text
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="smol-impatient", messages=QUESTION, max_tokens=8)
    assert refused.value.status_code == 503
    assert int(refused.value.response.headers["retry-after"]) >= 1
    request_id = refused.value.response.headers["x-request-id"]
    wait_until(
        lambda: deployment(admin, "smol-impatient")["status"] == "ready",
        180,
        "the runner to become ready after the refusal",
    )
    # The runner claims from the moment it is ready; the refused request is not there.
    assert platform_redis.hget(keys.request(request_id), "state") == b"withdrawn"
    assert platform_redis.zcard(keys.queue("smol-impatient")) == 0
    usage = admin.get("/v1/usage").json()
    assert "smol-impatient" not in [row["deployment"] for row in usage["data"]]
