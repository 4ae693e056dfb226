"""HTTP clients for the serve benchmark: a sequential one, and an open-loop load generator run as its own process.

The load generator sends on a fixed schedule whatever the server's speed and measures each latency from the
scheduled send time, so a slow server's queueing shows up in its percentiles (no coordinated omission).
A request unanswered after `timeout_s`, or answered with a status other than 200, counts as an error. The run
is bounded: it stops `timeout_s` after the last scheduled send at the latest.

    python -m bench._http_load --port 6566 --rate 2000 --seconds 30 --bodies bodies.json
prints one JSON object: ok, errors, rps, and latency percentiles in ms.
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


def http_request(host: str, port: int, body: bytes, path: str = PATH) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


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


def sequential(host: str, port: int, bodies: list[bytes], count: int, path: str = PATH) -> list[float]:
    """Latencies in ms of `count` requests sent one after another on one keep-alive connection."""
    requests = [http_request(host, port, b, path) for b in bodies]
    out = []
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(count):
            response = _Response()
            start = time.perf_counter_ns()
            sock.sendall(requests[i % len(requests)])
            while not response.complete:
                data = sock.recv(1 << 16)
                if not data:
                    raise ConnectionError(f"server at {host}:{port} closed the connection")
                response.parser.feed_data(data)
            out.append((time.perf_counter_ns() - start) / 1e6)
            if response.parser.get_status_code() != 200:
                raise RuntimeError(f"HTTP {response.parser.get_status_code()}: {b''.join(response.body)[:300]!r}")
    return out


class _Connection(asyncio.Protocol):
    def __init__(self, load: "OpenLoop"):
        self.load = load
        self.transport: Optional[asyncio.Transport] = None
        self.response = _Response()
        self.scheduled = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.response.parser.feed_data(data)
        except httptools.HttpParserError:
            self.load.finish(self, ok=False)
            return
        if self.response.complete:
            ok = self.response.parser.get_status_code() == 200
            self.response = _Response()
            self.load.finish(self, ok)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.load.lost(self)


class OpenLoop:
    def __init__(self, host: str, port: int, bodies: list[bytes], rate: float, seconds: float,
                 connections: int, timeout_s: float):
        self.host, self.port = host, port
        self.requests = [http_request(host, port, b) for b in bodies]
        self.rate, self.seconds, self.connections, self.timeout_s = rate, seconds, connections, timeout_s
        self.idle: list[_Connection] = []
        self.busy: set[_Connection] = set()
        self.queue: deque[float] = deque()
        self.latencies: list[float] = []
        self.errors = 0
        self.sent = 0
        self.last_done = 0.0
        self.closing = False

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

    def _send(self, conn: _Connection, scheduled: float) -> None:
        conn.scheduled = scheduled
        self.busy.add(conn)
        conn.transport.write(self.requests[self.sent % len(self.requests)])  # type: ignore[union-attr]
        self.sent += 1

    def fire(self, scheduled: float) -> None:
        if self.idle:
            self._send(self.idle.pop(), scheduled)
        else:
            self.queue.append(scheduled)

    def finish(self, conn: _Connection, ok: bool) -> None:
        if conn not in self.busy:
            return
        self.busy.discard(conn)
        now = time.monotonic()
        if ok:
            self.latencies.append((now - conn.scheduled) * 1000)
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
        for conn in [c for c in self.busy if c.scheduled < deadline]:
            self.busy.discard(conn)
            self.errors += 1
            conn.transport.abort()  # type: ignore[union-attr]
        while self.queue and self.queue[0] < deadline:
            self.queue.popleft()
            self.errors += 1

    async def run(self) -> dict:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(self._open() for _ in range(self.connections)))
        total = int(self.rate * self.seconds)
        start = time.monotonic() + 0.2
        offset = loop.time() - time.monotonic()
        for i in range(total):
            scheduled = start + i / self.rate
            loop.call_at(scheduled + offset, self.fire, scheduled)
        end = start + self.seconds + self.timeout_s + 0.5
        while time.monotonic() < end and len(self.latencies) + self.errors < total:
            await asyncio.sleep(0.05)
            self._sweep()
        self.errors += total - len(self.latencies) - self.errors
        self.closing = True
        for conn in [*self.idle, *self.busy]:
            conn.transport.close()  # type: ignore[union-attr]
        return self.report(start)

    def report(self, start: float) -> dict:
        from bench._report import percentiles

        elapsed = max(self.last_done - start, 1e-9)
        pct = percentiles(self.latencies)
        return {"ok": len(self.latencies), "errors": self.errors, "rps": round(len(self.latencies) / elapsed, 1),
                **{f"{k}_ms": round(v, 3) for k, v in pct.items()}}


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="open-loop HTTP load against /get-online-features")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bodies", required=True, help="JSON file: a list of request bodies (objects)")
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("the load generator only targets this machine (127.0.0.1)")
    with open(args.bodies) as fh:
        bodies = [json.dumps(b).encode() for b in json.load(fh)]
    import uvloop

    load = OpenLoop(args.host, args.port, bodies, args.rate, args.seconds, args.connections, args.timeout)
    print(json.dumps(uvloop.run(load.run())), flush=True)


if __name__ == "__main__":
    main()
