"""Versions' environments sealed at rest (ebb.secrets)."""

from __future__ import annotations

import pytest

from ebb.errors import InvalidRequest
from ebb.secrets import SecretBox, SecretsUnavailable, check_env, new_key

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


@pytest.mark.parametrize(
    "env",
    [
        {"1BAD": "x"},
        {"EBB_REDIS_URL": "redis://evil"},
        {"LD_PRELOAD": "/tmp/x.so"},
        {"PYTHONPATH": "/tmp"},
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        {"PATH": "/tmp"},
        {"A": "x\x00y"},
        {"A-B": "x"},
    ],
)
def test_env_names_a_process_cannot_hold_or_the_platform_owns_are_refused(env):
    with pytest.raises(InvalidRequest):
        check_env(env)
