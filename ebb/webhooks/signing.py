"""Standard Webhooks signatures (https://www.standardwebhooks.com).

A delivery carries `webhook-id` (stable across its attempts, so receivers deduplicate),
`webhook-timestamp` (unix seconds of this attempt) and `webhook-signature`: space-separated
`v1,<base64 HMAC-SHA256 of "id.timestamp.body">`, one per valid secret of the tenant (two
during a rotation's overlap). Secrets are `whsec_` + base64 of 24 random bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
_SECRET_BYTES = 24


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(_SECRET_BYTES)).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, webhook_id: str, timestamp_s: int, body: bytes) -> str:
    message = f"{webhook_id}.{timestamp_s}.".encode() + body
    digest = hmac.new(_key(secret), message, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def webhook_headers(
    signing_secrets: list[str], webhook_id: str, timestamp_s: int, body: bytes
) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt, signed with every given secret."""
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp_s),
        "webhook-signature": " ".join(
            sign(secret, webhook_id, timestamp_s, body) for secret in signing_secrets
        ),
    }
