"""`FeatureServer.answer_soon`, the callback path of one-row feature reads (no task, no coroutine): it answers
exactly what `respond` answers, counts the same metrics, gives 503 within the timeout when Redis hangs, and leaves
every other request to `respond`. A redis-server of the test's own, frozen by pid."""

from __future__ import annotations

import asyncio
import os
import types

import orjson
import pytest
from serving_env import scratch_repo
from serving.client import AsyncOnlineClient
from serving.http_app import FeatureServer
from serving.http_protocol import HttpProtocol
from fake_transport import FakeTransport

pytestmark = pytest.mark.integration

TIMEOUT_S = 0.3
FEATURES = ["asset_activity:views_1h", "asset_attributes:category", "asset_activity:dwell_ms_mean_1h"]
URL = b"/get-online-features"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with scratch_repo(tmp_path_factory.mktemp("soon"), f"answersoon{os.getpid()}") as (repo, _, redis_server):
        yield repo, redis_server


async def _server(repo) -> FeatureServer:
    """A started server whose Redis connection is open (`answer_soon` leaves the first request, which opens it,
    to `respond`)."""
    app = FeatureServer(lambda: AsyncOnlineClient.from_repo(repo, timeout_s=TIMEOUT_S))
    app.client = app.make_client()
    await app.client.ping()
    return app


async def _soon(app: FeatureServer, body: bytes) -> tuple:
    answered = asyncio.get_running_loop().create_future()
    assert app.answer_soon("POST", URL, body, None, answered.set_result)
    return await answered


def test_one_row_reads_are_answered_as_respond_answers_them(served):
    repo, _ = served

    async def scenario():
        app = await _server(repo)
        try:
            for entity in ("a1", "unknown"):
                body = orjson.dumps({"features": FEATURES, "entities": {"asset_id": [entity]}})
                assert await _soon(app, body) == await app.respond("POST", URL.decode(), body)
            assert app.stats.summary()["endpoints"]["/get-online-features"]["count"] == 4
            assert app.stats.in_flight == 0
        finally:
            await app.client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("body", [
    orjson.dumps({"features": FEATURES, "entities": {"asset_id": ["a1", "a2"]}}),  # two rows
    orjson.dumps({"features": ["asset_activity:nope"], "entities": {"asset_id": ["a1"]}}),  # a 400
    b"{not json",
])
def test_other_requests_are_left_to_respond(served, body):
    repo, _ = served

    async def scenario():
        app = await _server(repo)
        try:
            assert not app.answer_soon("POST", URL, body, None, pytest.fail)
            assert not app.answer_soon("POST", URL + b"?x=1", body, None, pytest.fail)
            assert app.stats.summary()["endpoints"] == {}  # nothing counted: `respond` counts it
        finally:
            await app.client.close()

    asyncio.run(scenario())


def test_a_hanging_redis_is_a_503_within_the_timeout_on_the_connection(served):
    repo, redis_server = served

    async def scenario():
        app = await _server(repo)
        protocol = HttpProtocol(types.SimpleNamespace(loaded_app=app), types.SimpleNamespace(connections=set()),
                                _loop=asyncio.get_running_loop())
        transport = FakeTransport()
        protocol.connection_made(transport)
        body = orjson.dumps({"features": FEATURES, "entities": {"asset_id": ["a1"]}})
        redis_server.freeze()
        try:
            started = asyncio.get_running_loop().time()
            protocol.data_received(b"POST /get-online-features HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                                   % (len(body), body))
            while not transport.writes:
                await asyncio.sleep(0.01)
            assert asyncio.get_running_loop().time() - started < TIMEOUT_S + 0.5
        finally:
            redis_server.thaw()
        head, _, payload = transport.writes[0].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ") and orjson.loads(payload)["code"] == "redis_unavailable"
        assert app.stats.redis_errors == 1 and not protocol.busy
        protocol.connection_lost(None)
        await app.client.close()

    asyncio.run(scenario())
