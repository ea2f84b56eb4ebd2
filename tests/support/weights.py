"""Real remote endpoints and cache helpers for weight-cache tests: model directories in HF
layout, moto's S3 server, a TCP proxy that counts, slows, cuts or corrupts what a client
receives, and spawned processes racing for one model. The Hub endpoint is hub_server.py.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

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
        self._auth_required = False

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
        # moto's IAM users, like its authentication switch, are process-wide: a name of
        # this server's own, so a later module's server does not meet an earlier user.
        user = f"ebb-{self.url.rsplit(':', 1)[1]}"
        iam.create_user(UserName=user)
        iam.put_user_policy(
            UserName=user,
            PolicyName="s3",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
                }
            ),
        )
        key = iam.create_access_key(UserName=user)["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        httpx.post(f"{self.url}/moto-api/reset-auth", content=b"0").raise_for_status()
        self._auth_required = True

    def allow_anyone(self) -> None:
        httpx.post(f"{self.url}/moto-api/reset-auth", content=b"inf").raise_for_status()
        self._auth_required = False

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
        # moto keeps "authentication on" in process-wide state, not per server: left on,
        # it would refuse every later module's fresh server.
        if self._auth_required:
            self.allow_anyone()
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
