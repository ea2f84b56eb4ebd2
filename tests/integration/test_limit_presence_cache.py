"""A caller's rate limits are cached as absent at admission (no round trip for callers
without one), yet a limit set through the frontdoor applies to the very next request."""

from __future__ import annotations

import httpx
import pytest
from support import deploy

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "hi"}]


def test_a_limit_set_after_unlimited_requests_applies_to_the_next_one(platform):
    with platform.admin() as admin:
        deploy(admin, "limcache", source="fake://m")
        key = admin.post("/v1/keys", json={"tenant": "limcache-t"}).json()
    body = {"model": "limcache", "messages": MESSAGES, "max_tokens": 1}
    with httpx.Client(
        base_url=platform.base_url, timeout=60, headers={"Authorization": f"Bearer {key['key']}"}
    ) as client:
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        with platform.admin() as admin:
            limits = {"requests_per_minute": 1}
            admin.put(f"/v1/keys/{key['id']}/limits", json=limits).raise_for_status()
        statuses = [client.post("/v1/chat/completions", json=body).status_code for _ in range(2)]
    assert statuses == [200, 429]
