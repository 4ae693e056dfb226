"""`featurectl bench generate`: asset-conditioned Cube 3D generation through the service, latency per stage.

What runs: the generation service (`inference.service`) in this process, fed by client threads: one request at a
time (latency: P50/P99 per stage and end to end), then 8 closed-loop clients (throughput and P99 under dynamic
batching). `peer` is the unoptimized path on the same models in the same run: one request per engine call and
dense occupancy (every grid point), and Feast's own `get_online_features` for the feature fetch.
- CPU (CI-sized, `--device cpu`): the tiny model, a scratch project whose asset features are materialized into the
  real local Redis (`featurectl services up`); every request names an asset, so the fetch is measured inside
  requests, through the serving SDK.
- GPU (the default with CUDA): v0.1 shapes with random weights in bf16 and a random CLIP ViT-L/14-sized text
  tower. The device image has no redis-server: carry one and start it on the port the repo's
  `feature_store.yaml` names (docs/generation.md says how), or pass `--no-store` and take the fetch figures from a
  CPU run's line (`--fetch-from`); `params.fetch` says which.
"""

from __future__ import annotations

import copy
import datetime as dt
import gc
import json
import logging
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import click
import torch

from bench._cli import featurectl

log = logging.getLogger("bench.generate")

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ("a wooden chair", "a red car", "an old stone house", "a tall lamp", "a small blue boat",
           "a metal sword", "a green dragon", "a glass vase")
GOALS = {"fetch_p99_ms": 1.0, "gen_shape_p50_s": 1.5, "gen_shape_p99_s": 2.0, "conc8_p99_vs_one_p99": 3.0}


# ---- the feature store: a scratch project in the real Redis ----------------------------------------------------
def scratch_store(template_repo: Path, folder: Path, n_assets: int) -> tuple[Any, list[str]]:
    """The example repo under a fresh project name, applied to a SQLite registry, with `n_assets` assets' catalog
    rows and 24 h activity materialized into the repo's Redis. Returns (project config, asset ids)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.dataset as ds
    import yaml

    from batch.materialize import materialize_view
    from dsl import load_repo
    from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path
    from feature_repo.sample_data import SampleSpec, catalog_table
    from common.config import load_config
    from redis_store.settings import RedisSettings

    project = f"bench_gen_{uuid.uuid4().hex[:8]}"
    repo = folder / project
    repo.mkdir(parents=True)
    shutil.copy(template_repo / "features.py", repo / "features.py")
    settings = yaml.safe_load((template_repo / "feature_store.yaml").read_text())
    settings.update(project=project)
    settings["registry"]["path"] = f"sqlite:///{folder / project}.db"
    settings["platform"]["data_dir"] = str(folder / "data")
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    featurectl(repo, "apply")
    cfg = load_config(repo)
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    catalog = catalog_table(SampleSpec(n_assets=n_assets), int(now.timestamp() * 1000))
    stamps = pa.array([now - dt.timedelta(hours=1)] * n_assets, pa.timestamp("ms", "UTC"))
    attrs = catalog.drop_columns(["updated_at"]).append_column(EVENT_TIMESTAMP, stamps)
    views = load_repo(repo)
    activity_view = views.view("asset_activity")
    rng = np.random.default_rng(3)
    activity = {"asset_id": catalog.column("asset_id"), EVENT_TIMESTAMP: stamps}
    for name, kind in activity_view.output_schema().items():
        activity[name] = (pa.array(rng.integers(0, 1000, n_assets)) if kind.is_numeric
                          else pa.array([f"user_{i}" for i in range(n_assets)]))
    settings = RedisSettings.from_config(cfg)
    for view_name, table in (("asset_attributes", attrs), ("asset_activity", pa.table(activity))):
        view = views.view(view_name)
        path = offline_table_path(cfg.data_dir, view)
        ds.write_dataset(table, path, format="parquet")
        materialize_view(settings, view, project, path, now - dt.timedelta(days=1), now)
    return cfg, catalog.column("asset_id").to_pylist()


def drop_store(cfg: Any) -> None:
    import redis

    client = redis.Redis(*cfg.redis_host_port)
    suffix = cfg.project.encode()
    for key in client.scan_iter(count=10_000):
        if key.endswith(suffix):
            client.delete(key)


def feast_fetch_ms(cfg: Any, asset_ids: list[str], n: int) -> list[float]:
    """The peer: Feast's own `get_online_features` for the same feature service, one asset per call."""
    from feast import FeatureStore

    store = FeatureStore(config=cfg.feast_repo_config())
    service = store.get_feature_service("cube3d_conditioning")
    store.get_online_features(features=service, entity_rows=[{"asset_id": asset_ids[0]}])
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        store.get_online_features(features=service, entity_rows=[{"asset_id": asset_ids[i % len(asset_ids)]}])
        out.append((time.perf_counter() - t0) * 1e3)
    return out


# ---- load ------------------------------------------------------------------------------------------------------
def one_at_a_time(service, n: int, asset_ids: list[str] | None) -> tuple[list[Any], int]:
    """Sequential requests; returns the results and how many failed."""
    from inference.service import GenerationRequest

    results, errors = [], 0
    for i in range(n):
        asset = asset_ids[(7 * i) % len(asset_ids)] if asset_ids else None
        try:
            results.append(service.generate(GenerationRequest(PROMPTS[i % len(PROMPTS)], asset_id=asset, seed=i)))
        except Exception:  # counted and reported: a benchmark must not hide failures
            log.exception("request %d failed", i)
            errors += 1
    return results, errors


def concurrent(service, clients: int, per_client: int, asset_ids: list[str] | None) -> tuple[list[Any], float]:
    """`clients` threads, each sending its next request when the last one returned; returns results and wall s."""
    from inference.service import GenerationRequest

    results: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for i in range(per_client):
            asset = asset_ids[(31 * c + 7 * i) % len(asset_ids)] if asset_ids else None
            try:
                r = service.generate(GenerationRequest(PROMPTS[(c + i) % len(PROMPTS)], asset_id=asset, seed=c))
            except Exception as exc:  # counted and reported: a benchmark must not hide failures
                with lock:
                    errors.append(exc)
                continue
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        log.error("%d of %d concurrent requests failed, first: %r", len(errors), clients * per_client, errors[0])
    return results, wall


def stage_percentiles(results: list[Any]) -> dict[str, dict[str, float]]:
    """Exact P50/P99 per stage over the results (ms), plus token generation + shape decode."""
    from bench._report import percentiles

    names = sorted({k for r in results for k in r.stages})
    out = {}
    for name in names:
        p = percentiles([r.stages[name] * 1e3 for r in results if name in r.stages], (50, 99))
        out[name] = {"p50_ms": round(p["p50"], 3), "p99_ms": round(p["p99"], 3)}
    gen = [1e3 * (r.stages["prefill"] + r.stages["decode"] + r.stages["shape_decode"]) for r in results]
    p = percentiles(gen, (50, 99))
    out["gen_plus_shape_decode"] = {"p50_ms": round(p["p50"], 3), "p99_ms": round(p["p99"], 3)}
    return out


def p(samples: list[float], q: float) -> float:
    from bench._report import percentiles

    return percentiles(samples, (q,))[f"p{q:g}"]


def run_service(service, n_one: int, clients: int, per_client: int, asset_ids: list[str] | None) -> dict[str, Any]:
    one, one_errors = one_at_a_time(service, n_one, asset_ids)
    many, wall = concurrent(service, clients, per_client, asset_ids)
    totals = [r.stages["total"] for r in one]
    conc = [r.stages["total"] for r in many]
    out = {"one": one, "many": many, "e2e_p50_s": p(totals, 50), "e2e_p99_s": p(totals, 99),
           "conc_p99_s": p(conc, 99), "conc_objects_per_s": len(many) / wall, "one_errors": one_errors,
           "conc_errors": clients * per_client - len(many), "summary": service.stats.summary()}
    log.info("e2e p50 %.3fs p99 %.3fs; %d clients p99 %.3fs, %.2f objects/s; errors %d + %d", out["e2e_p50_s"],
             out["e2e_p99_s"], clients, out["conc_p99_s"], out["conc_objects_per_s"], one_errors, out["conc_errors"])
    return out


# ---- the realistic-surface probe ---------------------------------------------------------------------------------
def surface_probe(pipeline, resolution: int, levels: int) -> dict[str, Any]:
    """Random weights give whatever surface they give; this counts the points coarse-to-fine decoding evaluates for
    a chair-sized surface (a bumpy sphere, radius 0.6, plus a blob) and times the real network on that many."""
    from inference.occupancy import coarse_to_fine, shape_field

    dev = pipeline.device

    def bumpy(points: torch.Tensor) -> torch.Tensor:
        blob = torch.tensor([0.7, 0.0, 0.0], device=points.device)
        return (0.6 - points.norm(dim=-1) + 0.08 * torch.sin(9 * points[:, 0]) * torch.cos(7 * points[:, 1])
                + 0.3 * torch.exp(-((points - blob) ** 2).sum(-1) / 0.01))

    grid = coarse_to_fine(bumpy, resolution, pipeline.shapes.cfg.bounds, dev, levels=levels)
    ids = torch.randint(0, pipeline.shapes.cfg.num_codes, (pipeline.shapes.cfg.num_latents,))
    field = shape_field(pipeline.shapes, ids)
    pts = torch.rand(grid.evaluated, 3, device=dev) * 2 - 1
    chunk = 1 << 19 if dev.type == "cuda" else 1 << 14
    _sync(dev)
    t0 = time.perf_counter()
    with torch.no_grad():
        for start in range(0, pts.shape[0], chunk):
            field(pts[start:start + chunk])
    _sync(dev)
    return {"points": grid.evaluated, "fraction": round(grid.fraction, 4), "network_s": time.perf_counter() - t0}


def hierarchy_check(pipeline, resolution: int, levels: int) -> dict[str, Any]:
    """Coarse to fine against every grid point, on the real network and device: the values at the corners of every
    cube the surface crosses (what marching cubes reads) and the mesh sizes."""
    from inference.mesh import marching_cubes
    from inference.occupancy import cell_points, coarse_to_fine, shape_field, sign_change_cells

    ids = torch.randint(0, pipeline.shapes.cfg.num_codes, (pipeline.shapes.cfg.num_latents,),
                        generator=torch.Generator().manual_seed(5))
    bounds = pipeline.shapes.cfg.bounds
    with torch.no_grad():
        field = shape_field(pipeline.shapes, ids)
        dense = coarse_to_fine(field, resolution, bounds, pipeline.device, levels=0)
        fine = coarse_to_fine(field, resolution, bounds, pipeline.device, levels=levels)
    corners = cell_points(sign_change_cells(dense.values))
    faces = [len(marching_cubes(g.values.cpu().numpy(), bounds)[1]) for g in (dense, fine)]
    return {"resolution": resolution, "levels": levels, "fraction": round(fine.fraction, 4),
            "surface_corners": int(corners.sum()),
            "sign_agreement": float(((dense.values > 0) == (fine.values > 0)).float().mean()),
            "surface_corner_max_abs_diff": float((dense.values - fine.values)[corners].abs().max()),
            "faces_dense": faces[0], "faces_coarse_to_fine": faces[1]}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


# ---- the command -----------------------------------------------------------------------------------------------
def _service(cfg, make_client: Callable | None, pipeline=None):
    from inference.service import GenerationService

    service = GenerationService(cfg, make_client=make_client, pipeline=pipeline)
    service.warm_up()
    gc.collect()
    gc.freeze()  # as the server does after its warm-up
    return service


def _fetch_figures(ours_runs: list[dict], peer_ms: list[float] | None, fetch_from: Path | None,
                   store: bool) -> tuple[dict, dict, dict]:
    if store:
        fetch = [r.stages["fetch"] * 1e3 for run in ours_runs for r in run["one"] + run["many"] if "fetch" in r.stages]
        ours = {"fetch_p99_ms": p(fetch, 99)}
        peer = {"fetch_p99_ms": p(peer_ms, 99)} if peer_ms else {}
        note = {"measured_on": "this run: inside generation requests, serving SDK -> real Redis",
                "samples": len(fetch), "fetch_p50_ms": p(fetch, 50)}
        return ours, peer, note
    if fetch_from is None:
        return {}, {}, {"measured_on": "not measured: no feature store in this run (pass --fetch-from CPU_LINE)"}
    line = json.loads(fetch_from.read_text())
    note = {"measured_on": f"the CPU run of {line['machine']} against its real local Redis (no redis-server on "
                           "this machine); merged from its benchmark line",
            "cpu_params": line["params"].get("fetch")}
    return ({"fetch_p99_ms": line["ours"]["fetch_p99_ms"]},
            {"fetch_p99_ms": line["peer"]["fetch_p99_ms"]} if "fetch_p99_ms" in line["peer"] else {}, note)


@click.command()
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--config", "config_name", default="auto", show_default=True,
              help="service config (`auto`: v0.1 on CUDA, tiny on the CPU)")
@click.option("--requests", "n_one", type=int, default=None, help="one-at-a-time requests (GPU 20, CPU 200)")
@click.option("--clients", type=int, default=8, show_default=True)
@click.option("--per-client", type=int, default=None, help="requests per concurrent client (GPU 4, CPU 25)")
@click.option("--peer-requests", type=int, default=None, help="one-at-a-time requests on the peer path (GPU 5)")
@click.option("--assets", type=int, default=1000, show_default=True, help="assets materialized into Redis")
@click.option("--no-store", is_flag=True, help="no Redis here: requests name no asset; see --fetch-from")
@click.option("--fetch-from", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="a CPU run's JSON line whose fetch figures this run reports (GPU runs without Redis)")
@click.option("--repo", "template", type=click.Path(path_type=Path), default=ROOT / "feature_repo",
              show_default=True, help="the feature repo whose definitions and Redis the scratch project uses")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON line here")
@click.option("--no-results", is_flag=True, help="do not write bench/results/ (GPU runs write it by default)")
def command(device: str, config_name: str, n_one: int | None, clients: int, per_client: int | None,
            peer_requests: int | None, assets: int, no_store: bool, fetch_from: Path | None, template: Path,
            out: Path | None, no_results: bool) -> None:
    """Generation service: fetch, stages, one-at-a-time and 8-client P99, vs one-request-per-call dense decoding."""
    from bench._report import emit
    from inference.service import ServiceConfig, online_store

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    gpu = dev.type == "cuda"
    name = ("v0.1" if gpu else "tiny") if config_name == "auto" else config_name
    cfg = ServiceConfig.from_name(name, device=str(dev), timeout_s=600.0, queue_size=256)
    n_one = n_one or (20 if gpu else 200)
    per_client = per_client or (4 if gpu else 25)
    peer_n = peer_requests or (5 if gpu else 50)
    tmp = Path(tempfile.mkdtemp(prefix="bench-generate-"))
    project, asset_ids, make_client = None, None, None
    try:
        if not no_store:
            project, asset_ids = scratch_store(template, tmp, assets)
            make_client = online_store(project.repo_path, project.registry_url, cfg.feature_timeout_s)
        t0 = time.perf_counter()
        service = _service(cfg, make_client)
        build_s = time.perf_counter() - t0
        ours = run_service(service, n_one, clients, per_client, asset_ids)
        probe = surface_probe(service.pipeline, cfg.resolution, cfg.coarse_levels)
        check = hierarchy_check(service.pipeline, min(cfg.resolution, 7), cfg.coarse_levels)
        log.info("surface probe %s; coarse-to-fine check %s", probe, check)
        service.close()
        peer_pipe = copy.copy(service.pipeline)
        peer_pipe.cfg = replace(cfg, coarse_levels=0, batch_buckets=(1,), mesh_on_device=False,
                                compile_occupancy=False)
        peer_service = _service(peer_pipe.cfg, make_client, peer_pipe)
        peer = run_service(peer_service, peer_n, clients, max(1, per_client // 4 if gpu else per_client // 5),
                           asset_ids)
        peer_service.close()
        feast_ms = feast_fetch_ms(project, asset_ids, 300) if project else None
    finally:
        if project is not None:
            drop_store(project)
        shutil.rmtree(tmp, ignore_errors=True)

    f_ours, f_peer, f_note = _fetch_figures([ours], feast_ms, fetch_from, project is not None)
    line_ours = {**f_ours, "e2e_p50_s": ours["e2e_p50_s"], "e2e_p99_s": ours["e2e_p99_s"],
                 "conc8_p99_s": ours["conc_p99_s"], "conc8_objects_per_s": ours["conc_objects_per_s"]}
    line_peer = {**f_peer, "e2e_p50_s": peer["e2e_p50_s"], "e2e_p99_s": peer["e2e_p99_s"],
                 "conc8_p99_s": peer["conc_p99_s"], "conc8_objects_per_s": peer["conc_objects_per_s"]}
    rnd = lambda d: {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()}  # noqa: E731
    params = _params(dev, cfg, build_s, ours, peer, probe, f_note, n_one, clients, per_client, peer_n)
    params["coarse_to_fine_check"] = check
    card = torch.cuda.get_device_name(dev) if gpu else None
    line = emit("generate", rnd(line_ours), rnd(line_peer), params,
                results_dir=None if no_results or not gpu else RESULTS_DIR, card=card)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(line, indent=1))


def _params(dev, cfg, build_s: float, ours: dict, peer: dict, probe: dict, fetch_note: dict, n_one: int,
            clients: int, per_client: int, peer_n: int) -> dict[str, Any]:
    one = stage_percentiles(ours["one"])
    gen = one["gen_plus_shape_decode"]
    faces = sorted(r.faces for r in ours["one"])
    dense_shape = stage_percentiles(peer["one"]).get("shape_decode", {}).get("p50_ms", float("nan")) / 1e3
    return {
        "device": str(dev), "torch": torch.__version__, "config": cfg.model, "resolution": cfg.resolution,
        "coarse_levels": cfg.coarse_levels, "batch_buckets": list(cfg.batch_buckets),
        "max_batch_wait_ms": cfg.max_batch_wait_ms,
        "weights": "random (decoder std 0.02, bf16 on GPU); random CLIP text tower of the configured shape "
                   "(ViT-L/14: 12 layers, width 768 for v0.1); greedy decoding, guidance on",
        "build_and_warm_up_s": round(build_s, 2),
        "requests": {"one_at_a_time": n_one, "clients": clients, "per_client": per_client, "peer_one": peer_n},
        "fetch": fetch_note,
        "stages_one_at_a_time_ms": one,
        "stages_conc8_ms": stage_percentiles(ours["many"]) if ours["many"] else {},
        "gen_plus_shape_decode_p50_s": round(gen["p50_ms"] / 1e3, 4),
        "gen_plus_shape_decode_p99_s": round(gen["p99_ms"] / 1e3, 4),
        "conc8_p99_vs_one_p99": round(ours["conc_p99_s"] / ours["e2e_p99_s"], 3),
        "errors": {"one_at_a_time": ours["one_errors"], "conc8": ours["conc_errors"],
                   "peer": peer["one_errors"] + peer["conc_errors"]},
        "batch_sizes": ours["summary"]["batch_sizes"],
        "fallbacks": ours["summary"]["fallbacks"],
        "faces_median": faces[len(faces) // 2] if faces else None, "dense_shape_decode_s": round(dense_shape, 4),
        "surface_probe": {**probe, "network_s": round(probe["network_s"], 4),
                          "note": "points a chair-sized surface needs coarse to fine, timed on the real network"},
        "mesh_on_device": cfg.meshes_on_device, "compile_occupancy": cfg.compiles_occupancy,
        "peer_path": "one request per engine call (no batching), dense occupancy (every grid point, eager), "
                     "marching cubes on the host (scikit-image, worker processes), same models; "
                     "fetch peer: Feast's FeatureStore.get_online_features, one asset per call",
        "peer_stages_one_at_a_time_ms": stage_percentiles(peer["one"]),
        "goals": GOALS,
    }


if __name__ == "__main__":
    command()
