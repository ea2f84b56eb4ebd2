"""Files under EBB_HOME that processes share: the admin key and where the platform runs."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from ebb.config import Settings

ADMIN_KEY_FILE = "admin_key"
RUN_INFO_FILE = "run.json"


def new_secret(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def resolve_admin_key(settings: Settings) -> str:
    """EBB_ADMIN_KEY if set; otherwise the key saved under EBB_HOME, generated once."""
    if settings.admin_key:
        return settings.admin_key
    path = settings.home / ADMIN_KEY_FILE
    if path.exists():
        return path.read_text().strip()
    settings.home.mkdir(parents=True, exist_ok=True)
    key = new_secret("ebb-admin-")
    # Created with owner-only permissions from the first byte, never world-readable.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


def write_run_info(settings: Settings, **info: object) -> None:
    """Owner-only (0600): the Redis URL in it carries the embedded Redis's password."""
    path = settings.home / RUN_INFO_FILE
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(info, indent=2))
    tmp.replace(path)


def read_run_info(home: Path) -> dict:
    path = home / RUN_INFO_FILE
    return json.loads(path.read_text()) if path.exists() else {}
