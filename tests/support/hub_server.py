"""A small Hugging Face Hub endpoint that serves prepared directories, on a loopback port.

Why a local hub endpoint rather than a prepared directory: `hf://` sources go through
`huggingface_hub.snapshot_download`, and what can break there is the HTTP conversation
(revision resolution, file listing, tokens, error codes, partial downloads). A prepared
directory would skip all of it. This server speaks the few routes the client uses (repo
info at a revision, the file tree, `resolve/` downloads with ranges), with the Hub's
headers and error codes, so the real client runs unchanged against it.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class HubRepo:
    folder: Path
    commit: str
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    gated: bool = False


class HubServer:
    """Serves `repos` (repo id -> HubRepo) the way the Hub does, on a loopback port."""

    def __init__(self, token: str | None = None):
        self.repos: dict[str, HubRepo] = {}
        self.token = token
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Authorization
        self.fail_downloads = 0  # answer this many file downloads with 503 first
        handler = type("Handler", (_HubHandler,), {"hub": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def add(self, repo_id: str, folder: Path, *, branch: str = "main", gated: bool = False) -> str:
        """Publish `folder` as `repo_id` at `branch`; returns the commit id."""
        digest = hashlib.sha1(repo_id.encode())  # noqa: S324 - an id, like git's
        for path in sorted(folder.iterdir()):
            digest.update(path.name.encode() + path.read_bytes())
        commit = digest.hexdigest()
        self.repos[repo_id] = HubRepo(folder, commit, {branch: commit}, gated)
        return commit

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()  # noqa: S324


_INFO_RE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_TREE_RE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_FILE_RE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


class _HubHandler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: tests read hub.requests instead
        pass

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)

    def _route(self, head: bool) -> None:
        path = urlsplit(self.path).path
        self.hub.requests.append((self.command, path, self.headers.get("Authorization")))
        if self.hub.token and self.headers.get("Authorization") != f"Bearer {self.hub.token}":
            message = "Invalid credentials in Authorization header"
            return self._error(401, "", message if self.headers.get("Authorization") else "")
        for pattern, handler in ((_INFO_RE, self._info), (_TREE_RE, self._tree)):
            if m := pattern.match(path):
                return self._with_repo(m, handler)
        if m := _FILE_RE.match(path):
            return self._with_repo(m, lambda repo, commit, m: self._file(repo, commit, m, head))
        self._error(404, "", "no such route")

    def _with_repo(self, m: re.Match, handler) -> None:
        repo = self.hub.repos.get(m["repo"])
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        if repo.gated:
            return self._error(403, "GatedRepo", "Access to this model is restricted")
        rev = unquote(m["rev"])
        commit = rev if rev == repo.commit else repo.refs.get(rev)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        handler(repo, commit, m)

    def _info(self, repo: HubRepo, commit: str, m: re.Match) -> None:
        siblings = [{"rfilename": p.name} for p in sorted(repo.folder.iterdir())]
        self._json({"id": m["repo"], "modelId": m["repo"], "sha": commit, "siblings": siblings})

    def _tree(self, repo: HubRepo, commit: str, m: re.Match) -> None:
        entries = []
        for p in sorted(repo.folder.iterdir()):
            data = p.read_bytes()
            entry = {"type": "file", "oid": _git_blob_id(data), "size": len(data), "path": p.name}
            if p.suffix == ".safetensors":
                sha = hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
            entries.append(entry)
        self._json(entries)

    def _file(self, repo: HubRepo, commit: str, m: re.Match, head: bool) -> None:
        path = repo.folder / unquote(m["path"])
        if not path.is_file():
            return self._error(404, "EntryNotFound", "Entry not found")
        if not head and self.hub.fail_downloads > 0:
            self.hub.fail_downloads -= 1
            return self._error(503, "", "try again")
        data = path.read_bytes()
        etag = hashlib.sha256(data).hexdigest() if path.suffix == ".safetensors" else None
        start, status = 0, 200
        if (rng := self.headers.get("Range")) and (found := re.match(r"bytes=(\d+)-", rng)):
            start, status = int(found[1]), 206
        body = data[start:]
        self.send_response(status)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{etag or _git_blob_id(data)}"')
        self.send_header("Content-Length", str(len(body)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        if message:
            self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
