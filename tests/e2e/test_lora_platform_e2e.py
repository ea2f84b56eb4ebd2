"""Two LoRA adapters of the default model through the real platform (`ebb up`, vLLM):
both answer through one base runner, which the first adapter request wakes from zero;
they are listed with their parent and billed on their own lines."""

from __future__ import annotations

import httpx
import msgspec
import openai
import pytest
from support import real_engine_platform
from support.lora import peft_adapters

from ebb.config import DEFAULT_MODEL_SOURCE
from ebb.queue import keys
from ebb.queue.schema import UsageRecord

pytestmark = pytest.mark.e2e

QUESTION = "What is the capital of France?"
BASE = "lora-base"


@pytest.fixture(scope="module")
def platform(default_local_model):
    with real_engine_platform("ebb-e2e-lora-") as p:
        yield p


@pytest.fixture(scope="module")
def made(default_local_model, tmp_path_factory):
    return peft_adapters(default_local_model.path, tmp_path_factory.mktemp("lora"), QUESTION)


def _deploy(admin: httpx.Client, body: dict) -> None:
    response = admin.post("/v1/deployments", json=body)
    assert response.status_code == 201, response.text


def _ask(client: openai.OpenAI, model: str) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=12,
        temperature=0,
    )


def test_two_adapters_answer_through_one_base_runner(platform, made):
    with platform.admin() as admin:
        engine = {"enable_lora": True, "max_loras": 2, "max_lora_rank": 16}
        _deploy(admin, {"name": BASE, "source": DEFAULT_MODEL_SOURCE, "engine": engine})
        for name, price in (("zero", 1_000_000), ("random", 2_000_000)):
            body = {"name": f"ad-{name}", "base": BASE, "source": str(made["root"] / name)}
            _deploy(admin, {**body, "price_per_1m_output_tokens_micros": price})
        # The base's weights are cached: the frontdoor checks the adapter's shapes.
        wide = {"name": "ad-wide", "base": BASE, "source": str(made["root"] / "wide")}
        refused = admin.post("/v1/deployments", json=wide)
        assert refused.status_code == 400 and "max_lora_rank 16" in refused.text
        client = openai.OpenAI(base_url=f"{platform.base_url}/v1", api_key=platform.admin_key)
        zero = _ask(client, "ad-zero")  # wakes the base from zero
        random = _ask(client, "ad-random")
        base = _ask(client, BASE)
        assert zero.choices[0].message.content == base.choices[0].message.content
        assert random.choices[0].message.content != base.choices[0].message.content
        parents = {m.id: getattr(m, "parent", None) for m in client.models.list()}
        assert parents["ad-zero"] == parents["ad-random"] == BASE
        runners = admin.get(f"/v1/deployments/{BASE}").json()["runners"]
        assert len(runners) == 1
    records = {
        r.request_id: r
        for r in (
            msgspec.json.decode(fields[b"r"], type=UsageRecord)
            for _, fields in platform.redis().xrange(keys.USAGE)
        )
    }
    served = [records[x.id] for x in (zero, random, base)]
    assert [(r.deployment, r.base) for r in served] == [
        ("ad-zero", BASE),
        ("ad-random", BASE),
        (BASE, ""),
    ]
    assert len({r.runner_id for r in served}) == 1
    assert served[1].price_per_1m_output_tokens_micros == 2_000_000
    assert served[1].completion_tokens == random.usage.completion_tokens
