"""Which platform secret reaches which process (ebb.coldstart.environments): none reaches
a process that reads a tenant's input (`ebb prepare`), and runners never get the keys
only the services use."""

from __future__ import annotations

import pytest

from ebb.coldstart.environments import (
    SERVICE_ONLY,
    child_environment,
    preparation_environment,
    secret_values,
    service_environment,
)
from ebb.config import Settings
from ebb.secrets import new_key

PLATFORM_SECRETS = (
    "EBB_ADMIN_KEY",
    "EBB_SECRETS_KEY",
    "EBB_REDIS_URL",
    "EBB_API_KEY",
    "EBB_METRICS_TOKEN",
)
OPERATOR = {
    "PATH": "/usr/bin",
    "HOME": "/home/ebb",
    "LC_ALL": "C.UTF-8",
    "AWS_ACCESS_KEY_ID": "AKIAOPERATOR",
    "AWS_SECRET_ACCESS_KEY": "operator-secret",
    "AWS_SESSION_TOKEN": "operator-session",
    "AWS_ENDPOINT_URL_S3": "http://minio:9000",
    "HF_TOKEN": "hf_operator",
    "HTTPS_PROXY": "http://user:proxy-password@proxy:3128",
    "EBB_ADMIN_KEY": "admin",
    "EBB_SECRETS_KEY": "secrets",
    "EBB_REDIS_URL": "redis://:redis-password@redis:6379",
    "EBB_API_KEY": "api",
    "EBB_METRICS_TOKEN": "metrics",
    "EBB_OTHER_SETTING": "1",
    "LD_PRELOAD": "/x.so",
    "PYTHONSTARTUP": "/x.py",
    "VLLM_PLUGINS": "x",
    "GCONV_PATH": "/x",
}


@pytest.fixture
def settings(tmp_path):
    return Settings(
        home=tmp_path,
        redis_url="redis://:redis-password@redis:6379",
        admin_key="admin",
        secrets_key=new_key(),
        metrics_token="metrics",
        api_key="api",
        weights_cache_bytes=10**9,
        log_format="json",
    )


def test_the_preparation_holds_no_platform_secret_and_only_the_tenants_credentials(settings):
    tenant = {
        "HF_TOKEN": "hf_tenant",
        "APP_GREETING": "hello",
        # Stored before the allowlist: names the preparation must still not receive.
        "AWS_CONFIG_FILE": "/ebb/files/file-1",
        "PATH": "/tmp/evil",
    }
    env = preparation_environment(settings, tenant, OPERATOR)
    assert not set(PLATFORM_SECRETS) & set(env)
    assert settings.secrets_key not in env.values() and "redis-password" not in str(env)
    assert env["HF_TOKEN"] == "hf_tenant" and env["PATH"] == "/usr/bin"
    assert "APP_GREETING" not in env and "AWS_CONFIG_FILE" not in env
    for name in ("LD_PRELOAD", "PYTHONSTARTUP", "VLLM_PLUGINS", "GCONV_PATH", "EBB_OTHER_SETTING"):
        assert name not in env
    # What `ebb prepare` builds its Settings and cache options from.
    assert env["EBB_HOME"] == str(settings.home.resolve())
    assert env["EBB_WEIGHTS_CACHE_DIR"] == str(settings.weights_dir.resolve())
    assert env["EBB_WEIGHTS_CACHE_BYTES"] == str(10**9) and env["EBB_LOG_FORMAT"] == "json"
    # The operator's S3 settings stay, for the platform's own fetches.
    assert env["AWS_ENDPOINT_URL_S3"] == "http://minio:9000" and env["LC_ALL"] == "C.UTF-8"


def test_a_tenants_s3_key_replaces_the_operators_whole(settings):
    tenant = {"AWS_ACCESS_KEY_ID": "AKIATENANT", "AWS_SECRET_ACCESS_KEY": "tenant-secret"}
    env = preparation_environment(settings, tenant, OPERATOR)
    assert env["AWS_ACCESS_KEY_ID"] == "AKIATENANT"
    assert env["AWS_SECRET_ACCESS_KEY"] == "tenant-secret"
    assert "AWS_SESSION_TOKEN" not in env  # the operator's would spoil the tenant's key
    without = preparation_environment(settings, {}, OPERATOR)
    assert without["AWS_SESSION_TOKEN"] == "operator-session"


def test_a_failures_message_never_quotes_a_credential(settings):
    env = preparation_environment(settings, {"HF_TOKEN": "hf_tenant"}, OPERATOR)
    assert set(secret_values(env)) == {
        "hf_tenant",
        "AKIAOPERATOR",
        "operator-secret",
        "operator-session",
        "http://user:proxy-password@proxy:3128",
    }


def test_runners_never_get_the_keys_only_services_use(settings, monkeypatch):
    for name, value in OPERATOR.items():
        monkeypatch.setenv(name, value)
    runner = child_environment(settings)
    assert not set(SERVICE_ONLY) & set(runner)
    # What a runner needs: its queue, and the key that opens its version's env.
    assert runner["EBB_REDIS_URL"] == settings.redis_url
    assert runner["EBB_SECRETS_KEY"] == "secrets"
    service = service_environment(settings)
    assert service["EBB_ADMIN_KEY"] == "admin" and service["EBB_METRICS_TOKEN"] == "metrics"
