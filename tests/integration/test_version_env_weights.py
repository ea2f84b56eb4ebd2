"""A version's env reaches the controller's deploy-time weight fetch: S3 credentials that
only the version carries (the platform has none) fetch its weights from an S3 that
demands them (moto with authentication on)."""

from __future__ import annotations

import pytest
from support import Platform, temp_home, wait_until
from weights_support import MotoS3, upload_dir, write_servable_dir

from ebb.secrets import new_key

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s3 = MotoS3()
    s3.client().create_bucket(Bucket="private")
    folder = write_servable_dir(tmp_path_factory.mktemp("ckpt") / "m", seed=3, mib=1)
    upload_dir(s3.client(), "private", "m", folder)
    s3.require_auth()
    home = temp_home("ebb-it-version-env-")
    env = {
        "AWS_ENDPOINT_URL_S3": s3.url,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "EBB_WEIGHTS_CACHE_DIR": str(home / "cache"),
        "EBB_WEIGHTS_FETCH_ATTEMPTS": "1",
        "EBB_SECRETS_KEY": new_key(),
    }
    try:
        platform = Platform(home=home, redis_url=None, env_extra=env).start()
        yield platform, s3
        assert platform.stop() == 0
    finally:
        s3.stop()


def _weights(admin, name: str) -> dict[int, str]:
    body = admin.get(f"/v1/deployments/{name}/versions").json()
    return {v["version"]: v["weights"] for v in body["data"]}


def test_the_versions_credentials_fetch_its_weights(stack):
    platform, s3 = stack
    with platform.admin() as admin:
        # Without credentials the fetch is refused; the deployment says so.
        r = admin.post("/v1/deployments", json={"name": "priv", "source": "s3://private/m"})
        assert r.status_code == 201, r.text
        wait_until(lambda: _weights(admin, "priv")[1] == "failed", 120, "the refused fetch")
        creds = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
        # The same prefix spelled with a slash: the failed source's retry backoff (per
        # source) does not hold version 2 back.
        r = admin.post(
            "/v1/deployments", json={"name": "priv", "source": "s3://private/m/", "env": creds}
        )
        assert r.status_code == 201 and r.json()["deployed_version"] == 2
        wait_until(lambda: _weights(admin, "priv")[2] == "ready", 120, "version 2's weights")
        logs = b"".join(p.read_bytes() for p in platform.home.rglob("*.log"))
        assert s3.secret_key.encode() not in logs
