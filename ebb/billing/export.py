"""Hourly export of the ledger to S3: one JSONL file per closed hour, written exactly once.

The object key is a function of the hour and the body a function of the hour's booked
entries, which never change once the hour is closed. The write is conditional
(`If-None-Match: *`), so a file is created once and never overwritten: an export retried
after a crash (the file written, the hour not yet marked exported) finds its own bytes
there and only marks the hour; different bytes under the key are an error, never
papered over.
"""

from __future__ import annotations

import hashlib
import logging
import time

from ebb.config import Settings

log = logging.getLogger(__name__)


class ExportConflict(Exception):
    """The hour's file already exists with other content."""


class S3HourExporter:
    def __init__(self, bucket: str, prefix: str = "usage", *, endpoint_url: str | None = None):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        # Imported here: boto3 costs the billing process and the frontdoor ~10 MB of RSS,
        # and most platforms export no ledger.
        import boto3

        self._s3 = boto3.client("s3", endpoint_url=endpoint_url)

    def object_key(self, hour_ms: int) -> str:
        return f"{self.prefix}/{time.strftime('%Y/%m/%d/%H', time.gmtime(hour_ms / 1000))}.jsonl"

    def export(self, hour_ms: int, lines: list[bytes]) -> str:
        """Write the hour's file once; returns the sha256 of its body. Blocking (boto3)."""
        body = b"".join(line + b"\n" for line in lines)
        digest = hashlib.sha256(body).hexdigest()
        key = self.object_key(hour_ms)
        from botocore.exceptions import ClientError

        try:
            self._s3.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=body,
                IfNoneMatch="*",
                ContentType="application/x-ndjson",
                Metadata={"sha256": digest, "entries": str(len(lines))},
            )
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "412"):
                raise
            existing = hashlib.sha256(self.fetch(hour_ms)).hexdigest()
            if existing != digest:
                raise ExportConflict(
                    f"s3://{self.bucket}/{key} exists with other content (sha256 {existing}, "
                    f"ours {digest}); not overwriting it"
                ) from e
            log.info("billing: s3://%s/%s was already exported", self.bucket, key)
            return digest
        log.info("billing: exported %d entries to s3://%s/%s", len(lines), self.bucket, key)
        return digest

    def fetch(self, hour_ms: int) -> bytes:
        reply = self._s3.get_object(Bucket=self.bucket, Key=self.object_key(hour_ms))
        # boto3 publishes no types: the body is bytes, as botocore documents.
        return bytes(reply["Body"].read())


def exporter_from(settings: Settings) -> S3HourExporter | None:
    """The exporter EBB_BILLING_S3_* describe, or None when no bucket is set."""
    if not settings.billing_s3_bucket:
        return None
    return S3HourExporter(
        settings.billing_s3_bucket,
        settings.billing_s3_prefix,
        endpoint_url=settings.billing_s3_endpoint_url,
    )
