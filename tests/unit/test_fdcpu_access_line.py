"""The access line and log time stamps, as operators read them: every field, in order,
in both formats; the time as `logging.Formatter` writes it."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest

from ebb import logs
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.metrics import Metrics
from ebb.frontdoor.observe import RequestObservation

FIELDS = (
    "tenant=acme deployment=fast version=3 endpoint=chat.completion status=200 outcome=ok"
    " prompt_tokens=7 completion_tokens=1 queue_ms={queue} ttft_ms=None duration_ms={duration}"
)


@pytest.fixture
def access_lines(monkeypatch):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.RequestIdFilter())
    access = logging.getLogger("ebb.access")
    access.addHandler(handler)
    monkeypatch.setattr(access, "level", logging.INFO)
    yield handler, stream
    access.removeHandler(handler)


def _observed_request(metrics: Metrics) -> RequestObservation:
    caller = Caller(tenant="acme", key_id="k1", is_admin=False)
    observed = RequestObservation(metrics, "chatcmpl-1", caller, "chat.completion", {})
    observed.deployment, observed.version = "fast", 3
    observed.prompt_tokens, observed.completion_tokens = 7, 1
    observed.admitted(0.0123, time.time())
    return observed


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_access_line_carries_every_field(access_lines, log_format):
    handler, stream = access_lines
    handler.setFormatter(logs.JsonFormatter() if log_format == "json" else logs.TextFormatter())
    metrics = Metrics()
    _observed_request(metrics).end(200)
    line = stream.getvalue().strip()
    if log_format == "json":
        record = json.loads(line)
        assert record["logger"] == "ebb.access" and record["request_id"] == "chatcmpl-1"
        assert record["queue_ms"] == 12.3 and record["ttft_ms"] is None
        message = FIELDS.format(queue=12.3, duration=record["duration_ms"])
        assert record["message"] == f"access {message}"
        assert (record["tenant"], record["version"], record["status"]) == ("acme", 3, 200)
    else:
        duration = line.rsplit("duration_ms=", 1)[1]
        assert line.endswith(
            "INFO ebb.access [chatcmpl-1] access " + FIELDS.format(queue=12.3, duration=duration)
        )
    # The metrics the same request counted (through the remembered label children).
    assert metrics.outcomes.labels("fast", "ok", "200")._value.get() == 1
    assert metrics.queue_wait.labels("fast")._sum.get() == pytest.approx(0.0123)


def test_time_stamps_are_those_logging_writes_across_seconds():
    text, plain, json_format = logs.TextFormatter(), logging.Formatter(), logs.JsonFormatter()
    for created in (1765065599.999, 1765065600.0, 1765065600.5, 1765065601.25, 1765065599.5):
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
        record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
        record.request_id = ""
        assert text.formatTime(record) == plain.formatTime(record)
        expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        assert json.loads(json_format.format(record))["ts"] == (
            f"{expected}.{int(record.msecs):03d}Z"
        )
