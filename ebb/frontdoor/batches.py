"""The Batch API's pure parts: reading an input file, writing output and error files,
and OpenAI's batch object. Nothing here does I/O.

An input line is `{"custom_id", "method": "POST", "url", "body"}`; every line of a batch
names the batch's endpoint. An output line is `{"id", "custom_id", "response": {
"status_code", "request_id", "body"}, "error": null}`; an error line carries `"response":
null` and `"error": {"code", "message"}`, as OpenAI's files do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ebb.errors import InvalidRequest
from ebb.frontdoor.body import JsonRefused, strict_json
from ebb.queue.batch_store import BatchLine, BatchRecord
from ebb.queue.job_schema import JobRecord, JobStatus

ENDPOINTS = {
    "/v1/chat/completions": "chat.completions",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}
COMPLETION_WINDOWS = {"24h": 24 * 3600}
MAX_CUSTOM_ID_CHARS = 512


@dataclass(frozen=True)
class InputLine:
    custom_id: str
    body: dict[str, Any]


class InvalidInput(InvalidRequest):
    """An input file that is not a batch; `line` is the 1-based line at fault (None: the
    file as a whole)."""

    def __init__(self, message: str, *, line: int | None = None, code: str | None = None):
        super().__init__(message, param="input_file_id", code=code)
        self.line = line

    def batch_error(self) -> dict[str, Any]:
        """The error as OpenAI's batch object lists it (`errors.data[]`)."""
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


def count_lines(content: bytes) -> int:
    """The requests a file holds: its non-blank lines."""
    return sum(1 for raw in content.splitlines() if raw.strip())


def check_line_count(content: bytes, max_lines: int) -> None:
    """InvalidInput naming the count when the file holds no request or more than
    `max_lines` (each becomes a job kept in Redis while its batch runs)."""
    found = count_lines(content)
    if found == 0:
        raise InvalidInput("The input file holds no requests.")
    if found > max_lines:
        raise InvalidInput(
            f"The input file holds {found} requests; a batch holds at most {max_lines} "
            "(EBB_BATCH_MAX_LINES). Split it into several files and batches.",
            code="too_many_lines",
        )


def parse_input(
    content: bytes, endpoint: str, *, max_lines: int, max_line_bytes: int
) -> list[InputLine]:
    """The file's requests; InvalidInput naming the first line that is not one.

    Each line is read by the strict decoder of request bodies (`ebb.frontdoor.body`):
    UTF-8 only, no lone surrogates (text that could not be stored or echoed back), at most
    MAX_JSON_DEPTH deep, and at most `max_line_bytes` long (a request body's cap: each line
    is a job whose request is kept in Redis while its batch runs).
    """
    check_line_count(content, max_lines)
    lines: list[InputLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), start=1):
        if len(raw) > max_line_bytes:
            raise InvalidInput(
                f"line {number} of the input file is {len(raw)} bytes; a request may be at "
                f"most {max_line_bytes} (EBB_MAX_BODY_BYTES).",
                line=number,
                code="line_too_long",
            )
        if raw.strip():
            line = _parse_line(raw, number, endpoint)
            if line.custom_id in seen:
                raise InvalidInput(
                    f"line {number} of the input file: custom_id {line.custom_id!r} is used "
                    "twice; make them unique.",
                    line=number,
                )
            seen.add(line.custom_id)
            lines.append(line)
    if not lines:
        raise InvalidInput("The input file holds no requests.")
    return lines


def _parse_line(raw: bytes, number: int, endpoint: str) -> InputLine:
    where = f"line {number} of the input file"
    try:
        item = strict_json(raw)
    except JsonRefused as e:
        raise InvalidInput(
            f"{where} is {e.reason} Each line must be one request object.", line=number, code=e.code
        ) from e
    if not isinstance(item, dict) or set(item) - {"custom_id", "method", "url", "body"}:
        raise InvalidInput(
            f'{where} must be {{"custom_id", "method", "url", "body"}}.', line=number
        )
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID_CHARS:
        raise InvalidInput(
            f"{where}: custom_id must be a string of 1 to 512 characters.", line=number
        )
    if item.get("method") != "POST":
        raise InvalidInput(f'{where}: method must be "POST".', line=number)
    if item.get("url") != endpoint:
        raise InvalidInput(f"{where}: url must be the batch's endpoint, {endpoint}.", line=number)
    if not isinstance(item.get("body"), dict) or not item["body"].get("model"):
        raise InvalidInput(f"{where}: body must be a request object naming its model.", line=number)
    return InputLine(custom_id, item["body"])


def output_files(
    record: BatchRecord, jobs: dict[str, JobRecord | None]
) -> tuple[list[str], list[str]]:
    """(output lines, error lines) of a batch whose jobs have all settled."""
    outputs, errors = [], []
    for line in record.lines:
        job = jobs.get(line.job_id) if line.job_id else None
        if job is not None and job.status is JobStatus.SUCCEEDED:
            response = {"status_code": 200, "request_id": job.job_id, "body": job.result}
            outputs.append(_line(line, response, None))
        else:
            errors.append(_line(line, None, _error(line, job)))
    return outputs, errors


def _error(line: BatchLine, job: JobRecord | None) -> dict[str, Any]:
    if line.error is not None:
        return line.error
    if job is None:
        return {"code": "lost", "message": "The request's job record has expired."}
    if job.error is not None:
        return {"code": job.error.code, "message": job.error.message}
    return {"code": f"batch_{job.status.value}", "message": f"The request was {job.status}."}


def _line(line: BatchLine, response: Any, error: Any) -> str:
    item = {"id": f"batch_req_{line.job_id or line.custom_id}", "custom_id": line.custom_id}
    return json.dumps({**item, "response": response, "error": error}, ensure_ascii=False)


def counts(record: BatchRecord, jobs: dict[str, JobRecord | None]) -> dict[str, int]:
    completed = failed = 0
    for line in record.lines:
        if line.pending:  # neither: it waits for its rate limits
            continue
        job = jobs.get(line.job_id) if line.job_id else None
        if job is not None and job.status is JobStatus.SUCCEEDED:
            completed += 1
        elif line.error is not None or job is None or job.status.is_terminal:
            failed += 1
    return {"total": len(record.lines), "completed": completed, "failed": failed}


def batch_view(record: BatchRecord, request_counts: dict[str, int]) -> dict[str, Any]:
    """OpenAI's batch object."""
    return {
        "id": record.batch_id,
        "object": "batch",
        "endpoint": record.endpoint,
        "errors": {"object": "list", "data": record.errors} if record.errors else None,
        "input_file_id": record.input_file_id,
        "completion_window": record.completion_window,
        "status": record.status.value,
        "output_file_id": record.output_file_id,
        "error_file_id": record.error_file_id,
        "created_at": record.created_at_s,
        "in_progress_at": record.in_progress_at_s,
        "expires_at": record.expires_at_s,
        "finalizing_at": record.finalizing_at_s,
        "completed_at": record.completed_at_s,
        "failed_at": record.failed_at_s,
        "expired_at": record.expired_at_s,
        "cancelling_at": record.cancelling_at_s,
        "cancelled_at": record.cancelled_at_s,
        "request_counts": request_counts,
        "metadata": record.metadata or None,
    }
