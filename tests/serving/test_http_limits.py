"""The limits of the HTTP protocol both servers run on, without sockets: each refusal is a JSON error with its
status, after the answers owed on the connection; slow, silent and non-reading clients are cut off; reading
pauses while answers wait. Real sockets against both servers: tests/reliability/test_http_fuzz.py."""

from __future__ import annotations

import asyncio
import json
import types

import pytest

from common.config import HttpSettings
from fake_transport import FakeTransport
from inference.service.http_app import GenerationApp
from serving.http_app import FeatureServer
from serving.http_protocol import HttpProtocol

HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def _connection(app=None, **limits) -> tuple[HttpProtocol, FakeTransport]:
    app = app or FeatureServer(lambda: None)
    app.http = HttpSettings(**limits)
    protocol = HttpProtocol(types.SimpleNamespace(loaded_app=app), types.SimpleNamespace(connections=set()),
                            _loop=asyncio.get_running_loop())
    transport = FakeTransport()
    protocol.connection_made(transport)
    return protocol, transport


def _responses(transport: FakeTransport) -> list[tuple[int, dict, bytes]]:
    """(status, headers, body) of each response written, in order."""
    found = []
    for write in transport.writes:
        if write in (b"<eof>", b"HTTP/1.1 100 Continue\r\n\r\n"):
            continue
        head, _, body = write.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in lines[1:])}
        found.append((int(lines[0].split()[1]), headers, body))
    return found


def _error_code(response: tuple[int, dict, bytes]) -> str:
    body = json.loads(response[2])
    assert body["error"], body
    return body["code"]


def _run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 10))


@pytest.mark.parametrize("request_bytes, status, code", [
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414, "uri_too_long"),
    (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 200) for i in range(90)) + b"\r\n", 431,
     "headers_too_large"),
    (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(101)) + b"\r\n", 431, "headers_too_large"),
])
def test_oversized_request_heads_are_refused_and_the_connection_closed(request_bytes, status, code):
    async def scenario():
        protocol, transport = _connection()
        protocol.data_received(request_bytes)
        await asyncio.sleep(0)
        [response] = _responses(transport)
        assert response[0] == status and response[1]["connection"] == "close" and _error_code(response) == code
        assert transport.writes[-1] == b"<eof>"        # our side ended; closed once the client had time to read
        protocol.data_received(HEALTH)                  # nothing more is read from this connection
        await asyncio.sleep(0)
        assert len(_responses(transport)) == 1

    _run(scenario)


def test_a_header_line_that_never_ends_is_cut_off_after_one_more_read():
    async def scenario():
        protocol, transport = _connection()
        protocol.data_received(b"GET / HTTP/1.1\r\nX-Long: ")
        reads = 0
        while not transport.writes:
            assert reads < 3, "still reading a 64 KB-per-read header past the limits"
            protocol.data_received(b"a" * 65536)
            reads += 1
            await asyncio.sleep(0)
        assert _responses(transport)[0][0] == 431

    _run(scenario)


@pytest.mark.parametrize("partial", [b"GET /health HTTP/1.1\r\nHost: x\r\n",
                                     b"POST /get-online-features HTTP/1.1\r\ncontent-length: 100\r\n\r\n{\"a\""])
def test_a_request_not_whole_within_the_timeout_is_408(partial):
    async def scenario():
        protocol, transport = _connection(request_timeout_s=0.2, keep_alive_s=30)
        protocol.data_received(partial)
        await asyncio.sleep(0.1)
        assert not transport.writes
        await asyncio.sleep(0.2)
        [response] = _responses(transport)
        assert response[0] == 408 and _error_code(response) == "request_timeout"

    _run(scenario)


def test_a_valid_request_followed_by_garbage_gets_its_answer_then_the_400():
    async def scenario():
        protocol, transport = _connection()
        protocol.data_received(HEALTH + b"\x00\x01garbage\r\n\r\n")
        await asyncio.sleep(0.01)
        statuses = [r[0] for r in _responses(transport)]
        assert statuses == [200, 400]

    _run(scenario)


def test_answers_wait_while_the_client_does_not_read_and_reading_pauses():
    async def scenario():
        protocol, transport = _connection(request_timeout_s=0.3)
        protocol.data_received(HEALTH * 3)
        protocol.pause_writing()                       # as uvloop does once the first answer fills its buffer
        assert not transport.reading
        await asyncio.sleep(0.01)
        assert len(_responses(transport)) == 1         # one answer written, the others wait
        protocol.resume_writing()
        await asyncio.sleep(0.01)
        assert len(_responses(transport)) == 3 and transport.reading
        protocol.data_received(HEALTH)
        protocol.pause_writing()
        await asyncio.sleep(0.5)                       # a client that never reads again is dropped
        assert transport.aborted

    _run(scenario)


def test_at_most_max_pipelined_requests_are_read_ahead_of_their_answers():
    async def scenario():
        protocol, transport = _connection(max_pipelined=4)
        protocol.data_received(HEALTH * 10)
        assert not transport.reading                   # ten read in one go: stop reading until answered
        await asyncio.sleep(0.01)
        assert len(_responses(transport)) == 10 and transport.reading

    _run(scenario)


def test_json_nested_too_deep_is_a_400_naming_the_limit_before_any_work():
    async def scenario():
        protocol, transport = _connection()
        deep = b'{"features": ["v:f"], "entities": {"id": ' + b"[" * 975 + b"]" * 975 + b"}}"
        protocol.data_received(b"POST /get-online-features HTTP/1.1\r\ncontent-length: %d\r\n\r\n%s"
                               % (len(deep), deep))
        await asyncio.sleep(0.01)
        [response] = _responses(transport)
        assert response[0] == 400 and _error_code(response) == "malformed_json"
        assert "nested more than 32 levels" in json.loads(response[2])["error"]

    _run(scenario)


def _bodies_up_to(max_body: int) -> tuple[HttpProtocol, FakeTransport]:
    app = FeatureServer(lambda: None)
    app.max_body_bytes = max_body
    return _connection(app)


def test_a_body_declared_over_the_limit_is_413_at_once_without_waiting_for_it():
    async def scenario():
        protocol, transport = _bodies_up_to(1000)
        protocol.data_received(b"POST /get-online-features HTTP/1.1\r\nexpect: 100-continue\r\n"
                               b"content-length: 2000\r\n\r\n")
        await asyncio.sleep(0.01)
        (response,) = _responses(transport)
        assert response[0] == 413 and _error_code(response) == "body_too_large"
        assert "2000 bytes is over 1000" in json.loads(response[2])["error"]
        assert b"HTTP/1.1 100 Continue\r\n\r\n" not in transport.writes and transport.writes[-1] == b"<eof>"

    _run(scenario)


def test_a_chunked_body_over_the_limit_is_413_and_the_connection_lives_on():
    async def scenario():
        protocol, transport = _bodies_up_to(1000)
        protocol.data_received(b"POST /get-online-features HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
                               b"7d0\r\n" + b" " * 2000 + b"\r\n0\r\n\r\n" + HEALTH)
        await asyncio.sleep(0.01)
        assert [r[0] for r in _responses(transport)] == [413, 200]

    _run(scenario)


@pytest.mark.parametrize("app", [lambda: FeatureServer(lambda: None), lambda: GenerationApp(lambda: None)],
                         ids=["feature", "generation"])
def test_health_answers_head_and_names_the_methods_it_takes(app):
    async def scenario():
        protocol, transport = _connection(app())
        protocol.data_received(b"HEAD /health HTTP/1.1\r\n\r\nPOST /health HTTP/1.1\r\ncontent-length: 0\r\n\r\n")
        await asyncio.sleep(0.01)
        head, post = _responses(transport)
        assert head[0] == 200 and head[2] == b"" and int(head[1]["content-length"]) > 0
        assert post[0] == 405 and post[1]["allow"] == "GET, HEAD" and _error_code(post) == "method_not_allowed"

    _run(scenario)
