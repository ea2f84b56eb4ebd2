"""Admission's reads against a real redis-server: how many round trips routing a request
costs, and that a deployment gone at any point of them is the model's 404."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
import redis
import redis.asyncio as aioredis

from ebb.errors import NotFound
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.version_routing import ROUTE_KEY_HEADER, routed, version_of
from ebb.queue import keys
from ebb.queue.admission_reads import AdmissionReads
from ebb.queue.connection import (
    SHORT_CLIENT_NAME,
    SHORT_POOL_MAX,
    async_client,
    short_command_client,
)
from ebb.queue.platform import PlatformState
from ebb.queue.schema import DeploymentSpec
from ebb.queue.version_store import VersionStore
from ebb.queue.versions import TrafficSplit, VersionRecord, unit_name

pytestmark = pytest.mark.integration

ADMIN = Caller(tenant="admin", key_id="k-admin", is_admin=True)
OTHER = Caller(tenant="other", key_id="k-other", is_admin=False)


class CountingConnection(aioredis.Connection):
    """A connection that counts round trips: everything one send puts on the wire (a
    command, or a whole pipeline) before its replies are read. `before_send` runs first,
    with the count so far, so that a test can change Redis between two round trips."""

    sends = 0
    before_send: Callable[[int], Awaitable[None]] | None = None
    # Runs (blocking the loop) when a reply is about to be read: its command was sent.
    on_reply: Callable[[], None] | None = None

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        hook = CountingConnection.before_send
        if hook is not None:
            await hook(CountingConnection.sends)
        CountingConnection.sends += 1
        await super().send_packed_command(command, check_health)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        hook, CountingConnection.on_reply = CountingConnection.on_reply, None
        if hook is not None:
            hook()
        return await super().read_response(*args, **kwargs)


@pytest.fixture
async def counted(redis_url):
    pool = aioredis.ConnectionPool.from_url(redis_url, connection_class=CountingConnection)
    client = aioredis.Redis(connection_pool=pool)
    await client.ping()  # connects (and says hello) before anything is counted
    CountingConnection.sends, CountingConnection.before_send = 0, None
    yield PlatformState(client)
    CountingConnection.before_send = CountingConnection.on_reply = None
    await client.aclose()


@pytest.fixture
async def setup(redis_url):
    """A separate, uncounted client that writes what the tests read."""
    client = async_client(redis_url)
    yield PlatformState(client)
    await client.aclose()


def round_trips() -> int:
    return CountingConnection.sends


async def deploy(state: PlatformState, name: str, **fields: Any) -> DeploymentSpec:
    spec = DeploymentSpec(name=name, source="fake://m", **fields)
    await state.put_deployment(spec)
    return spec


async def add_version_2(state: PlatformState, name: str, *, share_pct: int) -> None:
    """Version 2 with `share_pct` of the traffic (version 1 has the rest)."""
    store = VersionStore(state.redis)
    v2 = DeploymentSpec(name=name, source="fake://m?ctx=64")
    await store.add(
        name, lambda n: VersionRecord(version=n, created_at_s=1.0, spec=v2), max_versions=10
    )
    weights = {1: 100 - share_pct, 2: share_pct}
    await store.update_split(name, lambda _: TrafficSplit(weights=weights))


async def test_version_1_is_routed_with_its_status_and_depth_in_one_round_trip(counted, setup):
    await deploy(setup, "chat")
    await setup.set_deployment_status("chat", error="no weights")
    await setup.redis.zadd(keys.queue("chat"), {"r1": 1, "r2": 2})

    route = await routed(counted, ADMIN, "chat")

    assert round_trips() == 1
    assert route.spec.name == "chat" and version_of(route.spec) == 1
    assert route.status == {"error": "no weights"} and route.depth == 2


async def test_a_split_to_version_2_takes_a_second_round_trip(counted, setup):
    await deploy(setup, "canary")
    await add_version_2(setup, "canary", share_pct=100)
    await setup.redis.zadd(keys.queue(unit_name("canary", 2)), {"r1": 1})

    route = await routed(counted, ADMIN, "canary", {ROUTE_KEY_HEADER: "user-1"})

    assert round_trips() == 2
    assert route.spec.name == unit_name("canary", 2) and route.spec.source == "fake://m?ctx=64"
    assert route.status == {} and route.depth == 1


async def test_a_missing_deployment_is_the_models_404_after_one_round_trip(counted):
    with pytest.raises(NotFound) as missing:
        await routed(counted, ADMIN, "nope")
    assert round_trips() == 1
    assert missing.value.code == "model_not_found" and missing.value.param == "model"


async def test_a_deployment_the_caller_may_not_see_is_the_same_404(counted, setup):
    await deploy(setup, "theirs", owner="someone", visibility="private")
    with pytest.raises(NotFound) as hidden:
        await routed(counted, OTHER, "theirs")
    assert round_trips() == 1
    assert hidden.value.code == "model_not_found"
    assert (await routed(counted, ADMIN, "theirs")).spec.name == "theirs"


@pytest.mark.parametrize("gone", ["deployment", "version"])
async def test_deleted_between_the_two_reads_is_the_404(counted, setup, gone):
    await deploy(setup, "going")
    await add_version_2(setup, "going", share_pct=100)

    async def delete_after_the_first_read(sent: int) -> None:
        if sent != 1:
            return
        if gone == "deployment":
            await setup.delete_deployment("going")
        else:
            await setup.redis.hdel(keys.deployment_versions("going"), "2")

    CountingConnection.before_send = delete_after_the_first_read
    with pytest.raises(NotFound) as deleted:
        await routed(counted, ADMIN, "going")
    assert round_trips() == 2
    assert deleted.value.code == "model_not_found" and deleted.value.param == "model"


async def test_version_1_reads_compose_the_stored_version(counted, setup):
    # A deployment whose version 1 was kept (its first redeploy) serves with that record.
    await deploy(setup, "kept")
    first = DeploymentSpec(name="kept", source="fake://m?ctx=32")
    await VersionStore(setup.redis).keep_first(
        VersionRecord(version=1, created_at_s=1.0, spec=first), "kept"
    )
    read = await AdmissionReads(counted.redis).deployment("kept")
    assert round_trips() == 1
    assert read.spec is not None and read.spec.source == "fake://m?ctx=32"
    assert read.split.weights == {1: 100}


async def test_requests_for_one_deployment_arriving_together_share_one_round_trip(counted, setup):
    await deploy(setup, "chat")
    await setup.redis.zadd(keys.queue("chat"), {"r1": 1})

    burst = await asyncio.gather(*(routed(counted, ADMIN, "chat") for _ in range(100)))

    assert round_trips() == 1
    assert all(route.spec.name == "chat" and route.depth == 1 for route in burst)


async def test_a_request_arriving_after_the_read_was_sent_reads_again(counted, redis_url):
    # The first request's read is on its way when the deployment is created and a second
    # request arrives: the second must not share the first's (older) answer.
    second: list[asyncio.Task] = []

    def create_then_request() -> None:
        with redis.Redis.from_url(redis_url) as blocking:
            spec = DeploymentSpec(name="fresh", source="fake://m")
            blocking.hset(keys.DEPLOYMENTS, "fresh", msgspec.json.encode(spec))
        # Runs on the loop's next turn, before the first read's reply is taken.
        second.append(asyncio.create_task(routed(counted, ADMIN, "fresh")))

    CountingConnection.on_reply = create_then_request
    with pytest.raises(NotFound):
        await routed(counted, ADMIN, "fresh")
    route = await second[0]
    assert route.spec.name == "fresh"


async def test_a_burst_of_admission_reads_shares_a_bounded_pool(redis_url, setup):
    # Each read holds a connection only for its round trip: a burst waits a moment for one
    # of a few instead of opening a connection per request (each a connect and handshake).
    await setup.put_deployment(DeploymentSpec(name="busy", source="fake://m"))
    client = short_command_client(redis_url)
    try:
        reads = AdmissionReads(client)
        # 200 deployments: reads of one deployment would share a round trip (below).
        names = ["busy", *(f"other-{i}" for i in range(199))]
        burst = await asyncio.gather(*(reads.deployment(name) for name in names))
        assert burst[0].spec is not None and burst[0].spec.name == "busy"
        assert all(read.spec is None for read in burst[1:])
        names = [c["name"] for c in await setup.redis.client_list()]
        assert 0 < names.count(SHORT_CLIENT_NAME) <= SHORT_POOL_MAX < len(burst)
    finally:
        await client.aclose()
    names = [c["name"] for c in await setup.redis.client_list()]
    assert SHORT_CLIENT_NAME not in names, "closing the client closes its connections"
