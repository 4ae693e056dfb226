"""HTTP clients for the serve benchmark: a sequential one, and an open-loop load generator run as its own process.

The load generator sends on a fixed schedule whatever the server's speed; a request that finds every
connection busy waits in a queue and its latency counts from the moment it joined it, so a slow server's
queueing shows up in its percentiles (no coordinated omission).
A request unanswered after `timeout_s`, or answered with a status other than 200, counts as an error. The run
is bounded: it stops `timeout_s` after the last scheduled send at the latest.

    python -m bench._http_load --port 6566 --rate 2000 --seconds 30 --bodies bodies.json [--samples FILE] [--arrow]
prints one JSON object: ok, errors, rps, and latency percentiles in ms; `--samples` also writes every latency
(ms, a JSON list), so that several runs' percentiles can be taken together. `--arrow` sends each body (Feast's
JSON request) as an Arrow IPC stream and asks for an Arrow answer (`serving.arrow_ipc`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from collections import deque
from typing import Optional

import httptools

PATH = "/get-online-features"


JSON_HEADERS = "Content-Type: application/json\r\n"
ARROW_HEADERS = "Content-Type: application/vnd.apache.arrow.stream\r\nAccept: application/vnd.apache.arrow.stream\r\n"


def http_request(host: str, port: int, body: bytes, path: str = PATH, headers: str = JSON_HEADERS) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{headers}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def arrow_body(body: dict) -> bytes:
    """Feast's JSON request `body` as the Arrow IPC request of `serving.arrow_ipc`."""
    from serving.arrow_ipc import arrow_request

    return arrow_request(body.get("feature_service") or body["features"], body["entities"],
                         body.get("full_feature_names", False))


class _Response:
    """Collects one HTTP response from a keep-alive connection (httptools callbacks)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.complete = False
        self.body: list[bytes] = []

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


def keep_alive(host: str, port: int) -> socket.socket:
    """A connection for `timed_request`, Nagle off."""
    sock = socket.create_connection((host, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def timed_request(sock: socket.socket, request: bytes) -> float:
    """Latency in ms of one request on a keep-alive connection; raises unless the answer is 200."""
    response = _Response()
    start = time.perf_counter_ns()
    sock.sendall(request)
    while not response.complete:
        data = sock.recv(1 << 16)
        if not data:
            raise ConnectionError(f"server at {sock.getpeername()} closed the connection")
        response.parser.feed_data(data)
    elapsed = (time.perf_counter_ns() - start) / 1e6
    if response.parser.get_status_code() != 200:
        raise RuntimeError(f"HTTP {response.parser.get_status_code()}: {b''.join(response.body)[:300]!r}")
    return elapsed


def sequential(host: str, port: int, bodies: list[bytes], count: int, path: str = PATH,
               headers: str = JSON_HEADERS) -> list[float]:
    """Latencies in ms of `count` requests sent one after another on one keep-alive connection."""
    requests = [http_request(host, port, b, path, headers) for b in bodies]
    with keep_alive(host, port) as sock:
        return [timed_request(sock, requests[i % len(requests)]) for i in range(count)]


class _Connection(asyncio.Protocol):
    """One keep-alive connection with one request in flight at most; its response parser is reused."""

    def __init__(self, load: "OpenLoop"):
        self.load = load
        self.transport: Optional[asyncio.Transport] = None
        self.parser = httptools.HttpResponseParser(self)
        self.started = 0.0  # when the request became ready to go: see OpenLoop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.load.finish(self, ok=False)
            self.transport.abort()  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        self.load.finish(self, self.parser.get_status_code() == 200)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.load.lost(self)


class OpenLoop:
    """Sends `rate` requests/s for `seconds` over a pool of keep-alive connections, whatever the server's pace.

    One timer wakes up every millisecond or so and sends every request due by then (event loop timers have
    millisecond resolution; one timer per request cost more CPU than the server's own work). A request's latency
    runs from the moment it was ready to go: its send when a connection was free, else the moment it joined the
    queue waiting for one (the server's slowness counts, the generator's own timer jitter does not). `late_*`
    reports that jitter: how far behind its schedule each request was handed to the pool.
    """

    def __init__(self, host: str, port: int, bodies: list[bytes], rate: float, seconds: float,
                 connections: int, timeout_s: float, path: str = PATH, headers: str = JSON_HEADERS):
        self.host, self.port = host, port
        self.requests = [http_request(host, port, b, path, headers) for b in bodies]
        self.rate, self.seconds, self.connections, self.timeout_s = rate, seconds, connections, timeout_s
        self.total = int(rate * seconds)
        self.idle: list[_Connection] = []
        self.busy: set[_Connection] = set()
        self.queue: deque[float] = deque()
        self.latencies: list[float] = []
        self.late: list[float] = []
        self.errors = 0
        self.sent = 0
        self.due = 0  # requests handed to the pool so far
        self.start = 0.0
        self.last_done = 0.0
        self.closing = False
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: _Connection(self), self.host, self.port)
        except OSError:
            return
        self._ready(conn)

    def _ready(self, conn: _Connection) -> None:
        if self.queue:
            self._send(conn, self.queue.popleft())
        else:
            self.idle.append(conn)

    def _send(self, conn: _Connection, started: float) -> None:
        conn.started = started
        self.busy.add(conn)
        conn.transport.write(self.requests[self.sent % len(self.requests)])  # type: ignore[union-attr]
        self.sent += 1

    def _tick(self) -> None:
        """Hand every request due by now to the pool, then sleep until the next one is due."""
        now = time.monotonic()
        due = min(self.total, int((now - self.start) * self.rate) + 1)
        start, rate, late = self.start, self.rate, self.late
        for i in range(self.due, due):
            late.append(now - (start + i / rate))
            if self.idle:
                self._send(self.idle.pop(), now)
            else:
                self.queue.append(now)
        self.due = due
        if due < self.total:  # (self.loop: asyncio.get_running_loop() costs a getpid() call on Python 3.11)
            self.loop.call_later(max(0.001, start + due / rate - time.monotonic()), self._tick)  # 0 would spin

    def finish(self, conn: _Connection, ok: bool) -> None:
        if conn not in self.busy:
            return
        self.busy.discard(conn)
        now = time.monotonic()
        if ok:
            self.latencies.append((now - conn.started) * 1000)
            self.last_done = now
        else:
            self.errors += 1
        self._ready(conn)

    def lost(self, conn: _Connection) -> None:
        if conn in self.busy:
            self.busy.discard(conn)
            self.errors += 1
        if conn in self.idle:
            self.idle.remove(conn)
        if not self.closing:
            asyncio.ensure_future(self._open())

    def _sweep(self) -> None:
        """Requests past the timeout (in flight or still queued) are errors; their connections are replaced."""
        deadline = time.monotonic() - self.timeout_s
        for conn in [c for c in self.busy if c.started < deadline]:
            self.busy.discard(conn)
            self.errors += 1
            conn.transport.abort()  # type: ignore[union-attr]
        while self.queue and self.queue[0] < deadline:
            self.queue.popleft()
            self.errors += 1

    async def run(self) -> dict:
        self.loop = asyncio.get_running_loop()
        await asyncio.gather(*(self._open() for _ in range(self.connections)))
        self.start = time.monotonic() + 0.05
        self.loop.call_later(0.05, self._tick)
        end = self.start + self.seconds + self.timeout_s + 0.5
        while time.monotonic() < end and len(self.latencies) + self.errors < self.total:
            await asyncio.sleep(0.05)
            self._sweep()
        self.errors += self.total - len(self.latencies) - self.errors
        self.closing = True
        for conn in [*self.idle, *self.busy]:
            conn.transport.close()  # type: ignore[union-attr]
        return self.report()

    def report(self) -> dict:
        from bench._report import percentiles

        elapsed = max(self.last_done - self.start, 1e-9)
        late = percentiles([x * 1000 for x in self.late]) if self.late else {}
        return {"ok": len(self.latencies), "errors": self.errors, "rps": round(len(self.latencies) / elapsed, 1),
                **{f"{k}_ms": round(v, 3) for k, v in percentiles(self.latencies).items()},
                **{f"late_{k}_ms": round(v, 3) for k, v in late.items() if k in ("p50", "p99")}}


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="open-loop HTTP load against /get-online-features (or --path)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bodies", required=True, help="JSON file: a list of request bodies (objects)")
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--samples", default=None, help="JSON file to write every latency (ms) to")
    parser.add_argument("--path", default=PATH, help="the endpoint every request is POSTed to")
    parser.add_argument("--arrow", action="store_true", help="send Arrow IPC requests, ask for Arrow answers")
    args = parser.parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("the load generator only targets this machine (127.0.0.1)")
    with open(args.bodies) as fh:
        bodies = [arrow_body(b) if args.arrow else json.dumps(b).encode() for b in json.load(fh)]
    import uvloop

    load = OpenLoop(args.host, args.port, bodies, args.rate, args.seconds, args.connections, args.timeout, args.path,
                    ARROW_HEADERS if args.arrow else JSON_HEADERS)
    report = uvloop.run(load.run())
    if args.samples:
        with open(args.samples, "w") as fh:
            json.dump(load.latencies, fh)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
