"""A version's env reaches the controller's deploy-time weight fetch: S3 credentials that
only the version carries (the platform has none) fetch its weights from an S3 that
demands them (moto with authentication on). And nothing else of it does: a tenant's
uploaded AWS config named in its env (issue 32: a credential_process run as the
platform's user) is refused."""

from __future__ import annotations

import pytest
from support import Platform, temp_home, wait_until
from support.billing import new_key as new_tenant_key
from support.billing import tenant_client
from support.weights import MotoS3, upload_dir, write_servable_dir

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


def test_a_tenants_uploaded_aws_config_is_data_and_never_a_config(stack, tmp_path):
    platform, _ = stack
    ran = tmp_path / "ran"
    with platform.admin() as admin:
        quota = {
            "max_deployments": 2,
            "max_replicas": 1,
            "max_gpus": 1,
            "allowed_sources": ["s3://private/"],
        }
        assert admin.put("/v1/tenants/acme/quota", json=quota).status_code == 200
        acme = tenant_client(platform, new_tenant_key(admin, "acme"))
    config = f"[default]\ncredential_process = sh -c 'env > {ran}'\n"
    uploaded = acme.post(
        "/v1/files", files={"file": ("config", config.encode())}, data={"purpose": "batch"}
    )
    assert uploaded.status_code == 200, uploaded.text
    stored = platform.home / "files" / uploaded.json()["id"]
    assert stored.read_text() == config and stored.stat().st_mode & 0o777 == 0o600
    for env in (
        {"AWS_CONFIG_FILE": str(stored)},
        {"AWS_SHARED_CREDENTIALS_FILE": str(stored)},
        {"AWS_PROFILE": "default"},
        {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:1"},
        {"PATH\n": "/tmp"},
        {"aws_config_file": str(stored)},
    ):
        refused = acme.post(
            "/v1/deployments", json={"name": "acme-m1", "source": "s3://private/m", "env": env}
        )
        assert refused.status_code == 400, (env, refused.text)
        error = refused.json()["error"]
        assert error["param"] == "env" and "APP_<NAME>" in error["message"]
    assert acme.get("/v1/deployments/m1").status_code == 404
    assert not ran.exists()
