"""The engine registry: fake:// is a test engine, refused like any unknown scheme unless the
test switch is on; every other source is the weight cache's and vLLM's, for the frontdoor
and the runner alike."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from ebb.config import DEFAULT_MODEL_SOURCE, Settings
from ebb.engines import VLLM, EngineEntry, EngineRegistry, load_object
from ebb.errors import InvalidRequest
from ebb.frontdoor.app import create_app
from ebb.frontdoor.catalog import ModelCatalog
from ebb.frontdoor.services import build_services
from ebb.launching.tiers import Tier
from ebb.openai.tokenizer import ByteTokenizer
from ebb.queue.schema import DeploymentSpec
from ebb.testing.fake_engine import FakeEngine
from ebb.testing.fake_model import FAKE_ENTRY

ADMIN_KEY = "ebb-admin-unit"
ACCEPTED = ("gguf:<package>/<file.gguf>", "file:///abs/dir", "s3://bucket/prefix")


def registry(test_engines: bool) -> EngineRegistry:
    return EngineRegistry.from_settings(Settings(test_engines=test_engines))


def refusal(engines: EngineRegistry, source: str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        engines.validate(source)
    return info.value


def test_the_switch_is_off_unless_the_environment_turns_it_on(monkeypatch):
    monkeypatch.delenv("EBB_TEST_ENGINES", raising=False)
    assert Settings().test_engines is False
    monkeypatch.setenv("EBB_TEST_ENGINES", "1")
    assert Settings().test_engines is True


def test_fake_source_is_refused_like_any_unknown_scheme_when_the_switch_is_off():
    engines = registry(test_engines=False)
    assert engines.entry_for("fake://m?ctx=512") is VLLM
    fake, ftp = refusal(engines, "fake://m?ctx=512"), refusal(engines, "ftp://m")
    assert "unsupported model source scheme 'fake'" in fake.message
    assert fake.message.replace("fake", "ftp").replace("?ctx=512", "") == ftp.message
    assert (fake.status_code, fake.param) == (400, "source")
    assert all(form in fake.message for form in ACCEPTED)
    assert "fake://" not in fake.message.split("accepted model sources:")[1]


def test_fake_source_is_served_without_weights_when_the_switch_is_on():
    engines = registry(test_engines=True)
    entry = engines.validate("fake://m?ctx=512&step_ms=1")
    assert entry is FAKE_ENTRY and entry.prepares_weights is False
    assert engines.entry_for("FAKE://m") is FAKE_ENTRY
    assert isinstance(entry.make_tokenizer(), ByteTokenizer)
    assert entry.context_len_of("fake://m?ctx=512") == 512
    assert entry.context_len_of("fake://m") == 2048


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("fake://", "looks like fake://<name>"),
        ("fake:echo", "looks like fake://<name>"),
        ("fake://m?ctx=many", "invalid literal for int()"),
    ],
)
def test_malformed_fake_sources_say_what_a_fake_source_looks_like(source, says):
    error = refusal(registry(test_engines=True), source)
    assert says in error.message
    assert (error.status_code, error.param) == (400, "source")


@pytest.mark.parametrize("test_engines", [False, True])
def test_real_sources_are_the_weight_caches_and_vllms(test_engines):
    engines = registry(test_engines)
    assert engines.validate(DEFAULT_MODEL_SOURCE) is VLLM
    assert engines.entry_for("s3://bucket/model") is VLLM
    assert VLLM.prepares_weights and VLLM.tokenizer is None and VLLM.context_len is None
    assert "must name a file ending in .gguf" in refusal(engines, "gguf:pkg/m.bin").message


def test_every_path_an_entry_names_resolves_without_importing_vllm():
    # engine_vllm imports vLLM only inside its functions; the paths must still name them.
    code = (
        "import sys\n"
        "from ebb.engines import VLLM, load_object\n"
        "from ebb.runners import engine_vllm\n"
        "assert load_object(VLLM.engine) == engine_vllm.VllmEngine.load\n"
        "assert load_object(VLLM.preload) is engine_vllm.preload\n"
        "load_object(VLLM.validate)\n"
        "print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert load_object(FAKE_ENTRY.engine) == FakeEngine.load


def test_resolving_sources_in_the_frontdoor_imports_no_runner_module():
    code = (
        "import sys\n"
        "from ebb.config import Settings\n"
        "from ebb.engines import EngineRegistry\n"
        "import ebb.frontdoor.app\n"
        "engines = EngineRegistry.from_settings(Settings(test_engines=True))\n"
        "entry = engines.validate('fake://m?ctx=64')\n"
        "entry.make_tokenizer(), entry.context_len_of('fake://m?ctx=64')\n"
        "engines.validate('gguf:pkg/m.gguf')\n"
        "print(sorted(m for m in sys.modules if m.startswith(('ebb.runners', 'vllm'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_entry_brings_its_own_tokenizer_exactly_when_it_prepares_no_weights():
    with pytest.raises(ValueError, match="exactly when it prepares no weights"):
        EngineEntry(name="x", schemes=("x",), validate="m:v", engine="m:e", tokenizer="m:t")
    with pytest.raises(ValueError, match="exactly when it prepares no weights"):
        EngineEntry(name="x", schemes=("x",), validate="m:v", engine="m:e", prepares_weights=False)
    with pytest.raises(ValueError, match="two engine entries claim the scheme 'fake'"):
        EngineRegistry([FAKE_ENTRY, FAKE_ENTRY])


def deployments_api(tmp_path, test_engines: bool) -> TestClient:
    # Services without the lifespan: a create that is refused never reaches Redis.
    settings = Settings(
        home=tmp_path,
        admin_key=ADMIN_KEY,
        redis_url="redis://127.0.0.1:1",
        test_engines=test_engines,
    )
    app = create_app(settings)
    app.state.services = build_services(settings)
    return TestClient(app, headers={"Authorization": f"Bearer {ADMIN_KEY}"})


def test_the_api_refuses_a_fake_deployment_with_a_400_when_the_switch_is_off(tmp_path):
    api = deployments_api(tmp_path, test_engines=False)
    response = api.post("/v1/deployments", json={"name": "m", "source": "fake://m"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "source" and error["type"] == "invalid_request_error"
    assert "unsupported model source scheme 'fake'" in error["message"]


def test_the_api_checks_fake_sources_through_the_registry_when_the_switch_is_on(tmp_path):
    api = deployments_api(tmp_path, test_engines=True)
    response = api.post("/v1/deployments", json={"name": "m", "source": "fake://m?ctx=x"})
    assert response.status_code == 400
    assert "a fake model source looks like fake://" in response.json()["error"]["message"]


async def test_the_catalog_takes_a_fake_models_tokenizer_and_context_from_the_registry():
    # A source without weights never reads the platform state (None) for weights.
    catalog = ModelCatalog(None, engines=registry(test_engines=True))
    info = await catalog.info(DeploymentSpec(name="m", source="fake://m?ctx=300"), wait_s=5)
    assert isinstance(info.tokenizer, ByteTokenizer) and info.max_model_len == 300


def test_the_runner_builds_the_engine_its_registry_entry_names():
    from ebb.runners.cold_start_clock import ColdStartClock
    from ebb.runners.loading import load_engine

    spec = DeploymentSpec(name="m", source="fake://m?ctx=300&step_ms=0")
    clock = ColdStartClock(0.0)
    engine, tier = load_engine(Settings(test_engines=True), spec, clock, Tier.FORKED)
    assert isinstance(engine, FakeEngine) and engine.model.max_model_len == 300
    assert tier is Tier.FORKED and set(clock.phases_ms) == {"weights"}
