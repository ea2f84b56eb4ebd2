"""LoRA adapter deployments through the whole platform (`ebb up`, fake engine): two
adapters answer through one base runner, listed with their parent and billed on their
own lines; bad adapters are refused at deploy saying what to change."""

from __future__ import annotations

import json
import os

import pytest
from support import wait_until
from support.billing import (
    deploy,
    ledger_caught_up,
    new_key,
    raw_usage,
    tenant_client,
    usage_total,
)
from support.lora import write_adapter, write_raw_safetensors
from support.metrics import scrape

pytestmark = pytest.mark.integration

BASE = "lora-base"
LORA_ON = {"engine": {"enable_lora": True, "max_loras": 2}}


def _complete(admin, model: str, max_tokens: int = 12) -> dict:
    body = {"model": model, "prompt": "Hi", "max_tokens": max_tokens, "temperature": 0}
    response = admin.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def adapters(platform, admin, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    deploy(admin, BASE, "fake://lb?ctx=1024", idle_timeout_s=600, **LORA_ON)
    prices = {"price_per_1m_input_tokens_micros": 7_000_000}
    for name, rank in (("ad-one", 8), ("ad-two", 16)):
        src = str(write_adapter(root / name, rank=rank))
        deploy(admin, name, src, base=BASE, **prices)
        prices = {"price_per_1m_input_tokens_micros": 9_000_000}
    return root


def test_two_adapters_answer_through_one_base_runner(admin, platform_redis, adapters):
    # The base is at zero: the adapter's request wakes it.
    one = _complete(admin, "ad-one")
    two = _complete(admin, "ad-two")
    base = _complete(admin, BASE)
    assert one["choices"][0]["text"].startswith("[ad-one] ")
    assert two["choices"][0]["text"].startswith("[ad-two] ")
    assert not base["choices"][0]["text"].startswith("[")
    assert one["model"] == "ad-one"
    records = {r.request_id: r for r in raw_usage(platform_redis)}
    served = [records[x["id"]] for x in (one, two, base)]
    assert {r.runner_id for r in served} == {served[0].runner_id}, "one base runner"
    assert [(r.deployment, r.base) for r in served] == [
        ("ad-one", BASE),
        ("ad-two", BASE),
        (BASE, ""),
    ]
    runners = admin.get(f"/v1/deployments/{BASE}").json()["runners"]
    assert len(runners) == 1
    for name in ("ad-one", "ad-two"):  # nothing of their own: no runners, no preparation
        view = admin.get(f"/v1/deployments/{name}").json()
        assert view["runners"] == [] and view["weights"] == "unknown", view


def test_adapters_are_listed_with_their_parent(admin, adapters):
    models = {m["id"]: m for m in admin.get("/v1/models").json()["data"]}
    assert models["ad-one"]["parent"] == BASE and models["ad-two"]["parent"] == BASE
    assert models[BASE]["parent"] is None
    assert admin.get("/v1/models/ad-one").json()["parent"] == BASE


def test_adapters_are_billed_on_their_own_lines_at_their_own_prices(
    admin, platform_redis, adapters
):
    _complete(admin, "ad-one")
    wait_until(lambda: ledger_caught_up(platform_redis), 20, "the ledger to fold the usage")
    rows = {r["deployment"]: r for r in usage_total(admin, group_by="deployment")["data"]}
    one, two = rows["ad-one"], rows["ad-two"]
    assert one["prompt_tokens"] and two["prompt_tokens"]
    assert one["token_cost_micros"] == one["prompt_tokens"] * 7
    assert two["token_cost_micros"] == two["prompt_tokens"] * 9


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"base": "no-such-base"}, "base", "no deployment 'no-such-base'"),
        ({"base": "lora-off"}, "base", "engine.enable_lora=true"),
        ({"base": BASE, "adapter": {"rank": 64}}, "source", "max_lora_rank 16"),
        (
            {"base": BASE, "adapter": {"targets": ("lm_head",)}},
            "source",
            "module(s) the engine cannot serve",
        ),
        ({"base": BASE, "adapter": None}, "source", "no adapter_config.json"),
        ({"base": BASE, "source": "gguf:x/y.gguf"}, "source", "directory peft"),
    ],
)
def test_a_bad_adapter_is_refused_at_deploy_saying_what_to_change(
    admin, adapters, tmp_path, fields, param, says
):
    if admin.get("/v1/deployments/lora-off").status_code == 404:
        deploy(admin, "lora-off", "fake://off")
    fields = dict(fields)
    shape = fields.pop("adapter", {})
    source = tmp_path / "bad"
    source.mkdir()
    if shape is not None:
        write_adapter(source, **shape)
    body = {"name": "ad-bad", "source": str(source), **fields}
    response = admin.post("/v1/deployments", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"], error


def _records_of(platform_redis, deployment: str, request_id: str) -> list:
    return [
        r
        for r in raw_usage(platform_redis)
        if r.deployment == deployment and r.request_id.startswith(request_id)
    ]


def test_a_job_for_an_adapter_runs_on_its_base_billed_as_the_adapter(
    admin, platform_redis, adapters
):
    body = {
        "model": "ad-one",
        "endpoint": "completions",
        "body": {"prompt": "Hi", "max_tokens": 12},
    }
    response = admin.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]

    def done() -> dict | None:
        view = admin.get(f"/v1/jobs/{job_id}").json()
        return view if view["status"] in ("succeeded", "failed", "expired") else None

    job = wait_until(done, 60, f"job {job_id} to settle")
    assert job["status"] == "succeeded", job
    assert job["model"] == "ad-one"
    assert job["result"]["choices"][0]["text"].startswith("[ad-one] ")
    records = wait_until(
        lambda: _records_of(platform_redis, "ad-one", job_id), 20, "the job's usage record"
    )
    assert [(r.base, r.price_per_1m_input_tokens_micros) for r in records] == [(BASE, 7_000_000)]
    listed = admin.get("/v1/jobs", params={"model": "ad-one"}).json()["data"]
    assert job_id in {j["id"] for j in listed}


def test_a_batch_line_for_an_adapter_runs_as_the_adapter_at_its_discount(
    admin, platform_redis, adapters
):
    source = str(write_adapter(adapters / "batched"))
    serving = {"batch_discount_pct": 50}
    deploy(admin, "ad-batch", source, base=BASE, serving=serving,
           price_per_1m_input_tokens_micros=8_000_000)  # fmt: skip
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "ad-batch", "prompt": "Hi", "max_tokens": 12},
    }
    uploaded = admin.post(
        "/v1/files",
        files={"file": ("in.jsonl", json.dumps(line).encode() + b"\n")},
        data={"purpose": "batch"},
    )
    assert uploaded.status_code == 200, uploaded.text
    body = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/completions",
            "completion_window": "24h"}  # fmt: skip
    created = admin.post("/v1/batches", json=body)
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]

    def settled() -> dict | None:
        batch = admin.get(f"/v1/batches/{batch_id}").json()
        return batch if batch["status"] in ("completed", "failed", "expired") else None

    batch = wait_until(settled, 60, f"batch {batch_id} to settle")
    assert batch["status"] == "completed" and batch["request_counts"]["failed"] == 0, batch
    output = admin.get(f"/v1/files/{batch['output_file_id']}/content").text
    answer = json.loads(output.splitlines()[0])["response"]["body"]
    assert answer["choices"][0]["text"].startswith("[ad-batch] ")
    records = wait_until(
        lambda: _records_of(platform_redis, "ad-batch", ""), 20, "the line's usage record"
    )
    assert [(r.base, r.price_per_1m_input_tokens_micros) for r in records] == [(BASE, 4_000_000)]


def test_tokenize_on_an_adapter_uses_its_bases_tokenizer(admin, adapters):
    for path, field in (("/tokenize", "prompt"), ("/detokenize", "tokens")):
        value = "Hello there" if field == "prompt" else [1, 2, 3]
        answers = []
        for model in ("ad-one", BASE):
            response = admin.post(path, json={"model": model, field: value})
            assert response.status_code == 200, response.text
            answers.append(response.json())
        assert answers[0] == answers[1]


def test_ebb_deploy_makes_an_adapter_deployment(platform, admin, adapters):
    source = write_adapter(adapters / "from-cli")
    done = platform.cli("deploy", "ad-cli", "--base", BASE, "--source", str(source))
    assert done.returncode == 0, done.stderr
    view = admin.get("/v1/deployments/ad-cli").json()
    assert view["base"] == BASE and view["source"] == str(source)
    assert _complete(admin, "ad-cli")["choices"][0]["text"].startswith("[ad-cli] ")


def test_a_new_version_cannot_make_or_change_an_adapter_unchecked(admin, adapters, tmp_path):
    wide = str(write_adapter(tmp_path / "wide", rank=64))
    for name, param in (("ad-one", "source"), (BASE, "base")):
        body = {"name": name, "source": wide, "base": BASE}
        response = admin.post("/v1/deployments", json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param
    assert admin.get("/v1/deployments/ad-one").json()["source"] != wide


def test_cold_loads_are_counted_per_adapter_on_metrics(admin, adapters):
    _complete(admin, "ad-two")
    loads = scrape(admin).value("ebb_adapter_loads_total", deployment="ad-two", base=BASE)
    assert loads == 1  # loaded once, then kept by the runner (LRU)


def test_an_adapter_broken_after_deploy_fails_its_request_and_shows_failing(
    admin, adapters, tmp_path
):
    source = write_adapter(tmp_path / "breaks")
    deploy(admin, "ad-breaks", str(source), base=BASE)
    (source / "adapter_model.safetensors").unlink()
    body = {"model": "ad-breaks", "prompt": "Hi", "max_tokens": 2}
    response = admin.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    assert "no adapter_model.safetensors" in response.json()["error"]["message"]
    view = admin.get("/v1/deployments/ad-breaks").json()
    assert view["status"] == "failing" and "adapter_model.safetensors" in view["error"]
    write_adapter(source)  # fixed: the next request loads it, and the status clears
    assert _complete(admin, "ad-breaks")["choices"][0]["text"].startswith("[ad-breaks] ")
    view = admin.get("/v1/deployments/ad-breaks").json()
    assert view["status"] != "failing" and view["error"] is None


def test_a_tenants_adapter_path_is_checked_against_its_prefixes_before_it_is_read(
    platform, admin, adapters
):
    tenant = tenant_client(platform, new_key(admin, "lora-t"))
    body = {"name": "lora-t-probe", "base": BASE, "source": "/etc"}
    response = tenant.post("/v1/deployments", json=body)
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["param"] == "source" and "may not deploy from any source" in error["message"]


def test_a_tenants_adapter_files_must_be_regular_files_reached_without_links(
    platform, admin, adapters, tmp_path
):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    quota = {"max_deployments": 2, "max_replicas": 2, "max_gpus": 2,
             "allowed_sources": [f"{allowed}/"]}  # fmt: skip
    assert admin.put("/v1/tenants/lora-f/quota", json=quota).status_code == 200
    # A FIFO held the frontdoor's event loop until written to: the deploy must answer
    # (the client's timeout fails the test otherwise) and /healthz with it.
    tenant = tenant_client(platform, new_key(admin, "lora-f"))
    outside = write_adapter(tmp_path / "outside")
    (allowed / "link").symlink_to(outside)  # under the prefix, naming a directory outside
    fifo = write_adapter(allowed / "fifo")
    (fifo / "adapter_config.json").unlink()
    os.mkfifo(fifo / "adapter_config.json")
    zero = write_adapter(allowed / "zero")
    (zero / "adapter_model.safetensors").unlink()
    (zero / "adapter_model.safetensors").symlink_to("/dev/zero")
    shape = write_adapter(allowed / "shape")
    weight = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    header = json.dumps({weight: {"dtype": "F32", "shape": ["x", 8], "data_offsets": [0, 4]}})
    write_raw_safetensors(shape / "adapter_model.safetensors", header.encode())
    for source, says in (
        (allowed / "link", "without symbolic links"),
        (fifo, "adapter_config.json is not a regular file"),
        (zero, "adapter_model.safetensors is not a regular file"),
        (shape, "shape is not a matrix"),
    ):
        body = {"name": "lora-f-probe", "base": BASE, "source": str(source)}
        response = tenant.post("/v1/deployments", json=body, timeout=30)
        assert response.status_code == 400, (source, response.text)
        error = response.json()["error"]
        assert error["param"] == "source" and says in error["message"], error
    assert admin.get("/healthz", timeout=5).status_code == 200
