"""`ebb deploy` and `ebb scale` offer one option set: the same flags, help and validation,
sent as the same request-body fields (no platform: the API client is replaced)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from ebb.cli import deployment_options as opts
from ebb.cli import deployments
from ebb.cli.main import app
from ebb.frontdoor.routes_deployments import DeploymentCreate, EngineBody, ServingBody

TEMPLATE = "{{ messages[0]['content'] }}"


class RecordingApi:
    """Stands in for the CLI's API client: records each call's body, answers with it."""

    bodies: list[dict[str, Any]]

    def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        RecordingApi.bodies.append(kwargs["json"])
        return {"status": "ready", **kwargs["json"]}


@pytest.fixture
def bodies(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    RecordingApi.bodies = []
    monkeypatch.setattr(deployments, "Api", RecordingApi)
    return RecordingApi.bodies


def _params(command: str) -> dict[str, Any]:
    """The command's parameters as typer builds them, by name."""
    group = typer.main.get_command(app)
    return {p.name: p for p in group.commands[command].params}  # type: ignore[attr-defined]


def _described(param: Any) -> dict[str, object]:
    """What a user sees and what validates: flags, help, type, bounds, default, ..."""
    described = {k: v for k, v in vars(param).items() if k != "type_descriptor"}
    described["annotation"] = param.type_descriptor.annotation
    return described


def test_deploy_and_scale_expose_the_same_shared_options() -> None:
    deploy, scale = _params("deploy"), _params("scale")
    shared = [o.param for o in opts.SETTINGS]
    assert set(scale) == {"name", "as_json", *shared}
    assert set(shared) <= set(deploy)
    for name in shared:
        assert _described(scale[name]) == _described(deploy[name]), name
    assert (scale["min_replicas"].opts, scale["min_replicas"].min) == (["--min"], 0)


def _every_shared_option(template: Path) -> list[str]:
    return [
        "--min", "1", "--max", "3", "--idle-timeout", "30", "--max-concurrency", "4",
        "--queue-depth-limit", "50", "--admission-timeout", "7.5", "--max-model-len", "512",
        "--dtype", "float32", "--quantization", "awq", "--max-num-seqs", "8", "--tp", "2",
        "--no-prefix-caching", "--gpu-memory-gib", "3", "--cuda-graphs",
        "--tool-parser", "hermes", "--chat-template-file", str(template), "--task", "embed",
    ]  # fmt: skip


def test_deploy_and_scale_send_the_shared_options_as_the_same_fields(
    bodies: list[dict[str, Any]], tmp_path: Path
) -> None:
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    args = _every_shared_option(template)
    runner = CliRunner()
    deployed = runner.invoke(app, ["deploy", "m", "--source", "fake://m", "--no-wait", *args])
    assert deployed.exit_code == 0, deployed.output
    scaled = runner.invoke(app, ["scale", "m", *args, "--json"])
    assert scaled.exit_code == 0, scaled.output
    deploy_body, scale_body = bodies
    assert deploy_body == {"name": "m", "source": "fake://m", **scale_body}
    assert scale_body == {
        "min_replicas": 1,
        "max_replicas": 3,
        "idle_timeout_s": 30.0,
        "max_concurrency": 4,
        "queue_depth_limit": 50,
        "admission_timeout_s": 7.5,
        "max_model_len": 512,
        "engine": {
            "dtype": "float32",
            "quantization": "awq",
            "max_num_seqs": 8,
            "tensor_parallel_size": 2,
            "enable_prefix_caching": False,
            "gpu_memory_gib": 3.0,
            "enforce_eager": False,
        },
        "serving": {"tool_parser": "hermes", "chat_template": TEMPLATE, "task": "embed"},
    }
    assert json.loads(scaled.output) == {"status": "ready", **scale_body}


def test_unset_options_stay_out_of_the_body(bodies: list[dict[str, Any]]) -> None:
    result = CliRunner().invoke(app, ["deploy", "m", "--source", "fake://m", "--no-wait"])
    assert result.exit_code == 0, result.output
    assert bodies == [{"name": "m", "source": "fake://m"}]
    nothing = CliRunner().invoke(app, ["scale", "m"])
    assert nothing.exit_code == 2 and "nothing to change" in nothing.output
    assert len(bodies) == 1


def test_deploy_sends_the_admins_options_as_their_fields(bodies: list[dict[str, Any]]) -> None:
    given = [
        ("--batch-discount", "25"),
        ("--owner", "acme"),
        ("--input-price", "0.15"),
        ("--output-price", "0.6"),
        ("--gpu-second-price", "0.000278"),
        ("--visibility", "private"),
        ("--share-with", "beta"),
        ("--share-with", "gamma"),
        ("--task", "generate"),
    ]
    args = [word for pair in given for word in pair]
    result = CliRunner().invoke(app, ["deploy", "m", "--source", "fake://m", "--no-wait", *args])
    assert result.exit_code == 0, result.output
    assert bodies == [
        {
            "name": "m",
            "source": "fake://m",
            "owner": "acme",
            "price_per_1m_input_tokens_micros": 150_000,
            "price_per_1m_output_tokens_micros": 600_000,
            "price_per_gpu_second_micros": 278,
            "visibility": "private",
            "shared_with": ["beta", "gamma"],
            "serving": {"task": "generate", "batch_discount_pct": 25},
        }
    ]


@pytest.mark.parametrize("command", [["deploy", "m", "--source", "fake://m"], ["scale", "m"]])
def test_usage_errors_name_the_options(
    command: list[str], bodies: list[dict[str, Any]], tmp_path: Path
) -> None:
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    both = CliRunner().invoke(
        app, [*command, "--chat-template", "x", "--chat-template-file", str(template)]
    )
    assert both.exit_code == 2
    assert "give --chat-template or --chat-template-file, not both" in both.output
    assert bodies == []


def test_a_bad_price_is_a_usage_error(bodies: list[dict[str, Any]]) -> None:
    bad = CliRunner().invoke(app, ["deploy", "m", "--source", "fake://m", "--input-price", "x"])
    assert bad.exit_code == 2 and "--input-price" in bad.output
    assert bodies == []


def test_scaling_is_sent_as_the_json_object_given(bodies: list[dict[str, Any]]) -> None:
    block = '{"policy": "utilisation", "keep_alive": "learned"}'
    ok = CliRunner().invoke(
        app, ["deploy", "m", "--source", "fake://m", "--no-wait", "--scaling", block]
    )
    assert ok.exit_code == 0, ok.output
    assert bodies[0]["scaling"] == {"policy": "utilisation", "keep_alive": "learned"}
    bad = CliRunner().invoke(app, ["deploy", "n", "--source", "fake://m", "--scaling", "slo"])
    assert bad.exit_code == 2 and "--scaling is not JSON" in bad.output


def test_every_field_of_the_deployments_api_has_an_option() -> None:
    """A field added to POST /v1/deployments without an option fails here (name, source
    and env are `ebb deploy`'s own parameters)."""
    options = (*opts.SETTINGS, *opts.ADMIN, *opts.ADAPTER)
    top = {o.field for o in options if not o.section}
    assert top | {"name", "source", "env"} == set(DeploymentCreate.model_fields) - {
        "engine",
        "serving",
    }
    assert {o.field for o in options if o.section == "engine"} == set(EngineBody.model_fields)
    assert {o.field for o in options if o.section == "serving"} == set(ServingBody.model_fields)
