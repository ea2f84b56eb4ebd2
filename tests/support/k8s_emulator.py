"""kmock's Kubernetes emulator on 127.0.0.1, in a thread of its own, for the official
(blocking) client. It stores objects and streams watches; it schedules nothing, checks no
schema and changes no phase: tests patch pod status themselves, as a kubelet would."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kmock
from kubernetes import client


@contextmanager
def emulator(logs: dict[str, bytes] | None = None) -> Iterator[Any]:
    """A CoreV1Api on a fresh emulator; `logs`: path -> body of canned log replies."""
    box: dict[str, Any] = {}
    ready = threading.Event()

    async def serve() -> None:
        async with kmock.KubernetesEmulator() as em, kmock.Server(em, host="127.0.0.1") as srv:
            for resource in ("v1/pods", "v1/events", "v1/nodes"):
                em.resources[resource] = {}
            for path, body in (logs or {}).items():
                em[f"get {path}"] << body
            box.update(url=str(srv.url).rstrip("/"), loop=asyncio.get_running_loop())
            box["stop"] = asyncio.Event()
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(30), "the emulator did not start"
    config = client.Configuration()
    config.host = box["url"]
    api = client.CoreV1Api(client.ApiClient(config))
    try:
        yield api
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(timeout=10)
