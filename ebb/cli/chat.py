"""CLI: send a chat message to a deployment and stream the answer (the console's Playground)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import httpx
import typer

from ebb.cli.api import EXIT_REFUSED, Api, JsonObject, JsonOpt, err_console, print_json


def _sse_data(response: httpx.Response) -> Iterator[JsonObject]:
    """The JSON objects of a server-sent event stream, up to `data: [DONE]`."""
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            return
        yield json.loads(data)


def chat(
    model: str = typer.Argument(..., help="The deployment to ask (its name is the model)."),
    message: str = typer.Argument(..., help="Your message."),
    system: str = typer.Option("", "--system", help="A system prompt."),
    temperature: float = typer.Option(0.7, min=0, max=2, help="Sampling temperature."),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1, help="Most tokens to generate."),
    as_json: bool = JsonOpt,
) -> None:
    """Send a chat message and stream the answer, then its time to first token and usage."""
    messages = [{"role": "user", "content": message}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    body = {
        "model": model,
        "messages": messages,
        "temperature": temperature,
        "max_tokens": max_tokens,
    }
    api = Api()
    if as_json:
        print_json(api.call("POST", "/v1/chat/completions", json=body))
        return
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    started = time.monotonic()
    with api.stream("POST", "/v1/chat/completions", json=stream_body) as response:
        request_id = response.headers.get("x-request-id", "")
        summary = _print_stream(response, model, started)
    err_console.print(f"[dim]{summary} · {request_id}[/]")


def _print_stream(response: httpx.Response, model: str, started: float) -> str:
    """Writes the answer to stdout as it arrives; returns the one-line summary."""
    # A deployment at zero may need a cold start first: show that something is happening.
    waiting = err_console.status(f"waiting for {model} (it may be starting a runner)…")
    waiting.start()
    first_s = None
    usage: JsonObject = {}
    finish = ""
    try:
        for chunk in _sse_data(response):
            if "error" in chunk:
                waiting.stop()
                err_console.print(f"\n[red]error:[/] {chunk['error'].get('message')}")
                raise typer.Exit(EXIT_REFUSED)
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                text = (choice.get("delta") or {}).get("content") or ""
                if text and first_s is None:
                    first_s = time.monotonic() - started
                    waiting.stop()
                sys.stdout.write(text)
                sys.stdout.flush()
                finish = choice.get("finish_reason") or finish
    finally:
        waiting.stop()
    sys.stdout.write("\n")
    ttft = f"{first_s * 1000:.0f} ms" if first_s is not None else "—"
    return (
        f"time to first token {ttft} · {usage.get('prompt_tokens', 0)} prompt + "
        f"{usage.get('completion_tokens', 0)} completion tokens · finish {finish or '—'}"
    )
