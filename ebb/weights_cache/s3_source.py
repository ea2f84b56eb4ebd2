"""`s3://bucket/prefix` sources: list, fetch in parallel byte ranges, verify, resume.

boto3 finds credentials and endpoints the standard way (AWS_ACCESS_KEY_ID / AWS_PROFILE /
instance roles; AWS_ENDPOINT_URL or AWS_ENDPOINT_URL_S3 for MinIO, moto or any other
endpoint). The version of a prefix is its listing (names, sizes, ETags); every ranged GET
carries `If-Match: <ETag>`, so an object replaced mid-download fails loudly instead of
mixing two versions. botocore's own retries are off: `with_retries` covers listing, heads
and each range alike, including a stream cut half-way, which botocore would not retry.

boto3 is imported inside functions: importing the weight cache must stay cheap.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from ebb.errors import (
    WeightsAuthError,
    WeightsError,
    WeightsNotFound,
    WeightsTransientError,
)
from ebb.weights_cache.backend import Version, wanted
from ebb.weights_cache.checksums import (
    Expected,
    b64_to_hex,
    digest_file,
    fetch_until_verified,
)
from ebb.weights_cache.manifest import FileEntry, Progress
from ebb.weights_cache.options import CacheOptions
from ebb.weights_cache.ranged import RangedDownload, RemoteFile, forget, journal_path
from ebb.weights_cache.retry import with_retries
from ebb.weights_cache.sources import S3Source

logger = logging.getLogger(__name__)

T = TypeVar("T")
# boto3 builds its clients and their answers at runtime and publishes no types: a client,
# and the objects it returns, are Any here.
S3Client = Any

# Small enough that progress moves smoothly while many ranges stream at once.
_STREAM_CHUNK_BYTES = 256 * 1024
_AUTH_CODES = {
    "AccessDenied",
    "AllAccessDisabled",
    "ExpiredToken",
    "InvalidAccessKeyId",
    "InvalidToken",
    "SignatureDoesNotMatch",
    "TokenRefreshRequired",
    "403",
    "401",
}
_MISSING_CODES = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}
_TRANSIENT_CODES = {
    "InternalError",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "ServiceUnavailable",
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "PreconditionFailed",  # If-Match: the object changed since it was listed
    "412",
}
_AUTH_HINT = (
    "check the credentials the platform runs with (AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or an instance role) and that they may "
    "s3:ListBucket and s3:GetObject on this bucket"
)

# A model's config.json, or a LoRA adapter's (served by a base; see weights_cache.adapters).
_CONFIG_NAMES = frozenset({"config.json", "adapter_config.json"})


@dataclass(frozen=True)
class _Object:
    name: str  # relative to the prefix
    key: str
    size_bytes: int
    etag: str  # without quotes


class S3Backend:
    """Backend for `s3://` sources; the store owns the fetched files."""

    in_place = False
    resumable = True

    def __init__(self, options: CacheOptions):
        self.options = options

    def resolve(self, source: S3Source) -> Version:
        objects = self._retry(lambda: self._list(source), f"listing {source.uri}")
        digest = hashlib.sha256()
        for obj in objects:
            digest.update(f"{obj.name}\0{obj.size_bytes}\0{obj.etag}\n".encode())
        total = sum(obj.size_bytes for obj in objects)
        return Version(f"s3:{digest.hexdigest()}", size_bytes=total, detail=tuple(objects))

    def root(self, source: S3Source) -> Path:
        raise NotImplementedError("S3 sources are fetched into the store")

    def fetch(
        self, source: S3Source, version: Version, dest: Path, progress: Progress | None
    ) -> dict[str, FileEntry]:
        # What this backend's resolve() listed.
        objects = cast(tuple[_Object, ...], version.detail)
        meter = _Meter(progress, "download", sum(o.size_bytes for o in objects))
        entries: dict[str, FileEntry] = {}
        todo = list(objects)
        started = time.monotonic()

        def fetch_round() -> list[str]:
            nonlocal todo
            bad = self._download(source, todo, dest, meter, entries)
            todo = [o for o in objects if o.name in bad]
            for obj in todo:
                forget(dest, obj.name)
                meter.add(-obj.size_bytes)
            return list(bad.values())

        fetch_until_verified(fetch_round, source.uri, "Upload the object again.")
        # Kept until every file passed, so a fetch killed after some did resumes them too.
        for obj in objects:
            journal_path(dest, obj.name).unlink(missing_ok=True)
        elapsed_s = time.monotonic() - started
        logger.info(
            "weights: fetched %s: %d files, %d bytes in %.1fs (%.0f MB/s, %d streams)",
            source.uri,
            len(objects),
            meter.total,
            elapsed_s,
            meter.total / max(elapsed_s, 1e-6) / 1e6,
            self.options.concurrency,
        )
        return entries

    def _download(
        self,
        source: S3Source,
        objects: list[_Object],
        dest: Path,
        meter: _Meter,
        entries: dict[str, FileEntry],
    ) -> dict[str, str]:
        """Fetch `objects`, verifying each as it completes; returns {name: mismatch}."""
        by_name = {o.name: o for o in objects}
        bad: dict[str, str] = {}
        lock = threading.Lock()

        def verify(remote: RemoteFile) -> None:
            obj = by_name[remote.name]
            expected = self._retry(
                lambda: self._expected(source, obj), f"reading the checksum of {remote.source}"
            )
            entry, problem = digest_file(dest, obj.name, expected)
            with lock:
                if problem is None:
                    entries[obj.name] = entry
                else:
                    bad[obj.name] = problem
            logger.debug("weights: %s verified by %s", remote.source, expected.describes)

        files = [
            RemoteFile(o.name, o.size_bytes, o.etag, f"s3://{source.bucket}/{o.key}")
            for o in objects
        ]
        download = RangedDownload(
            files,
            dest,
            functools.partial(self._read_range, source),
            self.options,
            meter.add,
            verify,
        )
        download.run()
        return bad

    def _list(self, source: S3Source) -> list[_Object]:
        client = s3_client(self.options.concurrency)
        found: list[_Object] = []
        skipped: list[str] = []
        token = None
        while True:
            kwargs = {"Bucket": source.bucket, "Prefix": source.list_prefix}
            if token:
                kwargs["ContinuationToken"] = token
            try:
                page = client.list_objects_v2(**kwargs)
            except Exception as e:
                raise map_s3_error(e, f"listing {source.uri}") from e
            for item in page.get("Contents", ()):
                name = item["Key"][len(source.list_prefix) :]
                if wanted(name):
                    found.append(_Object(name, item["Key"], item["Size"], item["ETag"].strip('"')))
                elif name:
                    skipped.append(name)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        _check_listing(source, found, skipped)
        return sorted(found, key=lambda o: o.name)

    def _expected(self, source: S3Source, obj: _Object) -> Expected:
        client = s3_client(self.options.concurrency)
        try:
            head = client.head_object(
                Bucket=source.bucket, Key=obj.key, IfMatch=f'"{obj.etag}"', ChecksumMode="ENABLED"
            )
            return _expected_from_head(client, source.bucket, obj, head)
        except Exception as e:
            raise map_s3_error(e, f"reading s3://{source.bucket}/{obj.key}") from e

    def _read_range(
        self, source: S3Source, remote: RemoteFile, start: int, end: int
    ) -> Iterator[bytes]:
        key = f"{source.list_prefix}{remote.name}"
        what = f"reading {remote.source}"
        try:
            body = s3_client(self.options.concurrency).get_object(
                Bucket=source.bucket,
                Key=key,
                Range=f"bytes={start}-{end}",
                IfMatch=f'"{remote.version}"',
            )["Body"]
        except Exception as e:
            raise map_s3_error(e, what) from e
        return _stream(body, what)

    def _retry(self, call: Callable[[], T], what: str) -> T:
        return with_retries(call, what, self.options.attempts, self.options.backoff_s)


def _stream(body: Any, what: str) -> Iterator[bytes]:
    try:
        yield from body.iter_chunks(_STREAM_CHUNK_BYTES)
    except Exception as e:
        raise map_s3_error(e, what) from e
    finally:
        body.close()


def _check_listing(source: S3Source, found: list[_Object], skipped: list[str]) -> None:
    names = {o.name for o in found}
    if not found and not skipped:
        raise WeightsNotFound(
            f"there are no objects under {source.uri}/ (bucket {source.bucket!r}, prefix "
            f"{source.list_prefix!r}); check the prefix, e.g. with `aws s3 ls {source.uri}/`"
        )
    if _CONFIG_NAMES.isdisjoint(names) or not any(n.endswith(".safetensors") for n in names):
        shown = ", ".join(sorted(names | set(skipped))[:12])
        raise WeightsNotFound(
            f"{source.uri}/ is not a checkpoint in Hugging Face layout: it needs config.json "
            f"and *.safetensors at its top level, and holds: {shown}"
        )


def _expected_from_head(
    client: S3Client, bucket: str, obj: _Object, head: dict[str, Any]
) -> Expected:
    """The strongest check S3 offers for this object (see `checksums`)."""
    size = head["ContentLength"]
    etag = head.get("ETag", "").strip('"')
    # A multipart object's checksum covers its parts unless S3 says FULL_OBJECT outright.
    default_type = "COMPOSITE" if "-" in etag else "FULL_OBJECT"
    if (head.get("ChecksumType") or default_type) == "FULL_OBJECT":
        if head.get("ChecksumSHA256") and (sha := b64_to_hex(head["ChecksumSHA256"])):
            return Expected(size, sha256_hex=sha)
        if head.get("ChecksumCRC32") and (crc := b64_to_hex(head["ChecksumCRC32"])):
            return Expected(size, crc32=int(crc, 16))
    if head.get("ServerSideEncryption") == "aws:kms" or head.get("SSECustomerAlgorithm"):
        return Expected(size)  # the ETag of an encrypted object is not an MD5
    if "-" not in etag:
        return Expected(size, md5_hex=etag) if len(etag) == 32 else Expected(size)
    parts = int(etag.rsplit("-", 1)[1]) if etag.rsplit("-", 1)[1].isdigit() else 0
    # No If-Match here: S3 compares it with the part's own ETag, not the object's.
    first = client.head_object(Bucket=bucket, Key=obj.key, PartNumber=1)
    part_bytes = first.get("ContentLength", 0)
    # Only uniform parts (what every SDK uploads) let the ETag be recomputed.
    if part_bytes and parts == -(-size // part_bytes):
        return Expected(size, multipart_etag=etag, multipart_part_bytes=part_bytes)
    return Expected(size)


def map_s3_error(error: Exception, what: str) -> WeightsError:
    """A botocore failure as the weights error a caller can act on."""
    if isinstance(error, WeightsError):
        return error
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    if isinstance(error, NoCredentialsError | PartialCredentialsError):
        return WeightsAuthError(f"{what}: no usable AWS credentials were found; {_AUTH_HINT}")
    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        message = f"{what}: {code or status} {error.response.get('Error', {}).get('Message', '')}"
        if code in _AUTH_CODES:
            return WeightsAuthError(f"{message.strip()}; {_AUTH_HINT}")
        if code in _MISSING_CODES:
            return WeightsNotFound(f"{message.strip()}; check the bucket and prefix")
        if code in _TRANSIENT_CODES or status >= 500 or status == 429:
            return WeightsTransientError(message.strip())
        return WeightsError(message.strip())
    if isinstance(error, BotoCoreError | OSError):
        # Connection refused or reset, timeouts, a stream cut short.
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        where = f" (endpoint {endpoint})" if endpoint else ""
        return WeightsTransientError(f"{what}{where}: {type(error).__name__}: {error}")
    return WeightsError(f"{what}: {type(error).__name__}: {error}")


class _Meter:
    """Thread-safe byte counter that reports progress at most every half percent."""

    def __init__(self, progress: Progress | None, phase: str, total: int):
        self.progress = progress
        self.phase = phase
        self.total = total
        self.done = 0
        self.reported = -1.0
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            fraction = min(self.done / self.total, 1.0) if self.total else 1.0
            if self.progress is None or abs(fraction - self.reported) < 0.005 and fraction < 1:
                return
            self.reported = fraction
            self.progress(self.phase, fraction)


def s3_client(concurrency: int) -> S3Client:
    """A shared client per credentials and endpoint (boto3 clients are thread-safe, and
    building one costs tens of milliseconds)."""
    aws_env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    return _client(concurrency, aws_env)


@functools.lru_cache(maxsize=8)
def _client(concurrency: int, aws_env: tuple[tuple[str, str], ...]) -> S3Client:
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"total_max_attempts": 1},
        max_pool_connections=concurrency + 4,
        connect_timeout=10,
        read_timeout=60,
        # Ranged GETs of parts are not checksummed by S3; we verify whole files instead.
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client("s3", config=config)
