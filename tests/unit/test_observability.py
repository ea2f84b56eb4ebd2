"""Pure pieces of observability: outcome labels, bounded tenant labels, /metrics without
Redis, JSON log lines with the request id, log files read by cursor and by time."""

from __future__ import annotations

import json
import logging
import time

from metrics_support import Scrape

from ebb import logs
from ebb.frontdoor.metrics import BoundedLabel, Metrics
from ebb.frontdoor.observe import outcome_of
from ebb.logtail import decode_cursor, encode_cursor, read_new
from ebb.queue.connection import async_client
from ebb.queue.platform import PlatformState


def test_outcomes_by_status_and_code():
    assert outcome_of(200, "") == ("ok", "200")
    assert outcome_of(200, "engine_error") == ("error", "engine_error")  # a failed stream
    assert outcome_of(500, "runner_lost") == ("runner_lost", "runner_lost")
    assert outcome_of(429, "rate_limit_exceeded") == ("rate_limited", "429")
    assert outcome_of(503, "queue_full") == ("unavailable", "queue_full")
    assert outcome_of(404, "model_not_found") == ("client_error", "404")
    assert outcome_of(499, "") == ("cancelled", "499")
    assert outcome_of(500, "internal_error") == ("error", "internal_error")


def test_bounded_label_keeps_the_first_values_and_folds_the_rest():
    label = BoundedLabel(2)
    assert [label(v) for v in ("a", "b", "c", "a", "d")] == ["a", "b", "other", "a", "other"]


async def test_metrics_without_redis_say_redis_is_down():
    state = PlatformState(async_client("redis://127.0.0.1:1/0"))
    try:
        scrape = Scrape((await Metrics().render(state)).decode())
    finally:
        await state.redis.aclose()
    assert scrape.value("ebb_redis_up") == 0
    assert scrape.labels_of("ebb_redis_up") == [{}]


def test_json_lines_carry_the_request_id_of_the_context():
    handler = logging.StreamHandler()
    handler.addFilter(logs.RequestIdFilter())
    handler.setFormatter(logs.JsonFormatter())
    record = logging.LogRecord("ebb.x", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    token = logs.request_id.set("chatcmpl-1")
    try:
        handler.filter(record)
        line = json.loads(handler.format(record))
    finally:
        logs.request_id.reset(token)
    assert line["message"] == "hello you" and line["request_id"] == "chatcmpl-1"
    assert line["level"] == "INFO" and line["ts"].endswith("Z")


def test_log_files_read_by_cursor_then_only_new_complete_lines(tmp_path):
    path = tmp_path / "runner-r1.log"
    path.write_text("one\ntwo\nthree\npart")
    lines, offsets = read_new([path], None, tail_lines=2)
    assert [line.text for line in lines] == ["two", "three"]
    assert lines[0].source == "runner-r1"
    offsets = decode_cursor(encode_cursor(offsets))
    with path.open("a") as f:
        f.write("ial\nfour\n")
    lines, _ = read_new([path], offsets)
    assert [line.text for line in lines] == ["partial", "four"]


def test_since_keeps_lines_from_that_time_with_their_continuations(tmp_path):
    old = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 3600))
    new = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    path = tmp_path / "frontdoor.log"
    path.write_text(f"{old},1 INFO a old\n{new},1 INFO a new\nTraceback (continued)\n")
    lines, _ = read_new([path], None, since_s=time.time() - 60)
    assert [line.text.split(" ", 2)[-1] for line in lines] == ["INFO a new", "(continued)"]
