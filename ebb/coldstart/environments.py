"""What each process the platform starts finds in its environment: the one place that
says which platform secret reaches which process.

- `service_environment`: `ebb up`'s services (frontdoor, controller, workers): the
  operator's environment, the settings, and the admin key.
- `child_environment`: runners, stems and the fork server (local, Ray): the operator's
  environment and the settings, without the keys only services use (`SERVICE_ONLY`).
  A runner still holds EBB_REDIS_URL (its queue) and EBB_SECRETS_KEY (to open its
  version's env, which it adds to its own environment: `runners/process.py`).
- `preparation_environment`: `ebb prepare`, which reads a tenant's source and weights:
  built by allowlists, never a copy of the controller's environment plus additions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ebb.config import Settings
from ebb.secrets import TENANT_CREDENTIALS

# Keys that only the platform's services use: no runner or preparation holds them.
SERVICE_ONLY = ("EBB_ADMIN_KEY", "EBB_API_KEY", "EBB_METRICS_TOKEN")
# What `ebb prepare` keeps of the operator's environment: the process basics, the proxy
# and CA settings of the host's network, and the operator's own S3 and Hub settings
# (credentials, endpoint, cache), with which the platform fetches weights itself. The
# operator set these, never a tenant (a version's env reaches only TENANT_CREDENTIALS).
_OPERATOR_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "XDG_CACHE_HOME",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
    }
)
_OPERATOR_PREFIXES = ("LC_", "AWS_", "HF_", "HUGGING_FACE_")
# A tenant's S3 key replaces the operator's as a whole: half of each signs nothing.
_AWS_STATIC_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# Values that never appear in what a tenant reads (a failure's message): credentials, and
# proxy URLs, which may carry a password.
_REDACTED_NAMES = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
)


def _settings_environment(settings: Settings) -> dict[str, str]:
    return {
        "EBB_HOME": str(settings.home.resolve()),
        "EBB_WEIGHTS_CACHE_DIR": str(settings.weights_dir.resolve()),
        "EBB_REDIS_URL": settings.redis_url or "",
        "EBB_LEASE_TTL_S": str(settings.lease_ttl_s),
        "EBB_HEARTBEAT_INTERVAL_S": str(settings.heartbeat_interval_s),
        "EBB_ENGINE_STALL_S": str(settings.engine_stall_s),
        "EBB_KV_CACHE_GIB": str(settings.kv_cache_gib),
        "EBB_RESULT_TTL_S": str(settings.result_ttl_s),
        # Local runners are children: none outlives the platform that launched it.
        "EBB_RUNNER_FOLLOWS_PARENT": "1",
    }


def child_environment(settings: Settings) -> dict[str, str]:
    """A runner's (or stem's, or the fork server's) environment: the same Settings as its
    parent's, none of `SERVICE_ONLY`. Runners load a tenant's weights and run with its
    env, so the admin key stays out even where the operator's environment has it."""
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_ONLY}
    env.update(_settings_environment(settings))
    return env


def service_environment(settings: Settings) -> dict[str, str]:
    """A platform service's environment (`ebb up`'s children): the operator's, the
    settings, and the admin key the frontdoor and the CLI check and call with."""
    env = dict(os.environ)
    env.update(_settings_environment(settings))
    env["EBB_ADMIN_KEY"] = settings.admin_key or ""
    return env


def preparation_environment(
    settings: Settings,
    version_env: Mapping[str, str],
    operator_env: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """The whole environment of an `ebb prepare` process (the preparer's, a prefetcher's).

    Contract: it holds only (1) the EBB_ settings preparing reads (home, weight cache
    and fetch settings, log format), built from `settings`; (2) the operator's names
    from `operator_env` that `_OPERATOR_NAMES`/`_OPERATOR_PREFIXES` allow; (3) of
    `version_env`, only the credentials of `TENANT_CREDENTIALS`, over the operator's.
    Never the Redis URL, the admin, API, metrics or secrets keys, nor any other EBB_
    variable: preparing reads a tenant's input and needs none of them.
    """
    env = {
        name: value
        for name, value in operator_env.items()
        if name in _OPERATOR_NAMES or name.startswith(_OPERATOR_PREFIXES)
    }
    tenant = {k: v for k, v in version_env.items() if k in TENANT_CREDENTIALS}
    if "AWS_ACCESS_KEY_ID" in tenant:
        for name in _AWS_STATIC_CREDENTIALS:
            env.pop(name, None)
    env.update(tenant)
    env.update(
        EBB_HOME=str(settings.home.resolve()),
        EBB_WEIGHTS_CACHE_DIR=str(settings.weights_dir.resolve()),
        EBB_WEIGHTS_FETCH_CONCURRENCY=str(settings.weights_fetch_concurrency),
        EBB_WEIGHTS_FETCH_PART_BYTES=str(settings.weights_fetch_part_bytes),
        EBB_WEIGHTS_FETCH_ATTEMPTS=str(settings.weights_fetch_attempts),
        EBB_LOG_FORMAT=settings.log_format,
    )
    if settings.weights_cache_bytes is not None:
        env["EBB_WEIGHTS_CACHE_BYTES"] = str(settings.weights_cache_bytes)
    return env


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values in `env` that a tenant-visible message must not quote (credentials,
    proxy URLs), longest first: one that contains another is redacted whole."""
    found = {env[name] for name in _REDACTED_NAMES if len(env.get(name, "")) >= 4}
    return sorted(found, key=len, reverse=True)
