"""Deployment versions and rollouts on the whole platform (fake engine, real Redis):
rollouts under steady load drop nothing, a canary's split holds, a failing canary rolls
back by itself, and a version's secrets stay secret."""

from __future__ import annotations

import time

import httpx
import msgspec
import psutil
import pytest
import redis
from support import Platform, deploy, temp_home, wait_until
from support.billing import new_key, tenant_client
from support.steady_load import MESSAGES, SteadyLoad

from ebb.queue import keys
from ebb.queue.deployment_lookup import read_deployment, read_serving_units
from ebb.queue.schema import DeploymentSpec
from ebb.queue.versions import TrafficSplit, VersionRecord, pick_version, route_point
from ebb.secrets import new_key as new_secrets_key

pytestmark = pytest.mark.integration

SECRET_VALUE = "hf_" + "s3cr3t-value-0123456789"


@pytest.fixture(scope="module")
def platform():
    p = Platform(
        home=temp_home("ebb-it-versions-"),
        redis_url=None,
        env_extra={"EBB_SECRETS_KEY": new_secrets_key()},
    ).start()
    yield p
    assert p.stop() == 0


def _versions(admin: httpx.Client, name: str) -> dict:
    r = admin.get(f"/v1/deployments/{name}/versions")
    assert r.status_code == 200, r.text
    return r.json()


def _rollout(admin: httpx.Client, name: str, **body) -> dict:
    r = admin.post(f"/v1/deployments/{name}/rollout", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _new_version(admin: httpx.Client, name: str, source: str, **fields) -> int:
    r = admin.post("/v1/deployments", json={"name": name, "source": source, **fields})
    assert r.status_code == 201, r.text
    return r.json()["deployed_version"]


def _served_by(load: SteadyLoad, version: str, count: int, since_s: float = 0.0):
    return lambda: sum(o.version == version for o in load.since(since_s)) >= count


def test_a_new_deploy_is_a_new_version_and_create_only_is_kept(admin):
    deploy(admin, "hist", source="fake://a")
    assert _new_version(admin, "hist", "fake://b?step_ms=1") == 2
    again = admin.post(
        "/v1/deployments",
        json={"name": "hist", "source": "fake://c"},
        headers={"If-None-Match": "*"},
    )
    assert again.status_code == 409 and "already exists" in again.json()["error"]["message"]
    history = _versions(admin, "hist")
    assert [(v["version"], v["source"], v["traffic_pct"]) for v in history["data"]] == [
        (1, "fake://a", 100),
        (2, "fake://b?step_ms=1", 0),
    ]
    # What a version fixes does not change in place once there are versions.
    patched = admin.patch("/v1/deployments/hist", json={"engine": {"dtype": "float32"}})
    assert patched.status_code == 409 and "new version" in patched.json()["error"]["message"]
    assert admin.patch("/v1/deployments/hist", json={"max_replicas": 2}).status_code == 200
    refused = admin.post("/v1/deployments/hist/rollout/promote")
    assert refused.status_code == 409 and "no rollout" in refused.json()["error"]["message"]


def test_immediate_rollout_under_load_fails_nothing_and_the_old_version_drains(platform, admin):
    deploy(admin, "imm", source="fake://a?step_ms=5", idle_timeout_s=600)
    with SteadyLoad(platform.base_url, platform.admin_key, "imm", workers=4) as load:
        wait_until(_served_by(load, "1", 20), 60, "version 1 to serve")
        assert _new_version(admin, "imm", "fake://b?step_ms=5") == 2
        _rollout(admin, "imm", strategy="immediate")
        wait_until(_served_by(load, "2", 40), 60, "version 2 to take the traffic")
        switched = time.monotonic()
        wait_until(_served_by(load, "2", 40, switched), 60, "more of version 2")
        # Admission is fast enough that those 40 can all end within the second below.
        wait_until(lambda: load.since(switched + 1.0), 60, "requests a second after the switch")
    assert load.failures() == []
    late = [o.version for o in load.since(switched + 1.0)]
    assert late and set(late) == {"2"}
    view = _versions(admin, "imm")
    assert view["traffic"] == {"1": 0, "2": 100} and view["rollout"]["state"] == "done"
    # Version 1 has no traffic: its runner drains although the idle timeout is 600 s.
    wait_until(
        lambda: _versions(admin, "imm")["data"][0]["replicas"] == 0, 60, "version 1 to drain"
    )


def _share(outcomes, version: str) -> float:
    return sum(o.version == version for o in outcomes) / len(outcomes)


def test_canary_10_50_100_holds_its_split_and_fails_nothing(platform, admin):
    deploy(admin, "can", source="fake://a?step_ms=2", idle_timeout_s=600)
    _new_version(admin, "can", "fake://b?step_ms=2")
    with SteadyLoad(platform.base_url, platform.admin_key, "can", workers=6) as load:
        wait_until(_served_by(load, "1", 20), 60, "version 1 to serve")
        _rollout(admin, "can", strategy="canary", canary_pct=10)
        wait_until(
            lambda: _versions(admin, "can")["traffic"] == {"1": 90, "2": 10}, 60, "the canary"
        )
        for share, next_share in ((10, 50), (50, 100)):
            began = time.monotonic()
            wait_until(lambda b=began: len(load.since(b)) >= 400, 120, f"400 requests at {share}%")
            observed = _share(load.since(began), "2")
            assert abs(observed - share / 100) < 0.08, (share, observed)
            r = admin.post("/v1/deployments/can/rollout/promote")
            assert r.status_code == 200, r.text
            assert r.json()["traffic"]["2"] == next_share
        began = time.monotonic()
        wait_until(lambda: len(load.since(began)) >= 100, 120, "requests at 100%")
    assert load.failures() == []
    assert {o.version for o in load.since(began)} == {"2"}


def test_a_failing_canary_rolls_back_by_itself(platform, admin):
    deploy(admin, "bad", source="fake://a?step_ms=2", idle_timeout_s=600)
    _new_version(admin, "bad", "fake://a?step_ms=2&error_pct=50")
    with SteadyLoad(platform.base_url, platform.admin_key, "bad", workers=4) as load:
        wait_until(_served_by(load, "1", 20), 60, "version 1 to serve")
        _rollout(admin, "bad", strategy="canary", canary_pct=30, interval_s=600, min_requests=10)

        def rolled_back():
            rollout = _versions(admin, "bad")["rollout"]
            return rollout["state"] == "rolled_back" and rollout

        rollout = wait_until(rolled_back, 120, "the automatic rollback")
        back = time.monotonic()
        wait_until(lambda: len(load.since(back + 0.5)) >= 40, 60, "requests after it")
    assert "error rate" in rollout["reason"]
    assert _versions(admin, "bad")["traffic"] == {"1": 100, "2": 0}
    failed = load.failures()
    # Only the canary failed (refused by its engine, which alone has error_pct), and the
    # error answers name the version too.
    assert failed and all("error_pct=50" in o.error for o in failed)
    assert {o.version for o in failed} == {"2"}
    after = load.since(back + 0.5)
    assert all(o.ok and o.version == "1" for o in after)


def test_rollback_by_hand_after_a_finished_rollout(platform, admin):
    deploy(admin, "undo", source="fake://a")
    _new_version(admin, "undo", "fake://b")
    _rollout(admin, "undo", strategy="immediate")
    wait_until(lambda: _versions(admin, "undo")["traffic"] == {"1": 0, "2": 100}, 60, "the rollout")
    r = admin.post("/v1/deployments/undo/rollback")
    assert r.status_code == 200 and r.json()["traffic"] == {"1": 100, "2": 0}
    reply = admin.post(
        "/v1/chat/completions", json={"model": "undo", "messages": MESSAGES, "max_tokens": 4}
    )
    assert reply.status_code == 200 and reply.headers["x-ebb-version"] == "1"


def _every_redis_value(client) -> bytes:
    dump = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == b"string":
            dump.append(client.get(key) or b"")
        elif kind == b"hash":
            dump += [k + b"=" + v for k, v in client.hgetall(key).items()]
        elif kind == b"list":
            dump += client.lrange(key, 0, -1)
        elif kind == b"set":
            dump += list(client.smembers(key))
        elif kind == b"zset":
            dump += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == b"stream":
            for _, fields in client.xrange(key):
                dump += list(fields.values())
    return b"\n".join(dump)


def test_secrets_never_appear_in_responses_logs_or_redis(platform, admin):
    created = admin.post(
        "/v1/deployments",
        json={"name": "sec", "source": "fake://a", "env": {"HF_TOKEN": SECRET_VALUE}},
    )
    assert created.status_code == 201, created.text
    second = admin.post(
        "/v1/deployments",
        json={"name": "sec", "source": "fake://b", "env": {"APP_S3_SECRET": SECRET_VALUE + "x"}},
    )
    assert second.status_code == 201, second.text
    bad = admin.post(
        "/v1/deployments", json={"name": "sec", "source": "fake://b", "env": {"EBB_X": "1"}}
    )
    # A platform name: refused, with what a version may set instead.
    assert bad.status_code == 400 and "APP_<NAME>" in bad.json()["error"]["message"]
    _rollout(admin, "sec", strategy="canary", canary_pct=50)
    wait_until(lambda: _versions(admin, "sec")["traffic"]["2"] == 50, 60, "the canary")
    # A route key per version (the split is a stable hash of it), so both versions run.
    for version in (1, 2):
        key = next(
            k
            for k in map(str, range(1000))
            if pick_version({1: 50, 2: 50}, route_point(k)) == version
        )
        reply = admin.post(
            "/v1/chat/completions",
            json={"model": "sec", "messages": MESSAGES, "max_tokens": 4},
            headers={"x-ebb-route-key": key},
        )
        assert reply.status_code == 200 and reply.headers["x-ebb-version"] == str(version)
        assert SECRET_VALUE not in reply.text
    history = _versions(admin, "sec")
    assert [v["env"] for v in history["data"]] == [["HF_TOKEN"], ["APP_S3_SECRET"]]
    bodies = [
        created.text,
        second.text,
        admin.get("/v1/deployments").text,
        admin.get("/v1/deployments/sec").text,
        history.__repr__(),
        admin.get("/v1/usage").text,
    ]
    assert not any(SECRET_VALUE in b for b in bodies)
    assert SECRET_VALUE.encode() not in _every_redis_value(platform.redis())
    logs = b"".join(p.read_bytes() for p in platform.home.rglob("*.log"))
    # Each runner opened its version's env: it logs the names it set, never the values.
    assert b"set env ['HF_TOKEN']" in logs and b"set env ['APP_S3_SECRET']" in logs
    assert SECRET_VALUE.encode() not in logs
    # Runners hold the key that opens their version's env, never the admin key: they load
    # a tenant's weights and run with its env.
    runners = _runner_environments(platform)
    assert runners and all("EBB_SECRETS_KEY" in env for env in runners)
    assert not any("EBB_ADMIN_KEY" in env or platform.admin_key in env.values() for env in runners)


def _runner_environments(platform: Platform) -> list[dict[str, str]]:
    """The environments this platform's runner processes started with."""
    found = []
    for proc in psutil.process_iter(["environ", "cmdline"]):
        env = proc.info.get("environ") or {}
        if env.get("EBB_HOME") == str(platform.home.resolve()) and "runner" in (
            proc.info.get("cmdline") or []
        ):
            found.append(env)
    return found


def test_a_tenant_versions_and_rolls_out_its_own_deployment_only(platform, admin):
    r = admin.put(
        "/v1/tenants/team/quota",
        json={
            "max_deployments": 2,
            "max_replicas": 2,
            "max_gpus": 2,
            "allowed_sources": ["fake://ok"],
        },
    )
    assert r.status_code == 200, r.text
    team = tenant_client(platform, new_key(admin, "team"))
    other = tenant_client(platform, new_key(admin, "other"))
    assert team.post("/v1/deployments", json={"name": "team-m", "source": "fake://ok"}).is_success
    v2 = team.post("/v1/deployments", json={"name": "team-m", "source": "fake://ok?step_ms=1"})
    assert v2.status_code == 201 and v2.json()["deployed_version"] == 2
    outside = team.post("/v1/deployments", json={"name": "team-m", "source": "fake://nope"})
    assert outside.status_code in (403, 429) and outside.json()["error"]["param"] == "source"
    assert team.post("/v1/deployments/team-m/rollout", json={}).status_code == 200
    # Another tenant: the deployment does not exist for it, and it cannot take the name.
    assert other.get("/v1/deployments/team-m/versions").status_code == 404
    assert other.post("/v1/deployments/team-m/rollback").status_code == 404
    taken = other.post("/v1/deployments", json={"name": "team-m", "source": "fake://ok"})
    assert taken.status_code in (403, 409)
    assert [v["version"] for v in _versions(admin, "team-m")["data"]] == [1, 2]


def test_blocking_readers_see_every_serving_version(redis_url):
    """What a node's weight prefetcher and a launcher read: each version's unit."""
    client = redis.Redis.from_url(redis_url)
    spec = DeploymentSpec(name="pre", source="s3://bucket/v1", min_replicas=1)
    v2 = VersionRecord(
        version=2, created_at_s=1.0, spec=DeploymentSpec(name="pre", source="s3://bucket/v2")
    )
    client.hset(keys.DEPLOYMENTS, "pre", msgspec.json.encode(spec))
    client.hset(keys.deployment_versions("pre"), "2", msgspec.json.encode(v2))
    client.set(keys.traffic("pre"), msgspec.json.encode(TrafficSplit(weights={1: 90, 2: 10})))
    units = read_serving_units(client)
    assert [(u.name, u.source, u.min_replicas) for u in units] == [
        ("pre", "s3://bucket/v1", 1),
        ("pre@v2", "s3://bucket/v2", 1),
    ]
    assert read_deployment(client, "pre@v2").source == "s3://bucket/v2"
    assert read_deployment(client, "pre@v3") is None  # no such version
