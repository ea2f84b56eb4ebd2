"""Redis replies as the Python types ebb reads them as.

ebb's clients never decode responses (`connection`: decode_responses=False), so every
string Redis sends is bytes. redis-py cannot know that from its types and annotates
replies as `bytes | str` (or `Any` for scripts); these helpers narrow a reply to what it
is, accepting the decoded form too, and raise TypeError on anything else.
"""

from __future__ import annotations

from collections.abc import Mapping


def reply_text(reply: object) -> str:
    if isinstance(reply, bytes):
        return reply.decode()
    if isinstance(reply, str | int):
        return str(reply)
    raise TypeError(f"expected a string reply, got {reply!r}")


def reply_bytes(reply: object) -> bytes:
    if isinstance(reply, bytes):
        return reply
    if isinstance(reply, str):
        return reply.encode()
    raise TypeError(f"expected a bulk string reply, got {reply!r}")


def reply_int(reply: object) -> int:
    if isinstance(reply, int | bytes | str):
        return int(reply)
    raise TypeError(f"expected an integer reply, got {reply!r}")


def reply_list(reply: object) -> list[object]:
    if isinstance(reply, list | tuple):
        return list(reply)
    raise TypeError(f"expected an array reply, got {reply!r}")


def reply_texts(reply: object) -> list[str]:
    return [reply_text(item) for item in reply_list(reply)]


def reply_hash(reply: Mapping[bytes | str, bytes | str] | None) -> dict[bytes, bytes]:
    """A hash (HGETALL, a stream entry's fields) with bytes field names and values."""
    return {reply_bytes(k): reply_bytes(v) for k, v in (reply or {}).items()}


def reply_entries(reply: object) -> list[tuple[str, dict[bytes, bytes]]]:
    """A stream's entries (XRANGE, one stream of XREAD): (entry id, fields) pairs."""
    entries = []
    for entry in reply_list(reply or []):
        entry_id, fields = reply_list(entry)
        if fields is not None and not isinstance(fields, Mapping):
            raise TypeError(f"expected a stream entry's fields, got {fields!r}")
        entries.append((reply_text(entry_id), reply_hash(fields)))
    return entries
