"""Reading the platform's log files incrementally, for `ebb logs` and its API.

Every process `ebb up` supervises writes `EBB_HOME/logs/NAME.log`, every runner
`runner-ID.log` (`coldstart.launcher`), the controller its decisions about each deployment
`decisions-UID.log`. A `Cursor` holds a byte offset per file, so a
follower asks for "what is new since this cursor" and never re-reads or misses a line
(a line still being written, without its newline, waits for the next read). `since_s`
filters by each line's timestamp: the text format's leading `YYYY-MM-DD HH:MM:SS`, or a
JSON line's `ts`; a line without one (a traceback, a library's print) goes with the
line before it.
"""

from __future__ import annotations

import base64
import calendar
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

PLATFORM_LOGS = ("frontdoor", "coldstart", "webhooks", "billing")
# At most this much of a file is read per call (a follower gets the rest next time).
_MAX_READ_BYTES = 1 << 20
_TEXT_TS = re.compile(rb"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})")
_JSON_TS = re.compile(rb'^\{"ts": "(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})')


def runner_log(logs_dir: Path, runner_id: str) -> Path:
    return logs_dir / f"runner-{runner_id}.log"


_UID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def decisions_log(logs_dir: Path, deployment_uid: str) -> Path | None:
    """The controller's decisions about one deployment (`coldstart.decision_log`), by its
    uid: a later deployment of the same name never reads an earlier one's. None for a
    uid that names no file (a record from before uids)."""
    if not _UID.match(deployment_uid):
        return None
    return logs_dir / f"decisions-{deployment_uid}.log"


def platform_log(logs_dir: Path, name: str) -> Path:
    return logs_dir / f"{name}.log"


@dataclass(frozen=True)
class LogLine:
    source: str  # the file's name without .log: "frontdoor", "runner-r1a2...", ...
    text: str


# A cursor names at most this many files, in at most this many characters: far more than
# any deployment's runners, far less than a body worth parsing.
MAX_CURSOR_FILES = 4096
MAX_CURSOR_CHARS = 256 * 1024
# The log files a cursor may name: a platform process's or a runner's (`runner_log`).
_CURSOR_FILE = re.compile(
    r"^(?:runner-[A-Za-z0-9_-]{1,64}|decisions-[A-Za-z0-9_-]{1,64}|[a-z]{1,32})\.log$"
)
_MAX_OFFSET = 1 << 62


def encode_cursor(offsets: dict[str, int]) -> str:
    return base64.urlsafe_b64encode(json.dumps(offsets).encode()).decode()


def decode_cursor(cursor: str) -> dict[str, int]:
    """Offsets of an `encode_cursor` string; ValueError, saying what is wrong, when it is
    not one: not base64 of a JSON object, too long, a file name no log has, or an offset
    that is not a non-negative integer."""
    if len(cursor) > MAX_CURSOR_CHARS:
        raise ValueError(f"cursor is longer than {MAX_CURSOR_CHARS} characters")
    try:
        raw = base64.b64decode(cursor.encode("ascii"), altchars=b"-_", validate=True)
        offsets = json.loads(raw)
    except (ValueError, TypeError, RecursionError) as e:
        raise ValueError("cursor is not one this API returned (not base64 JSON)") from e
    if not isinstance(offsets, dict) or len(offsets) > MAX_CURSOR_FILES:
        raise ValueError("cursor is not one this API returned (not an object of offsets)")
    for name, offset in offsets.items():
        if not _CURSOR_FILE.match(name):
            raise ValueError(f"cursor names no log file: {name[:80]!r}")
        # bool is an int to Python, not an offset.
        if type(offset) is not int or not 0 <= offset <= _MAX_OFFSET:
            raise ValueError(f"cursor's offset of {name!r} is not a non-negative integer")
    return offsets


def read_new(
    files: list[Path],
    offsets: dict[str, int] | None,
    *,
    tail_lines: int = 100,
    since_s: float | None = None,
) -> tuple[list[LogLine], dict[str, int]]:
    """Lines after `offsets` (None: the last `tail_lines` of each file, or every line
    since `since_s`), and the offsets to continue from."""
    lines: list[LogLine] = []
    new_offsets: dict[str, int] = {}
    for path in files:
        if not path.exists():
            continue
        start = None if offsets is None else offsets.get(path.name, 0)
        found, new_offsets[path.name] = _read_file(path, start, tail_lines, since_s)
        lines += [LogLine(path.name.removesuffix(".log"), text) for text in found]
    return lines, new_offsets


def _read_file(
    path: Path, start: int | None, tail_lines: int, since_s: float | None
) -> tuple[list[str], int]:
    size = path.stat().st_size
    begin = start if start is not None else (0 if since_s is not None else max(0, size - (1 << 18)))
    if begin > size:  # the file was truncated or replaced: start over
        begin = 0
    with path.open("rb") as f:
        f.seek(begin)
        data = f.read(_MAX_READ_BYTES)
    complete = data[: data.rfind(b"\n") + 1]
    raw = complete.splitlines()
    if start is None and since_s is None and begin > 0 and raw:
        raw = raw[1:]  # began mid-line
    if since_s is not None:
        raw = _since(raw, since_s)
    elif start is None:
        raw = raw[-tail_lines:]
    return [r.decode(errors="replace") for r in raw], begin + len(complete)


def _since(raw: list[bytes], since_s: float) -> list[bytes]:
    keep: list[bytes] = []
    current = False
    for line in raw:
        stamp = _timestamp_s(line)
        if stamp is not None:
            current = stamp >= since_s
        if current:
            keep.append(line)
    return keep


def _timestamp_s(line: bytes) -> float | None:
    match = _TEXT_TS.match(line) or _JSON_TS.match(line)
    if match is None:
        return None
    text = match.group(1).decode().replace("T", " ")
    parsed = time.strptime(text, "%Y-%m-%d %H:%M:%S")
    # JSON lines are UTC; text lines use the process's local time (asctime).
    if line.startswith(b"{"):
        return float(calendar.timegm(parsed))
    return time.mktime(parsed)
