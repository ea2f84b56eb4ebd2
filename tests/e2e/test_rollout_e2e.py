"""A rollout on the real engine: from the default model to a second version of it with
different engine options, while a streaming client (the official `openai` client) runs
throughout. No stream fails, and the streams switch from version 1 to version 2 once."""

from __future__ import annotations

import threading

import pytest
from support import real_engine_platform, wait_until

from ebb.config import DEFAULT_MODEL_NAME, DEFAULT_MODEL_SOURCE

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform(default_local_model):
    with real_engine_platform("ebb-e2e-rollout-", default_model=True) as p:
        yield p


class Streams(threading.Thread):
    """Streams one chat completion after another, each one's version and text kept."""

    def __init__(self, client):
        super().__init__(daemon=True)
        self.client = client
        self.stop = threading.Event()
        self.results: list[tuple[str, str]] = []  # (x-ebb-version, text)
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                raw = self.client.chat.completions.with_raw_response.create(
                    model=DEFAULT_MODEL_NAME,
                    messages=QUESTION,
                    temperature=0,
                    max_tokens=12,
                    stream=True,
                )
                text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
                self.results.append((raw.headers.get("x-ebb-version", ""), text))
            except Exception as e:  # any failure is the test's finding
                self.errors.append(repr(e))


def test_rollout_to_new_engine_options_under_a_streaming_client(platform, admin):
    # Version 1 warm first, so the client never waits on a cold start from zero.
    assert admin.patch(f"/v1/deployments/{DEFAULT_MODEL_NAME}", json={"min_replicas": 1}).is_success
    wait_until(
        lambda: admin.get(f"/v1/deployments/{DEFAULT_MODEL_NAME}").json()["replicas"]["ready"],
        600,
        "version 1's runner",
        poll_s=1,
    )
    streams = Streams(platform.openai(timeout=300))
    streams.start()
    try:
        wait_until(lambda: len(streams.results) >= 3, 300, "streams on version 1", poll_s=0.5)
        created = admin.post(
            "/v1/deployments",
            json={
                "name": DEFAULT_MODEL_NAME,
                "source": DEFAULT_MODEL_SOURCE,
                "engine": {"enable_prefix_caching": False},
            },
        )
        assert created.status_code == 201, created.text
        assert created.json()["deployed_version"] == 2
        rollout = admin.post(
            f"/v1/deployments/{DEFAULT_MODEL_NAME}/rollout", json={"strategy": "immediate"}
        )
        assert rollout.status_code == 200, rollout.text
        wait_until(
            lambda: [v for v, _ in streams.results[-3:]] == ["2", "2", "2"],
            900,
            "streams on version 2",
            poll_s=1,
        )
    finally:
        streams.stop.set()
        streams.join(timeout=300)
    assert streams.errors == []
    versions = [v for v, _ in streams.results]
    assert versions[0] == "1" and versions[-1] == "2"
    switch = versions.index("2")
    assert set(versions[:switch]) == {"1"} and set(versions[switch:]) == {"2"}
    assert all("Paris" in text for _, text in streams.results)
    history = admin.get(f"/v1/deployments/{DEFAULT_MODEL_NAME}/versions").json()
    assert history["data"][1]["engine"]["enable_prefix_caching"] is False
    assert history["traffic"] == {"1": 0, "2": 100}
