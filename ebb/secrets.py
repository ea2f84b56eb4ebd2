"""Deployment versions' environments (secrets such as HF_TOKEN), encrypted at rest.

Sealed with Fernet (AES-128-CBC with HMAC-SHA256, authenticated) under EBB_SECRETS_KEY,
so Redis, its append-only file and backups hold only ciphertext. The API shows a
version's variable names, never their values; a runner opens them into its own process
environment when it takes its version's work, and nothing logs them. The names are an
allowlist (`check_env`): a tenant's own under TENANT_ENV_PREFIX, and the credentials of
TENANT_CREDENTIALS, the only ones that also reach the weight preparation
(`coldstart/environments.py`).
"""

from __future__ import annotations

import re

import msgspec
from cryptography.fernet import Fernet, InvalidToken

from ebb.errors import InvalidRequest

# A version's env is an allowlist (a denylist missed dozens of names that run code:
# AWS_CONFIG_FILE's credential_process, GCONV_PATH, VLLM_PLUGINS, proxies ...). A tenant
# names its own variables under this prefix; nothing the platform runs reads them.
TENANT_ENV_PREFIX = "APP_"
# The named, reviewed exceptions: credentials a version's weights are fetched with, read
# by the runner and by the weight preparation (the only names that reach the latter).
# Each is a value a library sends to an endpoint the platform chose; none names a file,
# a command, a host or a library, so none can make a process run or read anything else.
TENANT_CREDENTIALS = (
    # The Hub token huggingface_hub sends to the platform's HF endpoint (hf:// weights).
    "HF_TOKEN",
    # The same token under the name older huggingface_hub and vLLM releases read.
    "HUGGING_FACE_HUB_TOKEN",
    # boto3's static credentials: they sign requests to the platform's S3 endpoint.
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    # The bucket's region, part of the S3 host name: its value must be a region name.
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)
_REGION_NAMES = frozenset({"AWS_REGION", "AWS_DEFAULT_REGION"})
_REGION_PATTERN = re.compile(r"[a-z]{2}(-[a-z0-9]+){1,4}")
# Upper-case letters, digits and '_' only, matched whole (fullmatch: "PATH\n" is not PATH).
_NAME_PATTERN = re.compile(r"[A-Z][A-Z0-9_]{0,127}")
MAX_ENV_VARS = 64
MAX_ENV_VALUE_CHARS = 16384
# The whole env (names and values, UTF-8): what a version may store and put in a process.
MAX_ENV_BYTES = 64 * 1024


def new_key() -> str:
    """A fresh key for EBB_SECRETS_KEY."""
    return Fernet.generate_key().decode()


class SecretsUnavailable(InvalidRequest):
    """Secrets were given (or must be opened) and no EBB_SECRETS_KEY is configured."""


class SecretBox:
    def __init__(self, key: str | None):
        self._fernet: Fernet | None = None
        if key:
            try:
                self._fernet = Fernet(key.encode())
            except (ValueError, TypeError) as e:
                raise ValueError(
                    "EBB_SECRETS_KEY is not a Fernet key (32 url-safe base64-encoded bytes); "
                    "make one with: python -c 'import ebb.secrets as s; print(s.new_key())'"
                ) from e

    @property
    def configured(self) -> bool:
        return self._fernet is not None

    def seal(self, env: dict[str, str]) -> str:
        """`env` encrypted; raises SecretsUnavailable (400) without a key."""
        if not env:
            return ""
        if self._fernet is None:
            raise SecretsUnavailable(
                "This platform has no EBB_SECRETS_KEY, so it cannot store a version's env "
                "encrypted. Set EBB_SECRETS_KEY on the frontdoor, controller and runners "
                "(python -c 'import ebb.secrets as s; print(s.new_key())'), or deploy "
                "without env.",
                param="env",
                code="secrets_key_missing",
            )
        return self._fernet.encrypt(msgspec.json.encode(env)).decode()

    def open(self, sealed: str) -> dict[str, str]:
        """The environment `seal` made; {} for "". Raises ValueError without the key."""
        if not sealed:
            return {}
        if self._fernet is None:
            raise ValueError("this version has an env but EBB_SECRETS_KEY is not set here")
        try:
            return msgspec.json.decode(self._fernet.decrypt(sealed.encode()), type=dict[str, str])
        except InvalidToken as e:
            raise ValueError("this version's env was sealed with another EBB_SECRETS_KEY") from e


def _allowed_names() -> str:
    return (
        f"{TENANT_ENV_PREFIX}<NAME> for your own variables (upper-case letters, digits "
        f"and '_'), and the credentials {', '.join(TENANT_CREDENTIALS)}"
    )


def allowed_name(name: str) -> bool:
    """A version may set `name` (see TENANT_ENV_PREFIX and TENANT_CREDENTIALS)."""
    if not _NAME_PATTERN.fullmatch(name):
        return False
    return name in TENANT_CREDENTIALS or (
        name.startswith(TENANT_ENV_PREFIX) and len(name) > len(TENANT_ENV_PREFIX)
    )


def usable_env(env: dict[str, str]) -> dict[str, str]:
    """What of an opened env a process may receive: a version stored before the allowlist
    may hold names `check_env` now refuses, and those reach no process."""
    return {name: value for name, value in env.items() if allowed_name(name)}


def _utf8(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate: no process environment holds it
        return False
    return True


def check_env(env: dict[str, str]) -> None:
    """Refuse (400) an env a version may not have: a name that is not one of
    `allowed_name`'s, a value a process environment cannot hold, a region that is not a
    region name, more than MAX_ENV_VARS variables or MAX_ENV_BYTES in all."""
    if len(env) > MAX_ENV_VARS:
        raise InvalidRequest(f"env has {len(env)} variables; at most {MAX_ENV_VARS}.", param="env")
    size_bytes = 0
    for name, value in env.items():
        if not allowed_name(name):
            raise InvalidRequest(
                f"env name {name!r} is not one a version may set. Allowed: "
                f"{_allowed_names()}. Engine settings go in the deployment's engine options.",
                param="env",
            )
        if len(value) > MAX_ENV_VALUE_CHARS or "\x00" in value or not _utf8(value):
            raise InvalidRequest(
                f"env {name}: a value is UTF-8 text of at most {MAX_ENV_VALUE_CHARS} "
                "characters, without NUL.",
                param="env",
            )
        if name in _REGION_NAMES and not _REGION_PATTERN.fullmatch(value):
            raise InvalidRequest(
                f"env {name}: {value!r} is not an AWS region name (like us-east-1).", param="env"
            )
        size_bytes += len(name.encode()) + len(value.encode())
    if size_bytes > MAX_ENV_BYTES:
        raise InvalidRequest(
            f"env holds {size_bytes} bytes of names and values; at most {MAX_ENV_BYTES} bytes.",
            param="env",
        )
