"""How long `POST /v1/batches` takes to answer, and what a batch keeps in Redis, by line count.

    .venv/bin/python -m bench.batch_create [--lines 10000] [--no-run]

One ebb platform on the fake engine (1 ms steps). A file of `--lines` chat requests is
uploaded, then the batch is created: timed are the answer (its status: `validating`), the
moment it is `in_progress` (every line a job) and, unless `--no-run`, `completed`. Redis's
used memory is read before, once queued, once settled and after its jobs' records were
shortened (they expire within the hour; not waited for). Results go to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

from bench.loadgen import save_results

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import Platform, deploy, temp_home, wait_until  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def _file(lines: int) -> bytes:
    body = {"model": "bench-m", "messages": MESSAGES, "max_tokens": 4}
    return b"".join(
        json.dumps(
            {"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        ).encode()
        + b"\n"
        for i in range(lines)
    )


def _status(admin: httpx.Client, batch_id: str) -> dict:
    return admin.get(f"/v1/batches/{batch_id}", timeout=60).json()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--no-run", action="store_true", help="Stop once every line is a job.")
    args = parser.parse_args()
    env = {"EBB_TEST_ENGINES": "1", "EBB_FILES_MAX_BYTES_PER_TENANT": str(1 << 30)}
    platform = Platform(home=temp_home("ebb-bench-batch-create-"), redis_url=None, env_extra=env)
    platform.start()
    try:
        with platform.admin() as admin:
            deploy(admin, "bench-m", "fake://m?step_ms=1", idle_timeout_s=600)
            redis = platform.redis()
            before_bytes = int(redis.info("memory")["used_memory"])
            uploaded = admin.post(
                "/v1/files",
                files={"file": ("bench.jsonl", _file(args.lines))},
                data={"purpose": "batch"},
                timeout=120,
            ).json()
            started = time.monotonic()
            created = admin.post(
                "/v1/batches",
                json={
                    "input_file_id": uploaded["id"],
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                },
                timeout=600,
            )
            answered_s = time.monotonic() - started
            batch = created.json()
            wait_until(
                lambda: _status(admin, batch["id"])["status"] != "validating",
                3600,
                "every line to be a job",
                poll_s=0.5,
            )
            queued_s = time.monotonic() - started
            queued_bytes = int(redis.info("memory")["used_memory"])
            result = {
                "lines": args.lines,
                "answer_s": round(answered_s, 3),
                "answer_status": batch["status"],
                "in_progress_after_s": round(queued_s, 1),
                "redis_bytes_before": before_bytes,
                "redis_bytes_queued": queued_bytes,
            }
            if not args.no_run:
                done = wait_until(
                    lambda: (
                        (b := _status(admin, batch["id"]))["status"]
                        in ("completed", "failed", "expired", "cancelled")
                        and b
                    ),
                    3600,
                    "the batch to settle",
                    poll_s=1.0,
                )
                result["settled"] = done["status"]
                result["settled_after_s"] = round(time.monotonic() - started, 1)
                result["redis_bytes_settled"] = int(redis.info("memory")["used_memory"])
            print(json.dumps(result, indent=2))
            save_results("batch_create", result)
    finally:
        platform.stop()


if __name__ == "__main__":
    main()
