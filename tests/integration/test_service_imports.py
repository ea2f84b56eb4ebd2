"""The platform's long-running processes import what they run and nothing more: no
command line (typer, rich), no boto3 unless S3 is configured, no engine."""

from __future__ import annotations

import re

import pytest
from support import Platform, temp_home

pytestmark = pytest.mark.integration

SERVICES = ("frontdoor", "coldstart", "webhooks", "billing")
# (click is not among them: uvicorn's own command line imports it in the frontdoor.)
NEVER = ("typer", "rich", "pygments", "boto3", "botocore", "torch", "transformers")
# `python -X importtime` writes a line per module imported: "import time: self | cumulative | name".
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| +(\S+)$", re.MULTILINE)


def test_service_processes_import_no_command_line_no_s3_client_and_no_engine():
    platform = Platform(
        home=temp_home("ebb-imports-"),
        redis_url=None,
        env_extra={"PYTHONPROFILEIMPORTTIME": "1"},
    ).start()
    try:
        platform.openai().models.list()  # the frontdoor has served a request
    finally:
        assert platform.stop() == 0
    for service in SERVICES:
        log = (platform.home / "logs" / f"{service}.log").read_text()
        top_level = {name.split(".")[0] for name in IMPORTED.findall(log)}
        assert "ebb" in top_level, (service, log[-2000:])  # the log holds its imports
        assert not top_level & set(NEVER), (service, sorted(top_level & set(NEVER)))
