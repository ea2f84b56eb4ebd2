"""Streams outlive their frontdoor: every SSE event carries an id for a client that asks
(`X-Ebb-Resumable: 1`, as these do); a client whose
frontdoor was SIGKILLed mid-stream resumes on another with `Last-Event-ID` and gets the
rest once; a SIGTERMed frontdoor refuses new connections and finishes its streams."""

from __future__ import annotations

import contextlib
import signal
import threading

import httpx
import pytest
from support import Platform, deploy, temp_home, wait_until
from support.billing import new_key
from support.frontdoors import SseEvent, chat_text, sse_events, start_frontdoor

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
# 20 ms a token: a 150-token stream lasts seconds, time to kill its frontdoor mid-way.
SOURCE = "fake://m?step_ms=20"
TOKENS = 150


@pytest.fixture(scope="module")
def platform(redis_server):
    p = Platform(home=temp_home("ebb-fd-restarts-"), redis_url=redis_server.url).start()
    with p.admin() as admin:
        deploy(admin, "roll", SOURCE, idle_timeout_s=120)
        p.keys = {t: new_key(admin, t) for t in ("t-owner", "t-other")}  # type: ignore[attr-defined]
    yield p
    assert p.stop() == 0


def client(url: str, key: str) -> httpx.Client:
    """A resumable client: it asks for event ids (without, none are sent; sse_ids)."""
    headers = {"Authorization": f"Bearer {key}", "X-Ebb-Resumable": "1"}
    return httpx.Client(base_url=url, timeout=120, headers=headers)


def body(tokens: int = TOKENS) -> dict:
    return {"model": "roll", "messages": MESSAGES, "max_tokens": tokens, "stream": True}


def whole_stream(url: str, key: str) -> tuple[str, list[SseEvent]]:
    with client(url, key) as c, c.stream("POST", "/v1/chat/completions", json=body()) as r:
        assert r.status_code == 200, r.read()
        return r.headers["x-request-id"], list(sse_events(r))


def test_every_event_carries_its_request_id_and_number(platform):
    request_id, events = whole_stream(platform.base_url, platform.keys["t-owner"])
    assert [e.id for e in events] == [f"{request_id}:{n}" for n in range(len(events))]
    assert events[-1].data == "[DONE]"
    assert chat_text(events)


def test_a_client_of_a_killed_frontdoor_resumes_on_another_and_gets_the_rest_once(platform):
    key = platform.keys["t-owner"]
    _, uninterrupted = whole_stream(platform.base_url, key)
    doomed = start_frontdoor(platform, "doomed")
    with client(doomed.url, key) as c, c.stream("POST", "/v1/chat/completions", json=body()) as r:
        request_id = r.headers["x-request-id"]
        events = sse_events(r)
        seen = [next(events) for _ in range(10)]
        doomed.stop(signal.SIGKILL)
    with client(platform.base_url, key) as c:
        url = f"/v1/chat/completions/{request_id}/stream"
        with c.stream("GET", url, headers={"Last-Event-ID": seen[-1].id}) as r:
            assert r.status_code == 200, r.read()
            rest = list(sse_events(r))
        stranger = client(platform.base_url, platform.keys["t-other"])
        refused = stranger.get(url, headers={"Last-Event-ID": seen[-1].id})
        stranger.close()
    whole = seen + rest
    assert [e.id for e in whole] == [f"{request_id}:{n}" for n in range(len(whole))]
    assert chat_text(whole) == chat_text(uninterrupted), "nothing repeated, nothing missing"
    assert whole[-1].data == "[DONE]"
    first, resumed = seen[0].json(), rest[0].json()
    assert (resumed["id"], resumed["created"]) == (first["id"], first["created"])
    assert refused.status_code == 404, "a request id is not an identity"
    assert refused.json()["error"]["param"] == "request_id"


def test_resuming_after_the_last_event_gets_nothing_and_a_bad_id_is_a_400(platform):
    key = platform.keys["t-owner"]
    request_id, events = whole_stream(platform.base_url, key)
    with client(platform.base_url, key) as c:
        url = f"/v1/chat/completions/{request_id}/stream"
        assert c.get(url, headers={"Last-Event-ID": events[-1].id}).text == ""
        again = c.get(url)  # no Last-Event-ID: the whole answer again
        bad = c.get(url, headers={"Last-Event-ID": "chatcmpl-other:3"})
        wrong_endpoint = c.get(f"/v1/completions/{request_id}/stream")
    replayed = list(sse_events(httpx.Response(200, content=again.content)))
    assert [(e.id, e.data) for e in replayed] == [(e.id, e.data) for e in events]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "Last-Event-ID"
    assert wrong_endpoint.status_code == 404


def test_hostile_event_numbers_are_a_400_to_the_owner_and_a_404_to_anyone_else(platform):
    owner, other = platform.keys["t-owner"], platform.keys["t-other"]
    request_id, _ = whole_stream(platform.base_url, owner)
    chat_url = f"/v1/chat/completions/{request_id}/stream"
    with client(platform.base_url, owner) as c:
        response_id = c.post(
            "/v1/responses",
            json={"model": "roll", "input": "Hi", "stream": True, "max_output_tokens": 4},
        ).headers["x-request-id"]
    response_url = f"/v1/responses/{response_id}"
    # "²" and "٣" pass str.isdigit (sent as UTF-8 bytes, which the server reads as latin-1).
    numbers = ["²", "٣", "9" * 5000, "1" * 11]
    for key, status in ((owner, 400), (other, 404)):
        with client(platform.base_url, key) as c:
            for number in numbers:
                for url, request_id_ in ((chat_url, request_id), (response_url, response_id)):
                    header = f"{request_id_}:{number}".encode()
                    params = {"stream": "true"} if url == response_url else {}
                    got = c.get(url, params=params, headers={"Last-Event-ID": header})
                    assert got.status_code == status, (number, url, got.text)
                    if status == 400:
                        assert got.json()["error"]["param"] == "Last-Event-ID"
                got = c.get(response_url, params={"stream": "true", "starting_after": number})
                assert got.status_code == status, (number, got.text)
                if status == 400:
                    assert got.json()["error"]["param"] == "starting_after"


@pytest.mark.parametrize("workers", [1, 2])
def test_a_sigtermed_frontdoor_refuses_new_work_and_finishes_its_streams(platform, workers):
    key = platform.keys["t-owner"]
    _, uninterrupted = whole_stream(platform.base_url, key)
    rolled = start_frontdoor(
        platform,
        f"rolled-{workers}",
        EBB_FRONTDOOR_DRAIN_S="120",
        EBB_FRONTDOOR_WORKERS=str(workers),
    )
    started = threading.Barrier(5)
    results: list[list[SseEvent] | BaseException] = []

    def stream() -> None:
        try:
            with (
                client(rolled.url, key) as c,
                c.stream("POST", "/v1/chat/completions", json=body()) as r,
            ):
                events = sse_events(r)
                first = next(events)
                started.wait(timeout=60)
                results.append([first, *events])
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            results.append(e)

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for t in threads:
        t.start()
    started.wait(timeout=60)  # every stream has output: the restart cuts into them
    rolled.proc.send_signal(signal.SIGTERM)
    wait_until(rolled.refuses_connections, 30, "the draining frontdoor to refuse connections")
    still_draining = rolled.proc.poll() is None and len(results) < 4
    for t in threads:
        t.join(timeout=120)
    # uvicorn re-raises the SIGTERM it handled once it has drained.
    assert rolled.stop() in (0, -signal.SIGTERM)
    assert all(isinstance(r, list) for r in results), results
    assert len(results) == 4
    for events in results:
        assert events[-1].data == "[DONE]", "no stream is cut"
        assert chat_text(events) == chat_text(uninterrupted)
    assert still_draining, "new connections were refused while streams were still running"


def test_a_stream_cut_by_the_end_of_a_drain_keeps_running_for_its_client_to_resume(platform):
    key = platform.keys["t-owner"]
    _, uninterrupted = whole_stream(platform.base_url, key)
    short = start_frontdoor(platform, "short-drain", EBB_FRONTDOOR_DRAIN_S="1")
    with client(short.url, key) as c, c.stream("POST", "/v1/chat/completions", json=body()) as r:
        request_id = r.headers["x-request-id"]
        events = sse_events(r)
        seen = [next(events) for _ in range(5)]
        short.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(httpx.TransportError):  # the drain's end cuts it
            for event in events:
                seen.append(event)
    assert short.stop() in (0, -signal.SIGTERM)
    assert seen[-1].data != "[DONE]", "the stream outlasted the grace: nothing was cut"
    with client(platform.base_url, key) as c:
        url = f"/v1/chat/completions/{request_id}/stream"
        with c.stream("GET", url, headers={"Last-Event-ID": seen[-1].id}) as r:
            rest = list(sse_events(r))
    assert chat_text(seen + rest) == chat_text(uninterrupted), "the request was not cancelled"
    assert rest[-1].data == "[DONE]"


def test_a_responses_stream_is_resumed_openais_way_from_a_sequence_number(platform):
    key = platform.keys["t-owner"]
    body = {"model": "roll", "input": "What is the capital of France?", "stream": True}
    body["max_output_tokens"] = 20
    with client(platform.base_url, key) as c:
        live = c.post("/v1/responses", json=body)
        response_id = live.headers["x-request-id"]
        url = f"/v1/responses/{response_id}"
        again = c.get(url, params={"stream": "true"})
        rest = c.get(url, params={"stream": "true", "starting_after": 3})
    with client(platform.base_url, platform.keys["t-other"]) as c:
        refused = c.get(url, params={"stream": "true"})
    assert again.text == live.text, "the same events, byte for byte"
    events = list(sse_events(httpx.Response(200, content=live.content)))
    assert [e.id for e in events] == [f"{response_id}:{n}" for n in range(len(events))]
    assert [e.json()["sequence_number"] for e in events] == list(range(len(events)))
    resumed = list(sse_events(httpx.Response(200, content=rest.content)))
    assert [e.data for e in resumed] == [e.data for e in events[4:]]
    assert resumed[-1].fields["event"] == "response.incomplete"
    assert refused.status_code == 404
