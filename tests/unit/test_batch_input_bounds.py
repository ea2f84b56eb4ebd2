"""A Batch API input file's bounds (issue 46): at most `max_lines` requests, each line at
most `max_line_bytes`; refusals name the count or the line."""

from __future__ import annotations

import json

import pytest

from ebb.frontdoor.batches import InvalidInput, check_line_count, count_lines, parse_input

ENDPOINT = "/v1/chat/completions"


def _line(custom_id: str, **body: object) -> bytes:
    item = {"custom_id": custom_id, "method": "POST", "url": ENDPOINT,
            "body": {"model": "m", **body}}  # fmt: skip
    return json.dumps(item).encode() + b"\n"


def test_blank_lines_are_not_requests():
    assert count_lines(_line("a") + b"\n  \r\n" + _line("b")) == 2


def test_more_lines_than_the_cap_is_refused_naming_the_count():
    content = b"".join(_line(f"l{i}") for i in range(6))
    check_line_count(content, 6)
    with pytest.raises(InvalidInput) as refused:
        check_line_count(content, 5)
    assert "6 requests" in refused.value.message and "at most 5" in refused.value.message
    assert refused.value.code == "too_many_lines" and refused.value.param == "input_file_id"
    with pytest.raises(InvalidInput, match="no requests"):
        check_line_count(b"\n\n", 5)


def test_a_line_longer_than_a_request_body_is_refused_naming_it():
    content = _line("a") + _line("b", user="x" * 500)
    assert len(parse_input(content, ENDPOINT, max_lines=10, max_line_bytes=1000)) == 2
    with pytest.raises(InvalidInput) as refused:
        parse_input(content, ENDPOINT, max_lines=10, max_line_bytes=200)
    assert refused.value.line == 2 and "at most 200" in refused.value.message
    assert refused.value.batch_error()["line"] == 2


def test_parse_refuses_past_the_line_cap_too():
    content = b"".join(_line(f"l{i}") for i in range(3))
    with pytest.raises(InvalidInput, match="3 requests"):
        parse_input(content, ENDPOINT, max_lines=2, max_line_bytes=1000)
