"""Logging for every ebb process: one format (text or JSON), the request id on each line.

`request_id` is a context variable: the frontdoor sets it when a request arrives, and
every log line written while serving that request (its asyncio task and what it awaits)
carries it, whichever module logs. JSON lines (`EBB_LOG_FORMAT=json`) hold `ts`, `level`,
`logger`, `message`, `request_id` when set, and the structured fields a line passes as
`extra={"fields": {...}}` (the access log does).

`redacting` names text that lines written inside it must not show (a tenant's adapter's
name and source, in the log of a base runner that another tenant reads) and what stands
in for it; every handler `configure` installs applies it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
# (private text, what is shown instead), longest first, for lines written in this context.
_redactions: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "redactions", default=()
)

# Libraries whose INFO lines are noise in an operator's log (every HTTP call, every poll).
_CHATTY_LOGGERS = ("httpx", "httpcore", "urllib3", "botocore", "filelock")

# Set for `ebb up` and inherited by its children: no progress bars in log files, no
# library lectures on the operator's terminal.
QUIET_LIBRARIES_ENV = {
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(request_prefix)s%(message)s"


class RequestIdFilter(logging.Filter):
    """Stamps each record with the current request id (an attribute formats can use)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", ""):
            record.request_id = request_id.get()
        record.request_prefix = f"[{record.request_id}] " if record.request_id else ""
        return True


@contextlib.contextmanager
def redacting(replacements: Mapping[str, str]) -> Iterator[None]:
    """Within it (this thread or task and what it awaits), every log line shows each key
    of `replacements` as its value."""
    pairs = [*_redactions.get(), *((k, v) for k, v in replacements.items() if k)]
    token = _redactions.set(tuple(sorted(pairs, key=lambda p: -len(p[0]))))
    try:
        yield
    finally:
        _redactions.reset(token)


class RedactFilter(logging.Filter):
    """Rewrites a record's message as `redacting` asks (formatted once, here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        pairs = _redactions.get()
        if pairs:
            message = record.getMessage()
            for private, shown in pairs:
                message = message.replace(private, shown)
            record.msg, record.args = message, None
        return True


class _SecondStamp:
    """`strftime(format, convert(t))` of a time's whole second, formatted once a second:
    the frontdoor writes a line per request, hundreds within each second."""

    def __init__(self, time_format: str, convert: Callable[[float], time.struct_time]):
        self._format = time_format
        self._convert = convert
        self._last: tuple[int, str] = (-1, "")  # replaced whole: safe across threads

    def __call__(self, created: float) -> str:
        second, stamp = self._last
        if int(created) != second:
            stamp = time.strftime(self._format, self._convert(created))
            self._last = (int(created), stamp)
        return stamp


class TextFormatter(logging.Formatter):
    """`_TEXT_FORMAT`, its time as `logging.Formatter` writes it (local, with ms)."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)
        self._stamp = _SecondStamp(self.default_time_format, self.converter)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return f"{self._stamp(record.created)},{int(record.msecs):03d}"


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._stamp = _SecondStamp("%Y-%m-%dT%H:%M:%S", time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": f"{self._stamp(record.created)}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if getattr(record, "request_id", ""):
            line["request_id"] = record.request_id
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(log_format: str = "text", level: int = logging.INFO) -> None:
    """Set up the root logger of this process: every line to stderr (which `ebb up` and
    the launcher point at the process's log file)."""
    _install([_formatted(logging.StreamHandler(sys.stderr), log_format)], level)


def configure_up(log_path: Path, log_format: str = "text") -> None:
    """`ebb up`'s own logging: every line to `log_path`, only errors to the terminal (its
    console output says what a person needs), Python warnings into the file too."""
    for name, value in QUIET_LIBRARIES_ENV.items():
        os.environ.setdefault(name, value)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    to_file = _formatted(logging.FileHandler(log_path), log_format)
    to_terminal = logging.StreamHandler(sys.stderr)
    to_terminal.setLevel(logging.ERROR)
    to_terminal.setFormatter(logging.Formatter("error: %(message)s"))
    _install([to_file, to_terminal], logging.INFO)
    logging.captureWarnings(True)


def _formatted(handler: logging.Handler, log_format: str) -> logging.Handler:
    handler.addFilter(RequestIdFilter())
    handler.addFilter(RedactFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    return handler


def _install(handlers: list[logging.Handler], level: int) -> None:
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
