"""Weights through the whole platform (`ebb up` on the fake engine's machinery): deploying
from s3:// prefetches into the cache with progress in the deployment's status, `ebb deploy`
waits for it, `ebb status` and /metrics show the cache and its evictions, and a deploy that
cannot fetch says why and leaves nothing behind. S3 is moto behind a throttling proxy, so
the fetch lasts long enough to be watched.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from support import Platform, temp_home, wait_until
from support.weights import CountingProxy, MotoS3, upload_dir, write_servable_dir

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s3 = MotoS3()
    client = s3.client()
    client.create_bucket(Bucket="models")
    root = tmp_path_factory.mktemp("checkpoints")
    for i, name in enumerate(("one", "two")):
        upload_dir(client, "models", name, write_servable_dir(root / name, seed=i, mib=6))
    size = sum(p.stat().st_size for p in (root / "one").iterdir())
    proxy = CountingProxy(s3.url, delay_s_per_mib=0.3)  # ~2 s per checkpoint
    home = temp_home("ebb-it-weights-")
    env = {
        **s3.env(proxy.url),
        "EBB_WEIGHTS_CACHE_DIR": str(home / "cache"),
        "EBB_WEIGHTS_CACHE_BYTES": str(size * 3 // 2),  # room for one checkpoint
        "EBB_WEIGHTS_FETCH_PART_BYTES": str(MIB),
        "EBB_WEIGHTS_FETCH_ATTEMPTS": "2",
    }
    platform = Platform(home=home, redis_url=None, env_extra=env).start()
    yield platform
    assert platform.stop() == 0
    proxy.close()
    s3.stop()


@pytest.fixture(scope="module")
def admin(stack):
    with stack.admin() as client:
        yield client


def ebb_cli(platform: Platform, *args: str) -> subprocess.CompletedProcess:
    return platform.cli(*args)


def test_deploy_from_s3_shows_fetch_progress_then_is_ready(stack, admin):
    created = admin.post("/v1/deployments", json={"name": "one", "source": "s3://models/one"})
    assert created.status_code == 201, created.text
    seen = []

    def ready():
        body = admin.get("/v1/deployments/one").json()
        if body["weights_progress"] is not None:
            seen.append(body["weights_progress"])
        return body["weights"] == "ready" and body

    # A second deployment of the same source joins that fetch, and its status follows it.
    again = admin.post("/v1/deployments", json={"name": "again", "source": "s3://models/one"})
    assert again.status_code == 201, again.text
    wait_until(
        lambda: admin.get("/v1/deployments/again").json()["weights"] == "preparing",
        5,
        "the second deployment to show the fetch under way",
    )
    body = wait_until(ready, 60, "the weights of one to be ready", poll_s=0.1)
    wait_until(
        lambda: admin.get("/v1/deployments/again").json()["weights"] == "ready",
        10,
        "the second deployment of the source to show it ready too",
    )
    assert admin.delete("/v1/deployments/again").status_code in (200, 204)

    downloading = [p["fraction"] for p in seen if p["phase"] == "download"]
    assert any(0 < f < 1 for f in downloading), seen
    assert downloading == sorted(downloading)
    assert body["status"] == "scaled_to_zero" and body["error"] is None
    cache = admin.get("/v1/weights").json()
    assert [(e["source"], e["in_use"]) for e in cache["entries"]] == [("s3://models/one", False)]
    assert cache["used_bytes"] > 6 * MIB


def test_cli_deploy_waits_and_status_shows_the_cache_and_its_evictions(stack, admin):
    deployed = ebb_cli(stack, "deploy", "two", "--source", "s3://models/two")
    assert deployed.returncode == 0, deployed.stderr
    assert "deployed two" in deployed.stdout
    assert admin.get("/v1/deployments/two").json()["weights"] == "ready"

    # Room for one checkpoint: fetching two evicted one, which nothing was using.
    cache = admin.get("/v1/weights").json()
    assert [e["source"] for e in cache["entries"]] == ["s3://models/two"]
    assert cache["evictions_total"] == 1
    assert cache["recent_evictions"][0]["source"] == "s3://models/one"
    status = ebb_cli(stack, "status")
    assert status.returncode == 0, status.stderr
    assert "evictions: 1" in status.stdout and "s3://models/two" in status.stdout
    metrics = admin.get("/metrics").text
    assert "ebb_weights_evictions_total 1.0" in metrics
    assert 'ebb_weights_cache_models{state="idle"} 1.0' in metrics


def test_deploy_that_cannot_fetch_says_why_and_leaves_nothing(stack, admin):
    failed = ebb_cli(stack, "deploy", "ghost", "--source", "s3://models/absent")

    assert failed.returncode == 1
    assert "there are no objects under s3://models/absent/" in failed.stderr
    body = admin.get("/v1/deployments/ghost").json()
    assert body["status"] == "failing"
    assert "aws s3 ls" in body["error"]  # the hint on how to check
    tmp = stack.home / "cache" / "tmp"
    assert not tmp.exists() or os.listdir(tmp) == []


def test_bad_source_is_refused_before_anything_is_fetched(admin):
    response = admin.post("/v1/deployments", json={"name": "bad", "source": "s3://Bad/x"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "source" and "not a valid S3 bucket name" in error["message"]
