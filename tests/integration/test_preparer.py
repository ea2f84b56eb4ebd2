"""The controller's preparer on a real Redis, with real `ebb prepare` processes: weights of
a local checkpoint become READY with their path and context length in every deployment of
the source, one process per source; a source that cannot be prepared shows FAILED with
the reason and is tried again only after its backoff; and the frontdoor's catalog reads
the tokenizer from what the preparer published, asking again when the files are gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
from support.weights import MotoS3, upload_dir, write_servable_dir

from ebb.coldstart.clock import ManualClock
from ebb.coldstart.preparer import RETRY_FIRST_S, Preparer
from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.errors import CapacityError, WeightsError
from ebb.frontdoor.catalog import ModelCatalog
from ebb.openai.tokenizer import HfPromptTokenizer
from ebb.queue.connection import async_client
from ebb.queue.platform import PlatformState
from ebb.queue.schema import DeploymentSpec
from ebb.queue.version_store import VersionStore
from ebb.queue.versions import VersionRecord
from ebb.queue.weights_status import WeightsState, WeightsStatus
from ebb.secrets import SecretBox, new_key

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(tmp_path, redis_url):
    return Settings(home=tmp_path / "home", redis_url=redis_url)


async def _deploy(state: PlatformState, name: str, source: str) -> DeploymentSpec:
    spec = DeploymentSpec(name=name, source=source, created_at_s=time.time())
    await state.put_deployment(spec)
    return spec


async def _weights(state: PlatformState, name: str) -> WeightsStatus:
    return WeightsStatus.of(await state.deployment_status(name))


async def _until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await condition()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def _settled(preparer: Preparer) -> None:
    """Passes until no preparation is under way."""
    await preparer.reconcile()
    await _until(_idle(preparer), 60, "the preparations to end")


def _idle(preparer: Preparer):
    async def idle() -> bool:
        await preparer.reconcile()
        return not preparer._running

    return idle


async def test_weights_become_ready_for_every_deployment_of_the_source(settings, tmp_path):
    checkpoint = write_servable_dir(tmp_path / "ckpt")
    state = PlatformState(async_client(settings.redis_url))
    preparer = Preparer(settings, state, EngineRegistry.from_settings(settings))
    try:
        await _deploy(state, "one", str(checkpoint))
        await _deploy(state, "two", str(checkpoint))
        await preparer.reconcile()
        assert list(preparer._running) == [str(checkpoint)]  # one process for the source
        assert (await _weights(state, "two")).state is WeightsState.PREPARING
        await _settled(preparer)

        for name in ("one", "two"):
            weights = await _weights(state, name)
            assert weights.state is WeightsState.READY, weights
            assert weights.max_model_len == 256 and weights.error == ""
            assert (tmp_path / "ckpt" / "config.json").read_bytes() == (
                (Path(weights.path) / "config.json").read_bytes()
            )
        # A later deployment of a prepared source is ready at once, without a process.
        await _deploy(state, "three", str(checkpoint))
        await preparer.reconcile()
        assert not preparer._running
        assert (await _weights(state, "three")).state is WeightsState.READY
    finally:
        await state.redis.aclose()


async def test_a_failed_source_says_why_and_waits_for_its_backoff(settings, tmp_path):
    clock = ManualClock()
    state = PlatformState(async_client(settings.redis_url))
    preparer = Preparer(settings, state, EngineRegistry.from_settings(settings), clock=clock)
    missing = tmp_path / "nowhere"
    try:
        await _deploy(state, "ghost", str(missing))
        await _settled(preparer)
        weights = await _weights(state, "ghost")
        assert weights.state is WeightsState.FAILED
        assert str(missing) in weights.error and weights.error_code.startswith("weights")

        # Within the backoff nothing is started again, even for a new deployment of it.
        await _deploy(state, "ghost2", str(missing))
        await preparer.reconcile()
        assert not preparer._running
        assert (await _weights(state, "ghost2")).state is WeightsState.FAILED

        # Past it, the source is tried again; the standing error is shown meanwhile.
        write_servable_dir(missing)
        clock.advance_to(RETRY_FIRST_S + 1)
        await preparer.reconcile()
        assert list(preparer._running) == [str(missing)]
        assert (await _weights(state, "ghost")).state is WeightsState.FAILED
        await _settled(preparer)
        assert (await _weights(state, "ghost")).state is WeightsState.READY
    finally:
        await state.redis.aclose()


async def test_the_catalog_waits_for_the_preparer_and_asks_again_for_gone_files(settings, tmp_path):
    checkpoint = write_servable_dir(tmp_path / "ckpt")
    state = PlatformState(async_client(settings.redis_url))
    preparer = Preparer(settings, state, EngineRegistry.from_settings(settings))
    catalog = ModelCatalog(state, EngineRegistry.from_settings(settings))
    try:
        spec = await _deploy(state, "m", str(checkpoint))
        with pytest.raises(CapacityError) as refused:
            await catalog.info(spec, wait_s=0.2)  # nobody prepares it yet
        assert refused.value.code == "weights_preparing"

        waiting = asyncio.create_task(catalog.info(spec, wait_s=60))
        await _settled(preparer)
        info = await waiting
        assert info.max_model_len == 256
        assert len(info.tokenizer.encode("the capital of france")) == 4

        # The cache evicted the files (the status names a path that is gone): a new
        # catalog (a restarted frontdoor) asks again, and the preparer answers.
        ready = await _weights(state, "m")
        gone = dataclasses.replace(ready, path=str(tmp_path / "evicted"))
        await state.set_deployment_status("m", **gone.fields())
        fresh = ModelCatalog(state, EngineRegistry.from_settings(settings))
        again = asyncio.create_task(fresh.info(spec, wait_s=60))
        await _until(
            lambda: _state_is(state, "m", WeightsState.PREPARING), 10, "a new preparation asked"
        )
        await _settled(preparer)
        assert (await again).max_model_len == 256
        assert (await _weights(state, "m")).path == ready.path
    finally:
        await state.redis.aclose()


async def test_a_warm_up_reads_the_tokenizer_once_the_weights_are_ready(
    settings, tmp_path, monkeypatch
):
    # What a deploy starts in the frontdoor, so that the first request finds the tokenizer
    # read (~0.1 s) instead of reading it before its cold start can begin.
    checkpoint = write_servable_dir(tmp_path / "ckpt")
    reads: list[str] = []
    read = HfPromptTokenizer.from_dir

    def counted(path, *args, **kwargs):
        reads.append(str(path))
        return read(path, *args, **kwargs)

    monkeypatch.setattr(HfPromptTokenizer, "from_dir", counted)
    state = PlatformState(async_client(settings.redis_url))
    preparer = Preparer(settings, state, EngineRegistry.from_settings(settings))
    catalog = ModelCatalog(state, EngineRegistry.from_settings(settings))
    try:
        spec = await _deploy(state, "m", str(checkpoint))
        catalog.warm(spec)  # nothing prepared yet: the warm-up waits for it
        await asyncio.sleep(0)
        assert reads == []
        await _settled(preparer)
        ready_path = (await _weights(state, "m")).path

        async def read_once() -> bool:
            return reads == [ready_path]

        await _until(read_once, 10, "the warm-up to read the tokenizer")
        info = await catalog.info(spec, wait_s=0)  # no wait, and no second read
        assert len(info.tokenizer.encode("the capital of france")) == 4
        assert reads == [ready_path]
    finally:
        await state.redis.aclose()


async def test_a_failed_preparation_is_the_requests_error(settings, tmp_path):
    state = PlatformState(async_client(settings.redis_url))
    preparer = Preparer(settings, state, EngineRegistry.from_settings(settings))
    catalog = ModelCatalog(state, EngineRegistry.from_settings(settings))
    try:
        spec = await _deploy(state, "ghost", str(tmp_path / "nowhere"))
        await _settled(preparer)
        with pytest.raises(WeightsError) as failed:
            await catalog.info(spec, wait_s=5)
        assert "nowhere" in failed.value.message
    finally:
        await state.redis.aclose()


# What the controller's environment holds under `ebb up`: none may reach a preparation.
PLATFORM_SECRETS = {
    "EBB_ADMIN_KEY": "admin-key-of-the-platform",
    "EBB_API_KEY": "api-key-of-the-cli",
    "EBB_METRICS_TOKEN": "metrics-token",
    "EBB_SECRETS_KEY": new_key(),
}


async def _keep_version_env(state: PlatformState, spec: DeploymentSpec, env, key: str) -> None:
    sealed = SecretBox(key).seal(env)
    record = VersionRecord(
        version=1,
        created_at_s=spec.created_at_s,
        spec=spec,
        env_names=sorted(env),
        env_sealed=sealed,
    )
    await VersionStore(state.redis).keep_first(record, spec.name)


def _probe_credentials(tmp_path: Path, monkeypatch) -> Path:
    """The operator's AWS config runs a credential_process: a program the preparation
    starts, inheriting its whole environment, which it writes to the returned file."""
    seen = tmp_path / "prepare-environ"
    probe = tmp_path / "credentials.sh"
    probe.write_text(
        f"#!/bin/sh\nenv -0 > {seen}\n"
        'echo \'{"Version": 1, "AccessKeyId": "testing", "SecretAccessKey": "testing"}\'\n'
    )
    probe.chmod(0o700)
    config = tmp_path / "aws-config"
    config.write_text(f"[default]\ncredential_process = {probe}\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    return seen


async def test_the_preparation_holds_no_platform_secret_and_only_the_versions_credentials(
    redis_url, tmp_path, monkeypatch
):
    s3 = MotoS3()
    try:
        s3.client().create_bucket(Bucket="probe")
        upload_dir(s3.client(), "probe", "m", write_servable_dir(tmp_path / "ckpt", mib=1))
        seen = _probe_credentials(tmp_path, monkeypatch)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.url)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for name, value in PLATFORM_SECRETS.items():
            monkeypatch.setenv(name, value)
        settings = Settings(home=tmp_path / "home", redis_url=redis_url)
        state = PlatformState(async_client(redis_url))
        preparer = Preparer(settings, state, EngineRegistry.from_settings(settings))
        try:
            spec = await _deploy(state, "probe", "s3://probe/m")
            tenant_env = {"HF_TOKEN": "hf_tenant", "APP_GREETING": "hello"}
            await _keep_version_env(state, spec, tenant_env, settings.secrets_key or "")
            await _settled(preparer)
            assert (await _weights(state, "probe")).state is WeightsState.READY
        finally:
            await state.redis.aclose()
    finally:
        s3.stop()
    environ = dict(entry.split("=", 1) for entry in seen.read_text().split("\0") if "=" in entry)
    assert not set(PLATFORM_SECRETS) & set(environ)
    assert "EBB_REDIS_URL" not in environ and redis_url not in environ.values()
    assert not {v for v in PLATFORM_SECRETS.values()} & set(environ.values())
    # Of the version's env, only the credential a fetch may need.
    assert environ["HF_TOKEN"] == "hf_tenant" and "APP_GREETING" not in environ
    assert environ["EBB_HOME"] == str(settings.home.resolve())


async def test_a_failures_message_never_quotes_a_credential_it_held(settings, tmp_path):
    key = new_key()
    settings = settings.model_copy(update={"secrets_key": key})
    state = PlatformState(async_client(settings.redis_url))
    preparer = Preparer(settings, state, EngineRegistry.from_settings(settings))
    token = "hf_tenant_token_1234"
    try:
        # A failure that quotes its input (the missing path) while the process held the
        # same string as a credential: the error its tenant reads shows it redacted.
        spec = await _deploy(state, "ghost", str(tmp_path / token))
        await _keep_version_env(state, spec, {"HF_TOKEN": token}, key)
        await _settled(preparer)
        weights = await _weights(state, "ghost")
        assert weights.state is WeightsState.FAILED and "[redacted]" in weights.error
        assert token not in weights.error
    finally:
        await state.redis.aclose()


async def _state_is(state: PlatformState, name: str, expected: WeightsState) -> bool:
    return (await _weights(state, name)).state is expected
