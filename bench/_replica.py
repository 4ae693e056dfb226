"""A stand-in replica for the gateway benchmark and routing tests: generate-server's HTTP API (on the servers'
own HTTP protocol) without the model, answering after an injected delay that can be changed while it runs.

    python -m bench._replica --port 6571 --delay-ms 2

`POST /generate` answers a small body after the delay (202 with a job id for `"async": true`, the job done after
the delay), `GET /jobs/{id}`, `/ready`, `/health` at once (a slow replica still passes its health checks);
`POST /delay {"ms": N}` sets the delay, `POST /fail {"status": S}` makes `/generate` answer S as generate-server
would (503 `closed`, 429 `queue_full`, 500 `generation_failed`; 0: answer again), and `POST /fail {"jobs": true}`
makes the jobs submitted after it fail (a poll of one, once done: 500 `generation_failed`). It counts the requests it
answered (`GET /count`), so that a test sees what reached each replica, not what the gateway says it sent.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from typing import Optional

import orjson

from common.config import HttpSettings

JSON = b"application/json"
FAILURES = {503: "closed", 429: "queue_full", 500: "generation_failed"}  # generate-server's codes


class DelayedReplica:
    max_body_bytes = 64 << 10

    def __init__(self, name: str, delay_ms: float):
        self.http = HttpSettings()
        self.name, self.delay_s = name, delay_ms / 1e3
        self.generated = 0
        self.fail_status = 0
        self.fail_jobs = False
        self.failing: set[str] = set()  # jobs that fail once done
        self.jobs: dict[str, float] = {}  # job id -> loop time it is done
        self._ids = itertools.count()

    async def __call__(self, scope: dict, receive, send) -> None:
        from serving.asgi import answer_http

        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                await send({"type": "lifespan.startup.complete" if kind == "lifespan.startup"
                            else "lifespan.shutdown.complete"})
                if kind == "lifespan.shutdown":
                    return
        else:
            await answer_http(self, scope, receive, send)

    async def respond(self, method: str, path: str, body: Optional[bytes], api_key: Optional[str] = None,
                      request_id: Optional[str] = None):
        loop = asyncio.get_running_loop()
        if path == "/generate" and method == "POST" and self.fail_status:
            code = FAILURES[self.fail_status]
            return self.fail_status, orjson.dumps({"error": f"injected {code}", "code": code}), JSON, []
        if path == "/generate" and method == "POST":
            data = orjson.loads(body or b"{}")
            if data.get("async"):
                job = f"{next(self._ids):016x}"
                self.jobs[job] = loop.time() + self.delay_s
                if self.fail_jobs:
                    self.failing.add(job)
                return 202, orjson.dumps({"job_id": job, "status": "queued", "poll": f"/jobs/{job}"}), JSON, \
                    [(b"location", f"/jobs/{job}".encode())]
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            self.generated += 1
            return 200, b"glTF " + self.name.encode(), b"model/gltf-binary", []
        if path.startswith("/jobs/"):
            done = self.jobs.get(path[len("/jobs/"):])
            if done is None:
                return 404, b'{"error":"no such job","code":"unknown_job"}', JSON, []
            if loop.time() < done:
                return 202, orjson.dumps({"job_id": path[6:], "status": "running", "poll": path}), JSON, []
            if path[len("/jobs/"):] in self.failing:
                return 500, b'{"error":"injected generation_failed","code":"generation_failed"}', JSON, []
            return 200, b"glTF " + self.name.encode(), b"model/gltf-binary", []
        if path == "/delay" and method == "POST":
            self.delay_s = orjson.loads(body or b"{}")["ms"] / 1e3
            return 200, b"{}", JSON, []
        if path == "/fail" and method == "POST":
            data = orjson.loads(body or b"{}")
            self.fail_status = data.get("status", self.fail_status)
            self.fail_jobs = data.get("jobs", self.fail_jobs)
            return 200, b"{}", JSON, []
        if path == "/count":
            return 200, orjson.dumps({"generated": self.generated}), JSON, []
        if path in ("/ready", "/health"):
            return 200, b'{"status":"ready"}', JSON, []
        return 404, b'{"error":"not found","code":"not_found"}', JSON, []


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="a stand-in generation replica with an injected delay")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--name", default="replica")
    args = parser.parse_args(argv)
    import uvicorn

    app = DelayedReplica(args.name, args.delay_ms)
    uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=args.port, lifespan="on", access_log=False,
                                  log_level="warning", http="serving.http_protocol:HttpProtocol")).run()


if __name__ == "__main__":
    main()
