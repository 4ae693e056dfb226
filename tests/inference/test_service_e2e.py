"""End to end on the CPU: asset features materialized into the real Redis, read by the service through the serving
SDK, turned into the bbox token; a tiny model generates a valid GLB; the HTTP endpoint, fallbacks, limits."""

from __future__ import annotations

import asyncio

import datetime as dt
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import torch

from cli_helpers import copy_example_repo, generation_app_in_thread, register_repo

pytestmark = pytest.mark.integration

NOW = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
# asset -> (bbox or None for NULL, category, style, age of the catalog row)
ASSETS = {
    "asset_chair": ((2.0, 1.0, 0.5), "furniture", "medieval", dt.timedelta(hours=3)),
    "asset_nobox": ((None, None, None), "plant", "cartoon", dt.timedelta(hours=3)),
    "asset_old": ((1.0, 1.0, 1.0), "vehicle", "voxel", dt.timedelta(days=400)),      # past the 365 d ttl
}


def _repo(tmp: Path) -> Path:
    project = f"gen_{uuid.uuid4().hex[:8]}"
    repo = copy_example_repo(tmp, project, {"path": f"sqlite:///{tmp / project}.db"}, data_dir=tmp / "data")
    register_repo(repo)
    return repo


def _materialize(repo: Path) -> None:
    """Offline tables of both views written, then materialized into Redis by our materializer."""
    from batch.materialize import materialize_view
    from common.config import load_config
    from dsl import load_repo
    from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path
    from redis_store.settings import RedisSettings

    cfg = load_config(repo)
    views = load_repo(repo)
    ids = list(ASSETS)
    stamps = pa.array([NOW - a[3] for a in ASSETS.values()], pa.timestamp("ms", "UTC"))
    attrs = {"asset_id": ids, EVENT_TIMESTAMP: stamps,
             "category": [a[1] for a in ASSETS.values()], "creator_id": ["creator_1"] * 3,
             "style": [a[2] for a in ASSETS.values()], "polygon_count": [1000, 2000, 3000]}
    for axis, name in enumerate(("bbox_x", "bbox_y", "bbox_z")):
        attrs[name] = pa.array([a[0][axis] for a in ASSETS.values()], pa.float64())
    activity_view = views.view("asset_activity")
    activity = {"asset_id": ["asset_chair"], EVENT_TIMESTAMP: pa.array([NOW - dt.timedelta(minutes=5)],
                                                                          pa.timestamp("ms", "UTC"))}
    for name, kind in activity_view.output_schema().items():
        activity[name] = pa.array([120 if name == "views_24h" else (7 if kind.is_numeric else "user_1")])
    settings = RedisSettings.from_config(cfg)
    for view_name, columns in (("asset_attributes", attrs), ("asset_activity", activity)):
        view = views.view(view_name)
        path = offline_table_path(cfg.data_dir, view)
        ds.write_dataset(pa.table(columns), path, format="parquet")
        materialize_view(settings, view, cfg.project, path, NOW - dt.timedelta(days=500), NOW)


@pytest.fixture(scope="module")
def store_repo(tmp_path_factory, local_services) -> Path:
    """A scratch project whose asset features are in the real Redis."""
    repo = _repo(tmp_path_factory.mktemp("generate"))
    _materialize(repo)
    return repo


@pytest.fixture(scope="module")
def service(store_repo):
    from common.config import load_config
    from inference.service import GenerationService, ServiceConfig, online_store

    project = load_config(store_repo)
    cfg = ServiceConfig.from_name("tiny", queue_size=3, max_batch_wait_ms=5.0)
    svc = GenerationService(cfg, make_client=online_store(project.repo_path, project.registry_url, 1.0))
    yield svc
    svc.close()


def test_asset_request_builds_the_bbox_token_from_stored_features_and_a_valid_glb(service):
    import trimesh

    from inference.service import GenerationRequest

    result = service.generate(GenerationRequest("a wooden version", asset_id="asset_chair"))
    want = [1.925, 0.9625, 0.48125]                       # stored (2, 1, 0.5), longest side scaled to 1.925
    assert result.fallback is None and result.bbox == pytest.approx(want)
    mesh = trimesh.load(trimesh.util.wrap_as_stream(result.glb), file_type="glb", force="mesh")
    assert len(mesh.faces) == result.faces > 0 and result.glb[:4] == b"glTF"
    for stage in ("queue", "fetch", "text", "prefill", "decode", "shape_decode", "meshing", "export", "total"):
        assert result.stages[stage] >= 0, stage

    # the condition the pipeline builds from what the SDK read: its last token is bbox_proj of the stored bbox
    pipe = service.pipeline
    features = service.fetcher.fetch(["asset_chair"])
    assert features[0].bbox == (2.0, 1.0, 0.5) and features[0].category == "furniture"
    assert features[0].popularity["views_24h"] == 120
    cond, boxes = pipe.condition([GenerationRequest("a wooden version", asset_id="asset_chair")], features)
    with torch.no_grad():
        token = pipe.engine.model.bbox_proj(torch.tensor([want]))
    torch.testing.assert_close(cond[0, -1], token[0], rtol=1e-6, atol=1e-6)
    plain, _ = pipe.condition([GenerationRequest("a wooden version")], [None])
    assert not torch.allclose(cond[0, -1], plain[0, -1])
    torch.testing.assert_close(cond[0, :-1], plain[0, :-1])               # the zero projection adds nothing


@pytest.mark.parametrize("asset_id, reason", [("asset_missing", "missing_asset"), ("asset_old", "stale_features"),
                                              ("asset_nobox", "no_bbox")])
def test_missing_stale_or_null_features_fall_back_to_the_zero_bbox(service, asset_id, reason):
    from inference.service import GenerationRequest

    before = service.stats.summary()["fallbacks"][reason]
    result = service.generate(GenerationRequest("a chair", asset_id=asset_id))
    assert result.fallback == reason and result.bbox is None and result.faces > 0
    assert service.stats.summary()["fallbacks"][reason] == before + 1
    features = service.fetcher.fetch([asset_id])
    cond, _ = service.pipeline.condition([GenerationRequest("a chair")], features)
    uncond_bbox_token = service.pipeline.uncond[0, -1]                    # the unconditional row's zero bbox
    torch.testing.assert_close(cond[0, -1], uncond_bbox_token)


def _serving(service):
    """The HTTP app over `service` in a thread; yields its base URL."""
    return generation_app_in_thread(lambda: service)


@pytest.fixture(scope="module")
def http(service):
    with _serving(service) as url:
        yield url


@pytest.fixture(scope="module")
def expiring():
    """A service so overloaded, by its settings, that every request outstays `job_timeout_s` in the queue."""
    from inference.service import GenerationService, ServiceConfig

    svc = GenerationService(ServiceConfig.from_name("tiny", job_timeout_s=1e-6, max_batch_wait_ms=5.0))
    yield svc
    svc.close()


def _call(url: str, body: dict | None = None, headers: dict | None = None):
    """(status, headers (case-insensitive), body)."""
    data = None if body is None else orjson.dumps(body)
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers or {}), timeout=30) as reply:
            return reply.status, reply.headers, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def test_http_generate_returns_the_mesh_with_stage_timings(http):
    status, headers, body = _call(f"{http}/generate", {"prompt": "a wooden version", "asset_id": "asset_chair",
                                                       "seed": 3})
    assert status == 200 and headers["Content-Type"] == "model/gltf-binary" and body[:4] == b"glTF"
    timings = dict(part.split(";dur=") for part in headers["Server-Timing"].split(", "))
    assert {"fetch", "text", "prefill", "decode", "shape_decode", "meshing", "export", "total"} <= set(timings)


def _poll(url: str):
    """The job's first answer other than 202 (queued or running)."""
    deadline = time.monotonic() + 30
    while (reply := _call(url))[0] == 202:
        assert time.monotonic() < deadline, f"{url} still 202 after 30 s"
        time.sleep(0.05)
    return reply


def test_http_job_id_then_poll(http):
    status, headers, body = _call(f"{http}/generate", {"prompt": "a stone lamp", "async": True})
    job = orjson.loads(body)
    assert status == 202 and job["poll"] == headers["Location"] == f"/jobs/{job['job_id']}" and "detail" not in job
    reply = _poll(http + job["poll"])
    assert reply[0] == 200 and reply[2][:4] == b"glTF"
    assert _call(f"{http}/jobs/nope")[0] == 404


def test_http_wait_past_timeout_s_answers_a_job_to_poll_not_an_error(http):
    # the worker waits 5 ms for batch company before it even starts, so no mesh is ready within 1 ms
    status, headers, body = _call(f"{http}/generate", {"prompt": "a blue vase", "timeout_s": 0.001})
    job = orjson.loads(body)
    assert status == 202 and headers["Content-Type"] == "application/json"
    assert job["status"] in ("queued", "running") and job["poll"] == headers["Location"] == f"/jobs/{job['job_id']}"
    assert "not ready within 0.001s (`timeout_s`)" in job["detail"] and job["poll"] in job["detail"]
    status, headers, mesh = _poll(http + job["poll"])
    assert status == 200 and headers["Content-Type"] == "model/gltf-binary" and mesh[:4] == b"glTF"
    assert headers["X-Request-Id"] == job["job_id"]


def test_http_mesh_echoes_the_callers_request_id(http):
    """The mesh's `X-Request-ID` is the one the caller sent, also when the mesh comes from a job's poll."""
    status, headers, body = _call(f"{http}/generate", {"prompt": "a red cup"}, {"X-Request-ID": "client-7"})
    assert status == 200 and body[:4] == b"glTF" and headers["X-Request-Id"] == "client-7"
    status, _, body = _call(f"{http}/generate", {"prompt": "a red cup", "async": True}, {"X-Request-ID": "client-8"})
    assert status == 202
    status, headers, mesh = _poll(http + orjson.loads(body)["poll"])
    assert status == 200 and mesh[:4] == b"glTF" and headers["X-Request-Id"] == "client-8"


@pytest.mark.parametrize("body, fragment", [({"asset_id": "a"}, "`prompt` must be a non-empty string"),
                                            ({"prompt": "x", "seed": -1}, "`seed` must be an integer"),
                                            ({"prompt": "x", "top_p": 2}, "`top_p` must be in (0, 1]"),
                                            ({"prompt": "x", "colour": "red"}, "unknown field(s) `colour`")])
def test_http_bad_requests_say_what_is_wrong(http, body, fragment):
    status, _, reply = _call(f"{http}/generate", body)
    assert status == 400 and fragment in orjson.loads(reply)["error"]


def test_full_queue_is_a_clear_429_and_metrics_show_every_stage(http, service):
    jobs, refused = [], None
    for i in range(40):                  # a few ms each; the worker needs tens of ms per batch of 4
        status, headers, body = _call(f"{http}/generate", {"prompt": f"a red car {i}", "async": True})
        if status == 429:
            refused = (headers, orjson.loads(body))
            break
        jobs.append(orjson.loads(body)["job_id"])
    assert refused is not None, "40 requests never filled a queue of 3"
    headers, body = refused
    assert headers["Retry-After"] == "2" and body["code"] == "queue_full"
    assert "queue is full (3 requests waiting)" in body["error"]
    for job in jobs:
        while _call(f"{http}/jobs/{job}")[0] == 202:
            time.sleep(0.05)
    status, _, text = _call(f"{http}/metrics")
    assert status == 200
    for stage in ("fetch", "text", "prefill", "decode", "shape_decode", "meshing", "export", "total"):
        assert f'cube3d_stage_quantile_seconds{{quantile="0.99",stage="{stage}"}}' in text.decode(), stage
    assert b'cube3d_requests_total{outcome="rejected"}' in text


def test_a_caller_timeout_s_never_drops_a_queued_request(service):
    from inference.service import GenerationRequest

    first = service.submit(GenerationRequest("a tall tree"))
    # sampled, so it cannot join `first`'s greedy batch: it waits for that batch, long past its own timeout_s
    late = service.submit(GenerationRequest("a small cup", top_p=0.5, timeout_s=0.001))
    assert first.result().faces > 0 and late.result().faces > 0



def test_a_queue_smaller_than_the_largest_batch_still_warms_up():
    """`generate-server --queue-size 1`: the warm-up fills each batch bucket at once, past the callers' bound."""
    from inference.service import GenerationRequest, GenerationService, ServiceConfig

    svc = GenerationService(ServiceConfig.from_name("tiny", queue_size=1, max_batch_wait_ms=5.0))
    try:
        svc.warm_up()
        assert svc.generate(GenerationRequest("a wooden chair")).faces > 0
    finally:
        svc.close()

def test_request_queued_past_job_timeout_s_is_dropped_before_the_gpu(expiring):
    from inference.service import GenerationRequest, JobExpiredError

    with pytest.raises(JobExpiredError, match=r"waited \d+\.\ds in the queue, past the service's 1e-06s "
                                              r"`job_timeout_s`, and was dropped unrun"):
        expiring.generate(GenerationRequest("a tall tree"))
    summary = expiring.stats.summary()
    assert summary["outcomes"]["timeout"] == 1 and summary["batch_sizes"] == {}     # no GPU time spent


def test_http_expired_job_polls_as_410_and_a_waiting_caller_gets_503_retry_after(expiring):
    with _serving(expiring) as url:
        status, _, body = _call(f"{url}/generate", {"prompt": "a stone lamp", "async": True})
        assert status == 202
        status, headers, body = _poll(url + orjson.loads(body)["poll"])
        reply = orjson.loads(body)
        assert status == 410 and reply["code"] == "expired" and "submit it again" in reply["error"]
        assert "Retry-After" not in headers                     # this job never runs: polling again cannot help

        status, headers, body = _call(f"{url}/generate", {"prompt": "a stone lamp"})
        reply = orjson.loads(body)
        assert status == 503 and headers["Retry-After"] == "2" and reply["code"] == "expired"
        assert "`job_timeout_s`" in reply["error"] and "overloaded" in reply["error"]


def test_a_failed_generation_gives_the_key_its_tokens_back(expiring, tmp_path):
    """Tokens are charged when a request is accepted; one that then fails (here: dropped unrun, past
    `job_timeout_s`) is refunded, so a key pays only for meshes made."""
    from inference.service.http_app import GenerationApp
    from serving.api_keys import Authenticator, KeyStore
    from serving.gateway import TOKENS, Gateway

    store = KeyStore(f"sqlite:///{tmp_path / 'registry.db'}", "assets")
    cost = expiring.pipeline.engine.cfg.n_generated
    key, secret = store.create("gen", ["*"], 100, cost)                  # one mesh per minute
    app = GenerationApp(lambda: expiring)
    app.service, app.gateway = expiring, Gateway(Authenticator(store, refresh_s=3600))

    async def twice() -> list[int]:
        statuses = []
        for _ in range(2):
            status, *_ = await app.respond("POST", "/generate", orjson.dumps({"prompt": "a lamp"}), secret)
            statuses.append(status)
            await asyncio.sleep(0.05)                                    # the refund is queued on the loop
        return statuses

    try:
        assert asyncio.run(twice()) == [503, 503]                        # both expired; the second was not 429
        assert app.gateway.admit(key, "cube3d_conditioning", TOKENS, cost) is None
    finally:
        app.gateway.close()


def test_cli_generate_writes_the_glb_and_prints_the_stage_table(store_repo, tmp_path):
    from click.testing import CliRunner

    from featurectl.cli import Context
    from featurectl.generate_commands import generate

    out = tmp_path / "chair.glb"
    result = CliRunner().invoke(generate, ["a wooden version", "--asset-id", "asset_chair", "--out", str(out),
                                           "--config", "tiny", "--repeat", "2"], obj=Context(store_repo, None))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:4] == b"glTF"
    assert "bbox condition from the asset's features: [1.925, 0.9625, 0.4812]" in result.output
    table = result.output.split("p99 ms")[1]
    for stage in ("fetch", "text", "prefill", "decode", "shape_decode", "meshing", "export", "total"):
        assert f"\n{stage} " in table, stage
    bad = CliRunner().invoke(generate, ["x", "--out", str(tmp_path / "x.stl"), "--config", "tiny"],
                             obj=Context(store_repo, None))
    assert bad.exit_code != 0 and "use a `.glb` file name" in bad.output
