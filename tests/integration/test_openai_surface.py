"""The OpenAI surface beyond plain chat on the fake engine, through the official client:
vLLM's sampling extras, model facts, tool calling."""

from __future__ import annotations

import openai
import pytest
from support import Platform, deploy, temp_home

from ebb.queue import keys
from ebb.testing.fake_model import FAKE_REPLY

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    p = Platform(home=temp_home("ebb-it-oai-"), redis_url=None).start()
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def client(platform, admin):
    deploy(admin, "fake", source="fake://m?ctx=512", idle_timeout_s=60)
    return platform.openai()


def test_stop_token_ids_end_the_completion(client):
    reply = client.chat.completions.create(
        model="fake", messages=MESSAGES, max_tokens=40, extra_body={"stop_token_ids": [ord("P")]}
    )
    assert reply.choices[0].message.content == FAKE_REPLY[: FAKE_REPLY.index("P")]
    assert reply.choices[0].finish_reason == "stop"


def test_min_tokens_holds_stop_conditions_back(client):
    reply = client.completions.create(
        model="fake",
        prompt="x",
        max_tokens=40,
        extra_body={"stop_token_ids": [ord("P")], "min_tokens": 30, "top_k": 5, "min_p": 0.1},
    )
    assert reply.usage.completion_tokens == 40
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_k": -7}, "top_k"),
        ({"repetition_penalty": -1}, "repetition_penalty"),
        ({"logit_bias": {"9999": 1}}, "logit_bias"),
        ({"logit_bias": {"12": 500}}, "logit_bias.12"),
        ({"min_tokens": 50, "max_tokens": 10}, "min_tokens"),
        ({"length_penalty": 2.0}, "length_penalty"),
        ({"top_kay": 1}, "top_kay"),
    ],
)
def test_bad_extras_are_400_naming_the_parameter(client, platform_redis, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake", messages=MESSAGES, extra_body=extra)
    error = info.value.body
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param.split(".")[0] in error["message"]
    assert platform_redis.zcard(keys.queue("fake")) == 0
