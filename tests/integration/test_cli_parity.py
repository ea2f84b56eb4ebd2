"""CLI parity with the API (`ebb up` on the fake engine): every deployments field from
`ebb deploy` / `ebb scale` / `ebb price` / `ebb deployments share`, the whole configuration
in `ebb deployments show`, tenant quotas from `ebb tenants quota` and a tenant deploying
its own through the CLI, and `ebb jobs list` with its filters."""

from __future__ import annotations

import json
import subprocess

import pytest
from support import Platform

pytestmark = pytest.mark.integration

TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def ok_json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_deploy_takes_every_field_and_show_prints_them_all(platform: Platform, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    created = ok_json(
        platform.cli(
            "deploy",
            "full",
            "--source",
            "fake://full?ctx=1024",
            "--min",
            "0",
            "--max",
            "2",
            "--idle-timeout",
            "30",
            "--max-concurrency",
            "4",
            "--queue-depth-limit",
            "50",
            "--admission-timeout",
            "7.5",
            "--max-model-len",
            "512",
            "--dtype",
            "float32",
            "--max-num-seqs",
            "8",
            "--no-prefix-caching",
            "--enforce-eager",
            "--tensor-parallel-size",
            "1",
            "--gpu-memory-gib",
            "3",
            "--enable-lora",
            "--max-loras",
            "2",
            "--max-lora-rank",
            "8",
            "--max-cpu-loras",
            "4",
            "--tool-parser",
            "hermes",
            "--chat-template-file",
            str(template),
            "--task",
            "generate",
            "--batch-discount",
            "25",
            "--default-max-tokens",
            "100",
            "--max-tokens-limit",
            "200",
            "--max-request-s",
            "30",
            "--owner",
            "acme",
            "--input-price",
            "0.15",
            "--output-price",
            "0.6",
            "--gpu-second-price",
            "0.000278",
            "--visibility",
            "private",
            "--share-with",
            "beta",
            "--share-with",
            "gamma",
            "--json",
        )  # fmt: skip
    )
    assert {k: created[k] for k in ("max_replicas", "idle_timeout_s", "max_concurrency")} == {
        "max_replicas": 2,
        "idle_timeout_s": 30,
        "max_concurrency": 4,
    }
    assert (created["queue_depth_limit"], created["admission_timeout_s"]) == (50, 7.5)
    assert created["max_model_len"] == 512
    assert created["engine"] == {
        "dtype": "float32",
        "quantization": None,
        "max_num_seqs": 8,
        "tensor_parallel_size": 1,
        "enable_prefix_caching": False,
        "gpu_memory_gib": 3.0,
        "enforce_eager": True,
        "accelerator": None,
        "host_memory_gib": None,
        "enable_lora": True,
        "max_loras": 2,
        "max_lora_rank": 8,
        "max_cpu_loras": 4,
    }
    assert created["serving"] == {
        "tool_parser": "hermes",
        "chat_template": TEMPLATE,
        "task": "generate",
        "batch_discount_pct": 25,
        "default_max_tokens": 100,
        "max_tokens_limit": 200,
        "max_request_s": 30.0,
    }
    assert created["owner"] == "acme"
    assert (created["visibility"], created["shared_with"]) == ("private", ["beta", "gamma"])
    prices = [created[f"price_per_{p}_micros"] for p in ("1m_input_tokens", "1m_output_tokens")]
    assert prices == [150_000, 600_000] and created["price_per_gpu_second_micros"] == 278

    shown = platform.cli("deployments", "show", "full")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()

    def row(setting: str) -> str:
        # A table row: "│ setting │ value │".
        [line] = [line for line in lines if [c.strip() for c in line.split("│")[1:2]] == [setting]]
        return line

    for setting, value in [
        ("queue_depth_limit", "50"),
        ("admission_timeout_s", "7.5"),
        ("max_concurrency", "4"),
        ("max_model_len", "512"),
        ("owner", "acme"),
        ("visibility", "private"),
        ("shared_with", "beta, gamma"),
        # Money as currency, cents always shown, exact (the --json keeps the micros).
        ("price_per_1m_input_tokens_micros", "$0.15 "),
        ("price_per_1m_output_tokens_micros", "$0.60 "),
        ("price_per_gpu_second_micros", "$0.000278 "),
    ]:
        assert value in row(setting), (setting, row(setting))
    assert "dtype float32" in row("engine") and "max_num_seqs 8" in row("engine")
    serving = row("serving")
    assert f"chat_template <{len(TEMPLATE)} characters>" in serving
    assert "batch_discount_pct 25" in serving


def test_scale_price_and_share_change_the_rest(platform: Platform):
    ok_json(platform.cli("deploy", "tune", "--source", "fake://tune", "--json"))
    scaled = ok_json(
        platform.cli(
            "scale",
            "tune",
            "--max-concurrency",
            "2",
            "--queue-depth-limit",
            "9",
            "--admission-timeout",
            "3",
            "--max-model-len",
            "256",
            "--max-num-seqs",
            "4",
            "--tool-parser",
            "none",
            "--chat-template",
            TEMPLATE,
            "--json",
        )  # fmt: skip
    )
    assert (scaled["max_concurrency"], scaled["queue_depth_limit"]) == (2, 9)
    assert (scaled["admission_timeout_s"], scaled["max_model_len"]) == (3, 256)
    assert scaled["engine"]["max_num_seqs"] == 4
    assert (scaled["serving"]["tool_parser"], scaled["serving"]["chat_template"]) == (
        "none",
        TEMPLATE,
    )
    priced = platform.cli("price", "tune", "--batch-discount", "40", "--owner", "acme")
    assert priced.returncode == 0, priced.stderr
    assert "batch 40 % off" in priced.stdout and "billed to acme" in priced.stdout

    shared = platform.cli("deployments", "share", "tune", "--tenant", "beta", "--private")
    assert shared.returncode == 0 and "private; shared with beta" in shared.stdout
    public = ok_json(platform.cli("deployments", "share", "tune", "--public", "--json"))
    assert (public["visibility"], public["shared_with"]) == ("public", ["beta"])
    cleared = ok_json(platform.cli("deployments", "share", "tune", "--tenant", "", "--json"))
    assert cleared["shared_with"] == []


def test_a_tenant_deploys_its_own_within_the_quota_the_cli_set(platform: Platform):
    key = ok_json(platform.cli("keys", "create", "--tenant", "self-t", "--json"))["key"]
    quota = ok_json(
        platform.cli(
            "tenants",
            "quota",
            "self-t",
            "--max-deployments",
            "1",
            "--max-replicas",
            "2",
            "--max-gpus",
            "2",
            "--allow-source",
            "fake://self/",
            "--json",
        )  # fmt: skip
    )
    assert (quota["max_deployments"], quota["allowed_sources"]) == (1, ["fake://self/"])
    # Changing one field keeps the others.
    raised = ok_json(platform.cli("tenants", "quota", "self-t", "--max-replicas", "3", "--json"))
    assert (raised["max_replicas"], raised["max_gpus"], raised["max_deployments"]) == (3, 2, 1)

    mine = ok_json(
        platform.cli("deploy", "self-t-a", "--source", "fake://self/a", "--json", EBB_API_KEY=key)
    )
    assert (mine["owner"], mine["visibility"]) == ("self-t", "private")
    second = platform.cli("deploy", "self-t-b", "--source", "fake://self/b", EBB_API_KEY=key)
    assert second.returncode == 1
    assert "at most 1 deployments" in second.stderr and "--max-deployments" in second.stderr
    beyond = platform.cli("scale", "self-t-a", "--max", "3", EBB_API_KEY=key)
    assert beyond.returncode == 1 and "its quota is 2" in beyond.stderr
    priced = platform.cli("price", "self-t-a", "--input", "0", EBB_API_KEY=key)
    assert priced.returncode == 1 and "set by the admin" in priced.stderr

    table = platform.cli("tenants", "quota", "self-t", EBB_API_KEY=key)
    assert table.returncode == 0 and "fake://self/" in table.stdout
    # A 0 in a quota says it is none at all, not unlimited.
    bare = platform.cli("tenants", "quota", "bare-t", "--max-deployments", "1")
    assert bare.returncode == 0, bare.stderr
    [gpus] = [line for line in bare.stdout.splitlines() if "GPUs" in line]
    assert "0 (none)" in gpus, gpus
    listed = platform.cli("tenants")
    assert listed.returncode == 0 and "self-t" in listed.stdout
    limits = ok_json(platform.cli("tenants", "limits", "self-t", "--rpm", "30", "--json"))
    assert (limits["requests_per_minute"], limits["tokens_per_minute"]) == (30, None)
    assert platform.cli("deployments", "delete", "self-t-a", EBB_API_KEY=key).returncode == 0


def test_jobs_list_filters_like_keys_list(platform: Platform):
    for name in ("jobs-a", "jobs-b"):
        ok_json(platform.cli("deploy", name, "--source", "fake://j", "--json"))
    key = ok_json(platform.cli("keys", "create", "--tenant", "jobs-t", "--json"))["key"]
    ids = {}
    for name, env in (("jobs-a", {}), ("jobs-b", {}), ("jobs-a", {"EBB_API_KEY": key})):
        job = ok_json(
            platform.cli(
                "jobs",
                "submit",
                name,
                "--prompt",
                "Hi",
                "--max-tokens",
                "2",
                "--wait",
                "--json",
                **env,
            )  # fmt: skip
        )
        ids.setdefault(name, []).append(job["id"])
    only_a = ok_json(platform.cli("jobs", "list", "--model", "jobs-a", "--json"))
    assert [j["id"] for j in only_a["data"]] == ids["jobs-a"][:1]
    done = ok_json(platform.cli("jobs", "list", "--status", "succeeded", "--limit", "1", "--json"))
    assert [j["id"] for j in done["data"]] == ids["jobs-b"] and done["has_more"] is True
    page = ok_json(platform.cli("jobs", "list", "--after", done["last_id"], "--json"))
    assert [j["id"] for j in page["data"]] == ids["jobs-a"][:1]
    theirs = ok_json(platform.cli("jobs", "list", "--tenant", "jobs-t", "--json"))
    assert [j["id"] for j in theirs["data"]] == ids["jobs-a"][1:]
    table = platform.cli("jobs", "list", "--tenant", "jobs-t")
    assert table.returncode == 0 and ids["jobs-a"][1] in table.stdout
    assert "succeeded" in table.stdout
    refused = platform.cli("jobs", "list", "--tenant", "admin", EBB_API_KEY=key)
    assert refused.returncode == 1 and "its own jobs only" in refused.stderr

    # The admin reads and rotates a tenant's webhook secret; the tenant sees the new one.
    before = ok_json(platform.cli("jobs", "secret", "--json", EBB_API_KEY=key))["secret"]
    rotated = ok_json(platform.cli("jobs", "secret", "--rotate", "--tenant", "jobs-t", "--json"))
    assert rotated["tenant"] == "jobs-t" and rotated["secret"] != before
    after = ok_json(platform.cli("jobs", "secret", "--json", EBB_API_KEY=key))
    assert after["secret"] == rotated["secret"] and after["previous_secret_expires_at"]


def test_an_embeddings_job_from_the_cli(platform: Platform):
    ok_json(
        platform.cli(
            "deploy", "cli-embed", "--source", "fake://e?ctx=64", "--task", "embed", "--json"
        )
    )
    job = ok_json(
        platform.cli(
            "jobs", "submit", "cli-embed", "--prompt", "Paris", "--embeddings", "--wait", "--json"
        )
    )
    assert job["status"] == "succeeded" and job["endpoint"] == "embeddings"
    (item,) = job["result"]["data"]
    assert item["object"] == "embedding" and len(item["embedding"]) > 0
    shown = platform.cli("jobs", "show", job["id"])
    assert shown.returncode == 0 and f"{len(item['embedding'])} dimensions" in shown.stdout
    both = platform.cli("jobs", "submit", "cli-embed", "--prompt", "x", "--embeddings",
                        "--completions")  # fmt: skip
    assert both.returncode == 2 and "one of --completions and --embeddings" in both.stderr
