"""The SSE bytes ebb sends, read by the parsers clients run (issue 52): vLLM's benchmark
client (`vllm bench serve`'s own request functions, StreamedResponseHandler), the OpenAI
Python SDK's SSE decoder, and a plain `data: ` line parser. By default a stream is the
bare `data:` events; event ids come only to a client that asks (`X-Ebb-Resumable: 1`)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import aiohttp
import httpx
import pytest
from openai._streaming import SSEDecoder
from support import deploy
from support.weights import write_servable_dir

pytestmark = pytest.mark.integration

MODEL = "wire"
TOKENS = 12
PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def served(admin):
    deploy(admin, MODEL, "fake://w", min_replicas=1, max_replicas=1)
    return MODEL


def _raw(admin: httpx.Client, path: str, body: dict, **headers: str) -> bytes:
    with admin.stream("POST", path, json=body, headers=headers) as r:
        assert r.status_code == 200, r.read()
        return r.read()


def _chat_body(**extra: object) -> dict:
    messages = [{"role": "user", "content": PROMPT}]
    return {"model": MODEL, "messages": messages, "max_tokens": TOKENS, "stream": True, **extra}


def _line_parser(wire: bytes) -> list[dict]:
    """What most hand-written clients do: every `data: ` line up to `[DONE]` is JSON."""
    chunks = []
    for line in wire.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunks.append(json.loads(line[len("data: ") :]))
    return chunks


def _sdk_events(wire: bytes) -> list:
    return list(SSEDecoder().iter_bytes(iter([wire])))


def test_a_default_stream_is_bare_data_events_every_parser_reads(admin, served):
    wire = _raw(admin, "/v1/chat/completions", _chat_body(stream_options={"include_usage": True}))
    events = wire.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    assert all(e.startswith(b"data: ") and b"\n" not in e for e in events[:-1]), wire[:400]
    chunks = _line_parser(wire)
    assert chunks[-1]["usage"]["completion_tokens"] == TOKENS
    sdk = _sdk_events(wire)
    assert [e.json() for e in sdk[:-1]] == chunks and sdk[-1].data == "[DONE]"
    assert all(e.id is None for e in sdk)


def test_an_opted_in_stream_numbers_its_events_and_still_parses(admin, served):
    wire = _raw(admin, "/v1/chat/completions", _chat_body(), **{"X-Ebb-Resumable": "1"})
    sdk = _sdk_events(wire)
    request_id = sdk[0].json()["id"]
    assert [e.id for e in sdk] == [f"{request_id}:{n}" for n in range(len(sdk))]
    assert [e.json() for e in sdk[:-1]] == _line_parser(wire)
    refused = admin.post(
        "/v1/chat/completions", json=_chat_body(), headers={"X-Ebb-Resumable": "maybe"}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "X-Ebb-Resumable"


def test_a_resumed_stream_carries_ids_only_when_asked(admin, served):
    with admin.stream("POST", "/v1/chat/completions", json=_chat_body()) as r:
        request_id = r.headers["x-request-id"]
        live = r.read()
    url = f"/v1/chat/completions/{request_id}/stream"
    assert admin.get(url).content == live, "the same bytes as the live stream"
    rest = _sdk_events(admin.get(url, headers={"Last-Event-ID": f"{request_id}:2"}).content)
    assert rest[0].id == f"{request_id}:3" and rest[-1].data == "[DONE]"
    assert [e.data for e in rest] == [e.data for e in _sdk_events(live)[3:]]


async def _vllm_bench(backend: str, api_url: str, key: str, **headers: str):
    from vllm.benchmarks.lib.endpoint_request_func import ASYNC_REQUEST_FUNCS, RequestFuncInput

    request = RequestFuncInput(
        prompt=PROMPT,
        api_url=api_url,
        prompt_len=8,
        output_len=TOKENS,
        model=MODEL,
        extra_headers={"Authorization": f"Bearer {key}", **headers},
    )
    async with aiohttp.ClientSession() as session:
        return await ASYNC_REQUEST_FUNCS[backend](request, session)


@pytest.mark.parametrize(
    ("backend", "path"), [("openai", "/v1/completions"), ("openai-chat", "/v1/chat/completions")]
)
def test_vllm_bench_serves_request_functions_succeed_on_a_default_stream(
    platform, served, backend, path
):
    out = asyncio.run(_vllm_bench(backend, platform.base_url + path, platform.admin_key))
    assert out.success, out.error
    assert out.output_tokens == TOKENS and out.generated_text
    # What the opt-in costs such a client: it cannot read an event with an `id:` line.
    opted_in = asyncio.run(
        _vllm_bench(
            backend, platform.base_url + path, platform.admin_key, **{"X-Ebb-Resumable": "1"}
        )
    )
    # (how it fails depends on how the bytes arrive: a JSONDecodeError, or no chunk read)
    assert not opted_in.success, opted_in


def test_vllm_bench_serve_runs_from_the_venv_and_completes_every_request(
    platform, served, tmp_path
):
    """`vllm bench serve`, as the venv can run it (`ebb-vllm`, runners/engine_cli), with
    its defaults but for the load's size: every request completes."""
    tokenizer = write_servable_dir(tmp_path / "tok", mib=1)
    help_ = _engine_cli("bench", "serve", "--help")
    assert help_.returncode == 0 and "--base-url" in help_.stdout, help_.stderr[-2000:]
    run = _engine_cli(
        *("bench", "serve", "--base-url", platform.base_url, "--model", MODEL),
        *("--tokenizer", str(tokenizer), "--dataset-name", "random", "--num-prompts", "4"),
        *("--random-input-len", "8", "--random-output-len", str(TOKENS)),
        *("--max-concurrency", "2", "--disable-tqdm", "--save-result"),
        *("--result-dir", str(tmp_path), "--result-filename", "result.json"),
        OPENAI_API_KEY=platform.admin_key,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["completed"], result["failed"]) == (4, 0), result.get("errors")


def _engine_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ebb.runners.engine_cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
