"""Pure pieces of the weight cache: digests against what sources state, the LRU order,
byte-size settings, resume journals."""

from __future__ import annotations

import hashlib
import zlib

import pytest

from ebb.config import Settings, parse_bytes
from ebb.weights_cache import CacheOptions
from ebb.weights_cache.checksums import Expected, b64_to_hex, digest_file
from ebb.weights_cache.eviction import EntryInfo, eviction_order
from ebb.weights_cache.ranged import _read_journal

DATA = bytes(range(256)) * 40_000  # 10 MB, three 4 MiB parts (the last one short)


@pytest.fixture
def blob(tmp_path):
    (tmp_path / "blob").write_bytes(DATA)
    return tmp_path


def multipart_etag(data: bytes, part_bytes: int) -> str:
    parts = [data[i : i + part_bytes] for i in range(0, len(data), part_bytes)]
    digests = b"".join(hashlib.md5(p).digest() for p in parts)  # noqa: S324
    return f"{hashlib.md5(digests).hexdigest()}-{len(parts)}"  # noqa: S324


@pytest.mark.parametrize(
    "expected",
    [
        Expected(len(DATA), sha256_hex=hashlib.sha256(DATA).hexdigest()),
        Expected(len(DATA), crc32=zlib.crc32(DATA)),
        Expected(len(DATA), md5_hex=hashlib.md5(DATA).hexdigest()),  # noqa: S324
        Expected(
            len(DATA),
            multipart_etag=multipart_etag(DATA, 4 * 2**20),
            multipart_part_bytes=4 * 2**20,
        ),
        Expected(
            len(DATA),
            git_sha1_hex=hashlib.sha1(f"blob {len(DATA)}\0".encode() + DATA).hexdigest(),  # noqa: S324
        ),
        Expected(len(DATA)),
    ],
    ids=["sha256", "crc32", "md5", "multipart", "git", "size"],
)
def test_a_file_matching_its_source_passes_and_gets_its_sha256(blob, expected):
    seen = []
    entry, problem = digest_file(blob, "blob", expected, seen.append)
    assert problem is None
    assert entry.sha256 == hashlib.sha256(DATA).hexdigest()
    assert entry.size_bytes == len(DATA) == sum(seen)


@pytest.mark.parametrize(
    ("expected", "says"),
    [
        (Expected(len(DATA), sha256_hex="0" * 64), "sha256 is"),
        (Expected(len(DATA), crc32=1), "crc32 is"),
        (Expected(len(DATA), md5_hex="0" * 32), "md5 is"),
        (
            Expected(len(DATA), multipart_etag="0" * 32 + "-3", multipart_part_bytes=4 * 2**20),
            "multipart_etag",
        ),
        (Expected(len(DATA), git_sha1_hex="0" * 40), "git_sha1 is"),
        (Expected(len(DATA) + 1), "size is"),
    ],
)
def test_a_file_differing_from_its_source_says_how(blob, expected, says):
    _, problem = digest_file(blob, "blob", expected)
    assert problem is not None and problem.startswith("blob: ") and says in problem


def test_git_blob_id_of_an_empty_file_is_gits(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    expected = Expected(0, git_sha1_hex="e69de29bb2d1d6434b8b29ae775ad8c2e48c5391")
    assert digest_file(tmp_path, "empty", expected)[1] is None


def test_s3_base64_checksums_decode_and_garbage_does_not():
    assert b64_to_hex("AAECAw==") == "00010203"
    assert b64_to_hex("abc-3") is None


def test_eviction_order_is_least_recent_first_and_skips_what_holds_no_bytes():
    entries = [
        EntryInfo("new", "s3://b/new", 10, last_access_s=300),
        EntryInfo("old", "s3://b/old", 10, last_access_s=100),
        EntryInfo("local", "file:///m", 0, last_access_s=1),
        EntryInfo("partial", "", 5, last_access_s=200, partial=True),
    ]
    assert [e.key for e in eviction_order(entries)] == ["old", "partial", "new"]


@pytest.mark.parametrize(
    ("text", "value"),
    [("1000", 1000), ("50GB", 50 * 10**9), ("40GiB", 40 * 2**30), ("1.5 gb", 1_500_000_000)],
)
def test_byte_sizes_accept_units(text, value):
    assert parse_bytes(text, "X") == value


@pytest.mark.parametrize("text", ["", "GB", "12 parsecs", "-5"])
def test_byte_sizes_refuse_garbage_naming_the_variable(text):
    with pytest.raises(ValueError, match="EBB_WEIGHTS_CACHE_BYTES must be"):
        parse_bytes(text, "EBB_WEIGHTS_CACHE_BYTES")


def test_cache_options_come_from_settings(monkeypatch):
    monkeypatch.setenv("EBB_WEIGHTS_CACHE_BYTES", "2GiB")
    monkeypatch.setenv("EBB_WEIGHTS_FETCH_CONCURRENCY", "3")
    options = CacheOptions.from_settings(Settings())
    assert (options.budget_bytes, options.concurrency) == (2 * 2**30, 3)
    monkeypatch.setenv("EBB_WEIGHTS_CACHE_BYTES", "0")
    with pytest.raises(ValueError, match="must be positive"):
        Settings()


def test_resume_journal_counts_only_complete_lines_of_the_same_version(tmp_path):
    data, journal = tmp_path / "w", tmp_path / ".w.parts"
    data.write_bytes(b"\0" * 100)
    header = "ebb-parts-v1 etag1 100 10"
    journal.write_text(f"{header}\n0\n3\n1")  # "1" was cut short by a crash
    assert _read_journal(journal, header, data, 100) == {0, 3}
    assert _read_journal(journal, header.replace("etag1", "etag2"), data, 100) is None
    assert _read_journal(journal, header, data, 99) is None
    assert _read_journal(tmp_path / "absent", header, data, 100) is None
