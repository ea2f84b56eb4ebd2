"""Priority classes through the platform's HTTP API (fake engine): classes set in tenant
and key limits, refused when unknown, and a sheddable key's requests shed first when a
deployment's queue is saturated while standard work is still admitted."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from support import deploy, wait_until

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "hi"}]


def test_an_unknown_priority_is_a_400_naming_the_field(platform):
    with platform.admin() as admin:
        for path in ("/v1/tenants/prio-bad/limits", "/v1/deployments"):
            body = {"priority": "urgent"}
            if path == "/v1/deployments":
                body.update(name="prio-bad", source="fake://m")
            answer = admin.request("PUT" if "limits" in path else "POST", path, json=body)
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["param"] == "priority" and error["type"] == "invalid_request_error"
            # It says what to send instead.
            assert "'critical'" in error["message"] and "'sheddable'" in error["message"]


def test_a_keys_priority_overrides_its_tenants_and_shows_in_the_limits(platform):
    with platform.admin() as admin:
        key = admin.post("/v1/keys", json={"tenant": "prio-t", "name": "k"}).json()
        set_tenant = admin.put("/v1/tenants/prio-t/limits", json={"priority": "critical"})
        assert set_tenant.json()["priority"] == "critical"
        admin.put(f"/v1/keys/{key['id']}/limits", json={"priority": "sheddable"})
        assert admin.get(f"/v1/keys/{key['id']}/limits").json()["priority"] == "sheddable"
        assert admin.get("/v1/tenants/prio-t/limits").json()["priority"] == "critical"
        [listed] = [t for t in admin.get("/v1/tenants").json()["data"] if t["tenant"] == "prio-t"]
        assert listed["priority"] == "critical"


def test_sheddable_requests_are_shed_first_when_the_queue_is_saturated(platform):
    with platform.admin() as admin:
        # Its runner never gets ready: whatever is admitted waits in the queue.
        deploy(
            admin,
            "prio-slow",
            source="fake://m?load_s=600",
            queue_depth_limit=4,
            admission_timeout_s=600,
        )
        shed_key = admin.post("/v1/keys", json={"tenant": "prio-s", "name": "s"}).json()
        std_key = admin.post("/v1/keys", json={"tenant": "prio-n", "name": "n"}).json()
        # The tenant is critical, its key sheddable: the key's class is the one that counts.
        admin.put("/v1/tenants/prio-s/limits", json={"priority": "critical"})
        admin.put(f"/v1/keys/{shed_key['id']}/limits", json={"priority": "sheddable"})
    body = {"model": "prio-slow", "messages": MESSAGES, "max_tokens": 1}

    def post(client: httpx.AsyncClient, key: dict) -> asyncio.Future[httpx.Response]:
        headers = {"Authorization": f"Bearer {key['key']}"}
        answer = client.post("/v1/chat/completions", json=body, headers=headers)
        return asyncio.ensure_future(answer)

    def depth_is(n: int) -> bool:
        with platform.admin() as admin:
            return admin.get("/v1/deployments/prio-slow").json()["queue_depth"] == n

    async def scenario() -> tuple[httpx.Response, list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=platform.base_url, timeout=120) as client:
            # A sheddable request alone is admitted: the queue is not saturated.
            parked = [post(client, shed_key)]
            await asyncio.to_thread(wait_until, lambda: depth_is(1), 30, "1 queued")
            # Half the depth limit (EBB_SHED_QUEUE_FRACTION 0.5 of 4) is saturation.
            parked.append(post(client, std_key))
            await asyncio.to_thread(wait_until, lambda: depth_is(2), 30, "2 queued")
            shed = await post(client, shed_key)
            # Standard work is still admitted, up to the queue's limit.
            parked.append(post(client, std_key))
            await asyncio.to_thread(wait_until, lambda: depth_is(3), 30, "3 queued")
            for waiting in parked:
                waiting.cancel()
            return shed, parked

    shed, _ = asyncio.run(scenario())
    assert shed.status_code == 503, shed.text
    error = shed.json()["error"]
    assert error["code"] == "shed" and "sheddable" in error["message"]
    assert int(shed.headers["retry-after"]) >= 1


def test_a_deployments_priority_is_the_admins_to_set(platform):
    with platform.admin() as admin:
        admin.put(
            "/v1/tenants/prio-own/quota",
            json={"max_deployments": 1, "max_replicas": 1, "max_gpus": 1, "allowed_sources": ["*"]},
        ).raise_for_status()
        key = admin.post("/v1/keys", json={"tenant": "prio-own", "name": "k"}).json()["key"]
        body = {"name": "prio-own-m", "source": "fake://m", "priority": "critical"}
        with httpx.Client(base_url=platform.base_url, timeout=60) as tenant:
            refused = tenant.post(
                "/v1/deployments", json=body, headers={"Authorization": f"Bearer {key}"}
            )
        assert refused.status_code == 403 and refused.json()["error"]["param"] == "priority"
        # The admin sets it; the deployment shows it.
        made = deploy(admin, "prio-crit", source="fake://m", priority="critical")
        assert made["priority"] == "critical"
        assert (
            admin.patch("/v1/deployments/prio-crit", json={"priority": "sheddable"}).json()[
                "priority"
            ]
            == "sheddable"
        )


def test_the_cli_sets_a_priority_and_keeps_it_when_other_limits_change(platform):
    set_ = platform.cli("tenants", "limits", "prio-cli", "--priority", "sheddable")
    assert set_.returncode == 0, set_.stderr
    assert "priority sheddable" in set_.stdout
    kept = platform.cli("tenants", "limits", "prio-cli", "--rpm", "50")
    assert "priority sheddable" in kept.stdout and "50 requests/min" in kept.stdout
    bad = platform.cli("keys", "limits", "--tenant", "prio-cli", "--priority", "urgent")
    assert bad.returncode != 0 and "priority" in bad.stdout + bad.stderr


def test_a_critical_request_does_not_wait_for_a_full_runners_slot(platform):
    with platform.admin() as admin:
        deploy(
            admin,
            "prio-one-slot",
            source="fake://m?step_ms=20",
            min_replicas=1,
            max_concurrency=1,
        )
        wait_until(
            lambda: admin.get("/v1/deployments/prio-one-slot").json()["replicas"]["ready"] == 1,
            60,
            "the runner",
        )
        key = admin.post("/v1/keys", json={"tenant": "prio-c", "name": "c"}).json()["key"]
        admin.put("/v1/tenants/prio-c/limits", json={"priority": "critical"})

    async def scenario() -> tuple[httpx.Response, bool]:
        async with httpx.AsyncClient(base_url=platform.base_url, timeout=120) as client:
            first_token = asyncio.Event()

            async def long_standard() -> None:
                body = {"model": "prio-one-slot", "messages": MESSAGES, "max_tokens": 500}
                headers = {"Authorization": f"Bearer {platform.admin_key}"}
                async with client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json={**body, "stream": True},
                    headers=headers,
                ) as answer:
                    async for _ in answer.aiter_lines():
                        first_token.set()

            standard = asyncio.ensure_future(long_standard())
            await asyncio.wait_for(first_token.wait(), 60)
            critical = await client.post(
                "/v1/chat/completions",
                json={"model": "prio-one-slot", "messages": MESSAGES, "max_tokens": 2},
                headers={"Authorization": f"Bearer {key}"},
            )
            still_running = not standard.done()
            standard.cancel()
            return critical, still_running

    critical, standard_still_running = asyncio.run(scenario())
    assert critical.status_code == 200, critical.text
    # It was served beside the one slot's request, not after it.
    assert standard_still_running
