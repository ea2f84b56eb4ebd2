"""Deployment versions' environments (secrets such as HF_TOKEN), encrypted at rest.

Sealed with Fernet (AES-128-CBC with HMAC-SHA256, authenticated) under EBB_SECRETS_KEY,
so Redis, its append-only file and backups hold only ciphertext. The API shows a
version's variable names, never their values; a runner opens them into its own process
environment when it takes its version's work, and nothing logs them.
"""

from __future__ import annotations

import re

import msgspec
from cryptography.fernet import Fernet, InvalidToken

from ebb.errors import InvalidRequest

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
MAX_ENV_VARS = 64
MAX_ENV_VALUE_CHARS = 16384
# Names a version may not set: the platform's own (a runner's Redis, keys), and those that
# steer the dynamic loader, the interpreter or device placement of the runner and of the
# processes it starts (a tenant's env must not run code or take another tenant's GPUs).
_RESERVED_PREFIXES = ("EBB_", "LD_", "PYTHON", "CUDA_", "NVIDIA_")
_RESERVED_NAMES = frozenset({"PATH", "HOME", "TMPDIR"})


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


def check_env(env: dict[str, str]) -> None:
    """Refuse names a process environment cannot hold or the platform owns (400)."""
    if len(env) > MAX_ENV_VARS:
        raise InvalidRequest(f"env has {len(env)} variables; at most {MAX_ENV_VARS}.", param="env")
    for name, value in env.items():
        if not re.match(ENV_NAME_PATTERN, name):
            raise InvalidRequest(
                f"env name {name!r} is not a variable name (letters, digits, '_').", param="env"
            )
        upper = name.upper()
        if upper.startswith(_RESERVED_PREFIXES) or upper in _RESERVED_NAMES:
            raise InvalidRequest(
                f"env name {name!r} is the platform's to set (names starting with "
                f"{', '.join(_RESERVED_PREFIXES)} and {', '.join(sorted(_RESERVED_NAMES))}); "
                "engine settings go in the deployment's engine options.",
                param="env",
            )
        if len(value) > MAX_ENV_VALUE_CHARS or "\x00" in value:
            raise InvalidRequest(
                f"env {name}: a value has at most {MAX_ENV_VALUE_CHARS} characters and no NUL.",
                param="env",
            )
