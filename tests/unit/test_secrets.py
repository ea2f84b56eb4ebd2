"""Versions' environments sealed at rest (ebb.secrets)."""

from __future__ import annotations

import pytest

from ebb.errors import InvalidRequest
from ebb.secrets import (
    MAX_ENV_BYTES,
    MAX_ENV_VALUE_CHARS,
    MAX_ENV_VARS,
    TENANT_CREDENTIALS,
    TENANT_ENV_PREFIX,
    SecretBox,
    SecretsUnavailable,
    check_env,
    new_key,
)

VALUE = "hf_very-secret-token"


def test_sealed_env_opens_with_the_key_and_hides_the_value():
    box = SecretBox(new_key())
    sealed = box.seal({"HF_TOKEN": VALUE})
    assert VALUE not in sealed and "HF_TOKEN" not in sealed
    assert box.open(sealed) == {"HF_TOKEN": VALUE}
    assert box.seal({}) == "" and box.open("") == {}


def test_without_a_key_an_env_is_refused_with_how_to_make_one():
    with pytest.raises(SecretsUnavailable, match="EBB_SECRETS_KEY") as refused:
        SecretBox(None).seal({"HF_TOKEN": VALUE})
    assert refused.value.status_code == 400 and refused.value.param == "env"
    sealed = SecretBox(new_key()).seal({"A": "b"})
    with pytest.raises(ValueError, match="EBB_SECRETS_KEY is not set"):
        SecretBox(None).open(sealed)
    with pytest.raises(ValueError, match="another EBB_SECRETS_KEY"):
        SecretBox(new_key()).open(sealed)


def test_a_malformed_key_is_refused():
    with pytest.raises(ValueError, match="not a Fernet key"):
        SecretBox("short")


# Every name the finding of issue 32 named (and their kin): each steers a library, the
# loader, the interpreter or the platform in whatever process holds it.
REFUSED_NAMES = [
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CA_BUNDLE",
    "HF_ENDPOINT",
    "HF_HOME",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "OPENSSL_CONF",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "VLLM_PLUGINS",
    "VLLM_ATTENTION_BACKEND",
    "TRANSFORMERS_CACHE",
    "PATH",
    "PATH\n",
    "HOME",
    "TMPDIR",
    "LD_PRELOAD",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "EBB_REDIS_URL",
    "EBB_ADMIN_KEY",
    "APP_",  # the prefix alone names nothing of the tenant's
    "app_greeting",
    "Hf_Token",
    "hf_token",
    "APP_GREETING\n",
    "APP_A-B",
    "1BAD",
    "",
]


@pytest.mark.parametrize("name", REFUSED_NAMES)
def test_only_the_tenants_own_prefix_and_the_named_credentials_are_allowed(name):
    with pytest.raises(InvalidRequest) as refused:
        check_env({name: "x"})
    message = refused.value.message
    assert refused.value.param == "env" and refused.value.status_code == 400
    # The refusal says what is allowed, so a tenant can fix its env.
    assert f"{TENANT_ENV_PREFIX}<NAME>" in message and "HF_TOKEN" in message


@pytest.mark.parametrize(
    "env",
    [
        {"APP_GREETING": "hello"},
        {"APP_1": "x", "APP_DB_URL": "postgres://a@b/c"},
        {"HF_TOKEN": "hf_abc", "HUGGING_FACE_HUB_TOKEN": "hf_abc"},
        {
            "AWS_ACCESS_KEY_ID": "AKIA123",
            "AWS_SECRET_ACCESS_KEY": "s/e+c=r",
            "AWS_SESSION_TOKEN": "t" * 2000,
            "AWS_REGION": "eu-west-1",
            "AWS_DEFAULT_REGION": "us-gov-west-1",
        },
    ],
)
def test_allowed_names_pass(env):
    check_env(env)
    assert set(env) <= set(TENANT_CREDENTIALS) | {n for n in env if n.startswith("APP_")}


@pytest.mark.parametrize("region", ["evil.com#", "us-east-1\n", "", "US-EAST-1", "a" * 40])
def test_a_region_is_a_region_name(region):
    """A region becomes part of the S3 host name: it may not carry anything else."""
    with pytest.raises(InvalidRequest, match="region"):
        check_env({"AWS_REGION": region})


@pytest.mark.parametrize(
    "env",
    [
        {"APP_A": "x\x00y"},
        {"APP_A": "\ud800"},
        {"APP_A": "x" * (MAX_ENV_VALUE_CHARS + 1)},
        {f"APP_{i}": "" for i in range(MAX_ENV_VARS + 1)},
    ],
)
def test_values_a_process_cannot_hold_and_too_many_variables_are_refused(env):
    with pytest.raises(InvalidRequest):
        check_env(env)


def test_the_whole_env_is_bounded_in_size():
    value = "v" * (MAX_ENV_VALUE_CHARS - 16)
    fits = {f"APP_{i}": value for i in range(MAX_ENV_BYTES // MAX_ENV_VALUE_CHARS)}
    check_env(fits)
    over = {**fits, "APP_MORE": value}
    with pytest.raises(InvalidRequest, match=f"{MAX_ENV_BYTES} bytes") as refused:
        check_env(over)
    assert refused.value.param == "env"
