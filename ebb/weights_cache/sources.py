"""Model source URIs: parse and validate them without touching the filesystem.

The frontdoor calls `parse_source` when a deployment is created, so this module imports
nothing heavy and does no I/O: whether the weights exist is `ensure()`'s question.

Accepted forms (see `ACCEPTED_FORMS`):
- `gguf:<package>/<file.gguf>` a GGUF file shipped inside an installed Python package;
- `gguf:/abs/path/file.gguf`   a GGUF file on local disk;
- `file:///abs/dir` or `/abs/dir`  a local directory already in Hugging Face layout;
- `s3://bucket/prefix`         an HF-layout checkpoint under an S3 prefix (any endpoint);
- `hf://org/name@revision`     a Hugging Face Hub model repository (revision defaults to main).

A path is taken as written: a `.` or `..` segment (also percent-encoded, in `file:`
URIs) or a percent-encoded `/` or `.` is refused, never resolved, so what is checked
against a tenant's allowed prefixes is the directory that is read (`normalize_source`,
`within_prefix`).

A new scheme plugs in by adding its parser to `_SCHEME_PARSERS` and its backend to
`ebb.weights_cache.cache`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath
from typing import ClassVar
from urllib.parse import unquote, urlsplit

from ebb.errors import InvalidRequest

ACCEPTED_FORMS = (
    "gguf:<package>/<file.gguf>",
    "gguf:/abs/path/file.gguf",
    "file:///abs/dir",
    "/abs/dir",
    "s3://bucket/prefix",
    "hf://org/name@revision",
)

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_PACKAGE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# S3's rules for new buckets (3-63 lowercase letters, digits, dots, hyphens).
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# The Hub's repo ids: an optional owner and a name, each of letters, digits, '-', '_', '.'.
_HF_REPO_RE = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")
_HF_REVISION_RE = re.compile(r"^[\w][\w./-]{0,254}$")
# A percent-encoded '/', '.', '\\' or '%': a second spelling of a path's structure.
_ENCODED_STRUCTURE_RE = re.compile(r"%(2[fFeE]|5[cC]|25)")
# Where a prefix without a trailing '/' may end inside a source: a segment boundary.
_BOUNDARIES = "/?@#"


class SourceKind(StrEnum):
    GGUF = "gguf"
    LOCAL = "local"
    S3 = "s3"
    HF = "hf"


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file, either inside an installed package (`package` set) or at an absolute path.

    `file` is the path relative to the package directory, or the absolute path.
    """

    kind: ClassVar[SourceKind] = SourceKind.GGUF
    uri: str
    file: str
    package: str | None = None

    @property
    def name(self) -> str:
        return PurePosixPath(self.file).stem


@dataclass(frozen=True)
class LocalDirSource:
    """A directory in Hugging Face layout, used in place."""

    kind: ClassVar[SourceKind] = SourceKind.LOCAL
    uri: str
    path: str

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name


@dataclass(frozen=True)
class S3Source:
    """The objects under `s3://bucket/prefix/`: a checkpoint in HF layout (flat)."""

    kind: ClassVar[SourceKind] = SourceKind.S3
    uri: str
    bucket: str
    prefix: str  # without leading or trailing slash; "" for the bucket's top level

    @property
    def name(self) -> str:
        return PurePosixPath(self.prefix).name or self.bucket

    @property
    def list_prefix(self) -> str:
        """What to list: the prefix as a folder, so `m` never matches `m2/...`."""
        return f"{self.prefix}/" if self.prefix else ""


@dataclass(frozen=True)
class HfSource:
    """A Hugging Face Hub model repository at a revision (branch, tag or commit)."""

    kind: ClassVar[SourceKind] = SourceKind.HF
    uri: str
    repo_id: str
    revision: str

    @property
    def name(self) -> str:
        return PurePosixPath(self.repo_id).name


Source = GgufSource | LocalDirSource | S3Source | HfSource


def parse_source(source: str) -> Source:
    """Validate a model source URI and return its typed form, with a canonical `uri`.

    Two spellings of the same source (`/abs/dir` and `file:///abs/dir`) get the same
    canonical `uri`, which is what the weight cache keys on. Raises `InvalidRequest`
    naming the accepted forms.
    """
    if not isinstance(source, str) or not source:
        raise _invalid("the model source is empty")
    if source != source.strip() or any(ch in source for ch in "\r\n\t\0"):
        raise _invalid(f"the model source {source!r} contains whitespace or control characters")
    if _ENCODED_STRUCTURE_RE.search(source):
        raise _invalid(f"{source!r}: spell '/', '.', '\\' and '%' as themselves, not encoded")
    if source.startswith("/"):
        return _parse_local_path(source, source)
    match = _SCHEME_RE.match(source)
    if match is None:
        raise _invalid(f"{source!r} is not a recognised model source (relative paths are refused)")
    scheme = match.group(1).lower()
    parser = _SCHEME_PARSERS.get(scheme)
    if parser is None:
        raise _invalid(f"unsupported model source scheme {scheme!r} in {source!r}")
    return parser(source)


def _parse_gguf(source: str) -> GgufSource:
    rest = source[len("gguf:") :]
    if not rest.lower().endswith(".gguf"):
        raise _invalid(f"{source!r} must name a file ending in .gguf")
    if rest.startswith("/"):
        path = _normalize_abs(rest, source)
        return GgufSource(uri=f"gguf:{path}", file=path)
    package, slash, file = rest.partition("/")
    if not slash:
        raise _invalid(f"{source!r} must name the package and the file in it, or an absolute path")
    if not _PACKAGE_RE.match(package):
        raise _invalid(f"{package!r} in {source!r} is not an importable Python package name")
    parts = PurePosixPath(file).parts
    if file.startswith("/") or any(part in ("..", ".") for part in parts) or "//" in file:
        raise _invalid(f"{source!r}: the file must be a plain path inside the package {package!r}")
    return GgufSource(uri=f"gguf:{package}/{file}", file=file, package=package)


def _parse_file_uri(source: str) -> LocalDirSource:
    parts = urlsplit(source)
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise _invalid(f"{source!r}: a file URI must look like file:///abs/dir (no host, no query)")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise _invalid(f"{source!r}: a file URI needs an absolute path")
    return _parse_local_path(source, path)


def _parse_local_path(source: str, path: str) -> LocalDirSource:
    if "\\" in path:
        raise _invalid(f"{source!r}: use forward slashes in local paths")
    normalized = _normalize_abs(path, source)
    if normalized == "/":
        raise _invalid(f"{source!r}: the root directory is not a model directory")
    return LocalDirSource(uri=f"file://{normalized}", path=normalized)


def _parse_s3(source: str) -> S3Source:
    parts = urlsplit(source)
    bucket = parts.netloc
    if parts.query or parts.fragment or "@" in bucket:
        raise _invalid(f"{source!r}: an S3 source looks like s3://bucket/prefix (no query)")
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise _invalid(f"{source!r}: {bucket!r} is not a valid S3 bucket name")
    prefix = parts.path.strip("/")
    segments = prefix.split("/") if prefix else []
    if any(seg in ("", ".", "..") for seg in segments):
        raise _invalid(f"{source!r}: the prefix must be a plain path (no '//', '.' or '..')")
    return S3Source(uri=f"s3://{bucket}/{prefix}", bucket=bucket, prefix=prefix)


def _parse_hf(source: str) -> HfSource:
    rest = source[len("hf:") :]
    if not rest.startswith("//"):
        raise _invalid(f"{source!r}: a Hub source looks like hf://org/name@revision")
    repo_id, at, revision = rest[2:].partition("@")
    revision = revision if at else "main"
    if not _HF_REPO_RE.match(repo_id) or ".." in repo_id:
        raise _invalid(f"{source!r}: {repo_id!r} is not a Hub repo id like org/name")
    if not _HF_REVISION_RE.match(revision) or ".." in revision:
        raise _invalid(f"{source!r}: {revision!r} is not a branch, tag or commit")
    return HfSource(uri=f"hf://{repo_id}@{revision}", repo_id=repo_id, revision=revision)


def _normalize_abs(path: str, source: str) -> str:
    """`path` with repeated and trailing slashes folded; a `.` or `..` segment is refused
    (resolved lexically, `/allowed/link/..` could name a directory outside `/allowed`)."""
    segments = [seg for seg in path.split("/") if seg]
    if any(seg in (".", "..") for seg in segments):
        raise _invalid(f"{source!r}: write the path without '.' or '..' segments")
    return "/" + "/".join(segments)


def normalize_source(source: str) -> str:
    """The one spelling of `source` that is stored and checked against allowed prefixes.

    A source this module parses gets its canonical `uri` (`/abs/dir` and
    `file:///abs//dir/` are both `file:///abs/dir`); any other scheme (an engine entry's
    own, such as the test engines' `fake://`) gets its scheme lowercased and its path's
    repeated slashes folded. Either way a `.` or `..` path segment, or a percent-encoded
    `/`, `.`, `\\` or `%`, is refused (`InvalidRequest`), never resolved.
    """
    if source.startswith("/") or _scheme_of(source) in _SCHEME_PARSERS:
        return parse_source(source).uri
    return _normalize_other(source)


def within_prefix(source: str, prefix: str) -> bool:
    """Whether the normalized `source` is `prefix` or lies under it, on a segment boundary.

    Both are normalized first (a prefix is spelled like a source: `/srv/m` is
    `file:///srv/m`). A prefix ending in `/` (or `:`, as in `fake://`) covers what starts
    with it; one ending otherwise covers itself and what continues it after `/`, `?`,
    `@` or `#`: `s3://acme-models` covers `s3://acme-models/x`, never
    `s3://acme-models-evil/x`. A prefix that cannot be normalized covers nothing.
    """
    try:
        wanted = _normalize_prefix(prefix)
    except InvalidRequest:
        return False
    if not source.startswith(wanted):
        return False
    if wanted.endswith(("/", ":")) or len(source) == len(wanted):
        return True
    return source[len(wanted)] in _BOUNDARIES


def _normalize_prefix(prefix: str) -> str:
    if prefix.startswith("/"):
        prefix = "file://" + prefix
    scheme = _scheme_of(prefix)
    if scheme == "file":
        parts = urlsplit(prefix)
        if _ENCODED_STRUCTURE_RE.search(prefix):
            raise _invalid(f"{prefix!r}: spell '/', '.', '\\' and '%' as themselves")
        path = _normalize_abs(unquote(parts.path), prefix)
        trailing = "/" if prefix.endswith("/") and path != "/" else ""
        return f"file://{path}{trailing}"
    return _normalize_other(prefix)


def _normalize_other(source: str) -> str:
    """Lowercased scheme, `//` folded in the path; dot segments and encoded structure
    refused. The authority (after `scheme://`), query and fragment are kept as written."""
    scheme = _scheme_of(source)
    if not scheme:
        raise _invalid(f"{source!r} is not a recognised model source (relative paths are refused)")
    if any(ch in source for ch in "\r\n\t\0\\") or _ENCODED_STRUCTURE_RE.search(source):
        raise _invalid(f"{source!r}: spell '/', '.', '\\' and '%' as themselves, not encoded")
    rest = source[len(scheme) + 1 :]
    authority = ""
    if rest.startswith("//"):
        end = len(rest)
        for mark in "/?#":
            found = rest.find(mark, 2)
            end = found if found != -1 and found < end else end
        authority, rest = rest[:end], rest[end:]
    path, mark, tail = _split_path(rest)
    segments = path.split("/")
    if any(seg in (".", "..") for seg in segments):
        raise _invalid(f"{source!r}: write the path without '.' or '..' segments")
    folded = re.sub(r"/{2,}", "/", path)
    return f"{scheme}:{authority}{folded}{mark}{tail}"


def _split_path(rest: str) -> tuple[str, str, str]:
    """(path, '?' or '#' or '', the rest) of what follows a URI's authority."""
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i != -1), default=-1)
    if cut == -1:
        return rest, "", ""
    return rest[:cut], rest[cut], rest[cut + 1 :]


def _scheme_of(source: str) -> str:
    match = _SCHEME_RE.match(source)
    return match.group(1).lower() if match else ""


_SCHEME_PARSERS: dict[str, Callable[[str], Source]] = {
    "gguf": _parse_gguf,
    "file": _parse_file_uri,
    "s3": _parse_s3,
    "hf": _parse_hf,
}


def _invalid(reason: str) -> InvalidRequest:
    accepted = ", ".join(ACCEPTED_FORMS)
    return InvalidRequest(f"{reason}; accepted model sources: {accepted}", param="source")
