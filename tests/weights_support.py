"""Real remote endpoints for weight-cache tests: moto's S3 server, a byte-counting TCP proxy,
and a small Hugging Face Hub endpoint that serves prepared directories.

Why a local hub endpoint rather than a prepared directory: `hf://` sources go through
`huggingface_hub.snapshot_download`, and what can break there is the HTTP conversation
(revision resolution, file listing, tokens, error codes, partial downloads). A prepared
directory would skip all of it. This server speaks the few routes the client uses (repo
info at a revision, the file tree, `resolve/` downloads with ranges), with the Hub's
headers and error codes, so the real client runs unchanged against it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx
import numpy as np
from safetensors.numpy import save_file

# --- model directories -------------------------------------------------------------------

CONTEXT_LEN = 128


def write_hf_dir(root: Path, *, seed: int = 0, rows: int = 4) -> Path:
    """A tiny model directory in HF layout (shapes are all that matter here)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {
        "model.embed_tokens.weight": rng.standard_normal((rows, 8)).astype(np.float32),
        "model.norm.weight": np.ones(8, dtype=np.float32),
    }
    save_file(tensors, root / "model.safetensors", metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "max_position_embeddings": CONTEXT_LEN,
        "tie_word_embeddings": True,
    }
    (root / "config.json").write_text(json.dumps(config))
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    return root


def write_servable_dir(root: Path, *, seed: int = 0, mib: int = 4) -> Path:
    """A checkpoint the frontdoor can prepare: safetensors, config, a real (word-level)
    tokenizer with a chat template. Not a model vLLM could run."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    weights = {"model.norm.weight": rng.standard_normal(mib * 2**18).astype(np.float32)}
    save_file(weights, root / "model.safetensors", metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    (root / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 256}))
    vocab = {
        "[UNK]": 0,
        **{w: i + 1 for i, w in enumerate(["the", "capital", "of", "france", "is"])},
    }
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(root)
    return root


def leftovers(cache_dir: Path) -> list[str]:
    """What builds left in the cache's staging area (nothing, after a clean failure)."""
    tmp = cache_dir / "tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []


def published(cache_dir: Path) -> list[str]:
    models = cache_dir / "models"
    return sorted(p.name for p in models.iterdir()) if models.exists() else []


def run_in_processes(target, args: tuple, count: int, timeout_s: float = 120) -> list[str]:
    """Run `target(*args, results)` in `count` spawned processes at once; what each put
    in `results`. Children report errors as results, so a failure never hangs the test."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    workers = [ctx.Process(target=target, args=(*args, results)) for _ in range(count)]
    for worker in workers:
        worker.start()
    found = [results.get(timeout=timeout_s) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    return found


# --- S3 (moto) -----------------------------------------------------------------------------


class MotoS3:
    """moto's S3 server on a loopback port, for one test module."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        self.access_key = "testing"
        self.secret_key = "testing"

    def client(self, endpoint_url: str | None = None, **creds):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=endpoint_url or self.url,
            aws_access_key_id=creds.get("access_key", self.access_key),
            aws_secret_access_key=creds.get("secret_key", self.secret_key),
            region_name="us-east-1",
        )

    def require_auth(self) -> None:
        """From now on only a real IAM key of this server is accepted (moto accepts any
        key otherwise): create a user allowed s3:*, switch authentication on."""
        iam = self._iam()
        iam.create_user(UserName="ebb")
        iam.put_user_policy(
            UserName="ebb",
            PolicyName="s3",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
                }
            ),
        )
        key = iam.create_access_key(UserName="ebb")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        httpx.post(f"{self.url}/moto-api/reset-auth", content=b"0").raise_for_status()

    def allow_anyone(self) -> None:
        httpx.post(f"{self.url}/moto-api/reset-auth", content=b"inf").raise_for_status()

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        """What a process needs to reach this server through boto3's standard variables."""
        return {
            "AWS_ENDPOINT_URL_S3": endpoint_url or self.url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def _iam(self):
        import boto3

        return boto3.client(
            "iam",
            endpoint_url=self.url,
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
            region_name="us-east-1",
        )

    def stop(self) -> None:
        self.server.stop()


def upload_dir(client, bucket: str, prefix: str, folder: Path, **extra) -> list[str]:
    """Upload every top-level file of `folder` (multipart for large ones, like the CLI)."""
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024**2)
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    for name in names:
        client.upload_file(
            str(folder / name), bucket, f"{prefix}/{name}", Config=config, ExtraArgs=extra or None
        )
    return names


# --- a TCP proxy that counts, slows, cuts or corrupts what a client receives ----------------


class CountingProxy:
    """Forwards loopback TCP connections to `target` and watches them.

    It counts the bytes sent back (`bytes_down`), ranged GETs (`range_requests`) and the
    most connections open at once (`max_open`). `delay_s_per_mib` throttles downloads, so
    one takes long enough to be interrupted; `cut_connections` connections are closed after
    `cut_after_bytes` bytes of their answer (a network failure mid-stream);
    `corrupt_chunks` full-size chunks of body have a byte flipped on the way.
    """

    def __init__(self, target_url: str, delay_s_per_mib: float = 0.0, shared_link: bool = True):
        parts = urlsplit(target_url)
        self.target = (parts.hostname, parts.port)
        self.delay_s_per_mib = delay_s_per_mib
        self.shared_link = shared_link
        self.bytes_down = 0
        self.range_requests = 0
        self.open = 0
        self.max_open = 0
        self.cut_connections = 0
        self.cut_after_bytes = 256 * 1024
        self.corrupt_chunks = 0
        self._lock = threading.Lock()
        self._link = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self.open += 1
                self.max_open = max(self.max_open, self.open)
                cut = self.cut_connections > 0
                self.cut_connections -= cut
            threading.Thread(
                target=self._pipe, args=(client, upstream, False, False), daemon=True
            ).start()
            threading.Thread(
                target=self._pipe, args=(upstream, client, True, cut), daemon=True
            ).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, downstream: bool, cut: bool) -> None:
        sent = 0
        try:
            while data := src.recv(64 * 1024):
                if downstream:
                    data = self._down(data)
                    if cut and sent + len(data) > self.cut_after_bytes:
                        break
                else:
                    with self._lock:
                        self.range_requests += data.lower().count(b"\r\nrange: bytes=")
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            if downstream:
                with self._lock:
                    self.open -= 1
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def _down(self, data: bytes) -> bytes:
        with self._lock:
            self.bytes_down += len(data)
            # A full 64 KiB read is body: headers are far smaller.
            corrupt = self.corrupt_chunks > 0 and len(data) == 64 * 1024
            self.corrupt_chunks -= corrupt
        if self.delay_s_per_mib:
            # One slow link shared by every connection, or a cap per connection (as S3 has).
            with self._link if self.shared_link else contextlib.nullcontext():
                time.sleep(self.delay_s_per_mib * len(data) / 2**20)
        if corrupt:
            data = data[:-1] + bytes([data[-1] ^ 0x01])
        return data

    def close(self) -> None:
        self._closed = True
        self._listener.close()


# --- a local Hugging Face Hub endpoint ------------------------------------------------------


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
