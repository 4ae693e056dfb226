"""`featurectl bench cube3d`: Cube 3D decoding, our fast path beside the unoptimized ones, in the same run.

GPU (the default where CUDA is present): random weights in the v0.1 and v0.5 shapes, built directly in bf16 on
the device; modes `fast` (Triton kernels + CUDA graphs), `graph` (PyTorch ops + CUDA graphs), `eager` (KV cache,
no graphs) and `nocache`; batched generation; tokens -> mesh stages; copy bandwidth of the card. `peer` is the
measured eager + KV cache path; the reference implementation's H200 figures (shared/cube3d/FACTS.md) are in
`params.reference_h200`. CPU (`--device cpu --config tiny`): the same code paths on the tiny config, in seconds.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import torch

log = logging.getLogger("bench.cube3d")

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# measured on one H200 for the reference implementation (shared/cube3d/FACTS.md), batch 2 (guidance)
REFERENCE_H200 = {"eager_nocache_tpot_ms": 51.8, "eager_kv_tpot_ms": 21.9, "tpot_ms": 5.11, "tokens_512_s": 2.62,
                  "v05_tpot_ms": 5.19, "v05_tokens_1024_s": 5.31, "copy_gbps": 4250.0, "floor_tpot_ms": 0.45}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth_gbps(device: torch.device, gib: float = 2.0, repeats: int = 10) -> float:
    """Device-to-device copy, bytes read plus bytes written per second (GB/s)."""
    n = int(gib * (1 << 30)) // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    _sync(device)
    return 2 * src.numel() * 4 * repeats / (time.perf_counter() - t0) / 1e9


def prompts(engine, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n random CLIP-like text embeddings (and bboxes) as condition tokens, plus one unconditional row."""
    cfg, gen = engine.cfg, torch.Generator().manual_seed(seed)
    text = torch.randn(n + 1, cfg.text_tokens, cfg.text_model_embed_dim, generator=gen)
    bbox = torch.rand(n + 1, 3, generator=gen) if cfg.use_bbox else None
    if bbox is not None:
        bbox[-1] = 0.0                                          # the unconditional row has a zero bbox
    cond = engine.condition(text, bbox)
    return cond[:n], cond[n:]


def timed_generate(engine, cond, uncond, n_tokens: int, repeats: int, **kw: Any) -> tuple[float, Any, torch.Tensor]:
    """Median wall seconds of `generate` (after one warm-up call that also captures the graphs)."""
    ids = engine.generate(cond, uncond, n_tokens=n_tokens, **kw)
    walls, stats = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ids = engine.generate(cond, uncond, n_tokens=n_tokens, **kw)
        walls.append(time.perf_counter() - t0)
        stats.append(engine.last_stats)
    best = sorted(range(repeats), key=walls.__getitem__)[repeats // 2]
    return walls[best], stats[best], ids


def step_bytes(engine, rows: int, n_tokens: int) -> float:
    """Bytes one decode step must read, averaged over the generation: every decode weight once + the filled KV."""
    m, cfg = engine.model, engine.cfg
    el = next(m.parameters()).element_size()
    weights = sum(t.numel() for lw in m.decode_layers() for t in lw[:10])
    weights += cfg.shape_model_vocab_size * cfg.n_embd
    avg_pos = n_tokens / 2
    per_pos = rows * cfg.n_head * cfg.head_dim * 2                       # k and v, one position
    kv = per_pos * (cfg.n_layer * (cfg.cond_len + avg_pos) + cfg.n_single_layer * avg_pos)
    return (weights + kv) * el


def nocache_tpot_s(engine, n_tokens: int, points: int) -> float:
    """Mean of single no-cache steps at evenly spread positions (the cost grows with the prefix)."""
    positions = [max(1, round((i + 0.5) * n_tokens / points)) for i in range(points)]
    return statistics.mean(engine.time_step(min(p, n_tokens - 1), repeats=3) for p in positions)


def bench_decoder(config: str, device: torch.device, dtype: torch.dtype, n_tokens: int | None, batch: int,
                  quick: bool, tune: bool = False) -> dict[str, Any]:
    """Every mode of one config on the same random weights."""
    from inference.engine import Engine

    gpu = device.type == "cuda"
    t0 = time.perf_counter()
    engine = Engine(config, None, device, dtype, mode="auto", batch_buckets=(1, batch), init_std=0.02)
    n = n_tokens or engine.cfg.n_generated
    r: dict[str, Any] = {"config": config, "tokens": n, "build_s": time.perf_counter() - t0, "mode": engine.mode}
    cond, uncond = prompts(engine, batch)
    if tune and gpu:
        from inference.tuning import tune_in_context

        r["tuned"] = tune_in_context(engine, cond, uncond)
        engine.set_mode("fast")
    reps = 1 if quick else 3
    wall, st, ids = timed_generate(engine, cond[:1], uncond, n, reps)
    r.update(object_s=wall, tpot_ms=st.tpot_ms, prefill_ms=1e3 * st.prefill_s, ids=ids[0])
    if gpu:
        r["persistent_layers"] = bool(getattr(engine.ops, "runs_persistent_layers", False))
        r.update(_optional(r, "per_layer_kernels", _per_layer_kernels, engine, cond, uncond, n, reps))
    wall_b, st_b, _ = timed_generate(engine, cond, uncond, n, 1 if quick else 2)
    r.update(batch=batch, batch_object_s=wall_b, batch_tpot_ms=st_b.tpot_ms, batch_objects_per_s=batch / wall_b)
    r["bytes_per_step"] = step_bytes(engine, 2, n)
    r["achieved_gbps"] = r["bytes_per_step"] / (st.tpot_ms * 1e-3) / 1e9
    r.update(_optional(r, "top_p", _top_p, engine, cond, uncond, n))
    if gpu:
        r.update(_optional(r, "graph_torch", _graph_torch, engine, cond, uncond, n, ids[0]))
    r.update(_eager_modes(engine, cond, uncond, n, batch, quick))
    return r


def _optional(r: dict, name: str, fn, *args) -> dict[str, Any]:
    try:
        return fn(*args)
    except Exception as exc:  # a side measurement must not cost the main figures
        log.exception("%s failed", name)
        return {f"{name}_error": f"{type(exc).__name__}: {exc}"}


def _per_layer_kernels(engine, cond, uncond, n: int, reps: int) -> dict[str, Any]:
    """The same one-prompt generation with 8 kernels a layer (`Launch.persistent_layers=False`), in the same
    process: the step before the persistent launch, for the ratio."""
    launch = engine.launch
    engine.launch = dataclasses.replace(launch, persistent_layers=False)
    engine.set_mode("fast")
    try:
        wall, st, _ = timed_generate(engine, cond[:1], uncond, n, reps)
    finally:
        engine.launch = launch
        engine.set_mode("fast")
    return {"per_layer_kernels_object_s": wall, "per_layer_kernels_tpot_ms": st.tpot_ms}


def _top_p(engine, cond, uncond, n: int) -> dict[str, Any]:
    wall, st, _ = timed_generate(engine, cond[:1], uncond, n, 1, top_p=0.9, seed=7)
    return {"top_p_object_s": wall, "top_p_tpot_ms": st.tpot_ms}


def _graph_torch(engine, cond, uncond, n: int, fast_ids: torch.Tensor) -> dict[str, Any]:
    """The same step in plain PyTorch ops, captured in CUDA graphs: what the fused kernels add."""
    engine.set_mode("graph")
    _, st, ids = timed_generate(engine, cond[:1], uncond, n, 1)
    return {"graph_torch_tpot_ms": st.tpot_ms, "graph_torch_same_ids": float((ids[0] == fast_ids).float().mean())}


def _eager_modes(engine, cond, uncond, n: int, batch: int, quick: bool) -> dict[str, Any]:
    """The unoptimized paths: eager with the KV cache (a short run) and full recomputation (spread steps)."""
    engine.set_mode("eager")
    short = min(n, 8 if quick else 48)
    _, st, _ = timed_generate(engine, cond[:1], uncond, short, 1)
    _, st_b, _ = timed_generate(engine, cond, uncond, min(n, 8 if quick else 16), 1)
    out = {"eager_kv_tpot_ms": st.tpot_ms, "eager_kv_prefill_ms": 1e3 * st.prefill_s,
           "eager_kv_batch_tpot_ms": st_b.tpot_ms, "eager_kv_batch_prefill_ms": 1e3 * st_b.prefill_s}
    engine.set_mode("nocache")
    out["eager_nocache_tpot_ms"] = 1e3 * nocache_tpot_s(engine, n, 2 if quick else 4)
    return out


def bench_fp8(config: str, device: torch.device, dtype: torch.dtype, n_tokens: int | None, quick: bool,
              prompts_n: int = 4) -> dict[str, Any]:
    """Weight-only FP8 decode (`inference.fp8`) beside the same random weights unquantized: TPOT of one prompt
    with guidance, and the error it costs: teacher-forced logits on the unquantized model's greedy ids, and greedy
    ids with guidance, for `prompts_n` prompts."""
    from inference.engine import Engine

    engines = {name: Engine(config, None, device, dtype, mode="auto", batch_buckets=(1, prompts_n), init_std=0.02,
                            fp8_weights=name == "fp8") for name in ("plain", "fp8")}
    plain, fp8 = engines["plain"], engines["fp8"]
    n = n_tokens or plain.cfg.n_generated
    cond, uncond = prompts(plain, prompts_n)
    out: dict[str, Any] = {"config": config, "tokens": n, "mode": fp8.mode, "dtype": str(dtype).split(".")[-1]}
    for name, engine in engines.items():
        _, st, _ = timed_generate(engine, cond[:1], uncond, n, 1 if quick else 3)
        out[f"{name}_tpot_ms"] = st.tpot_ms
    if fp8.mode == "fast":             # the H200 tables were chosen for bf16 tiles: choose FP8's on this card
        from inference.tuning import FP8_FACTORS, tune_in_context

        out["fp8_tuning"] = tune_in_context(fp8, cond, uncond, factors=FP8_FACTORS)
        _, st, _ = timed_generate(fp8, cond[:1], uncond, n, 1 if quick else 3)
        out["fp8_tuned_tpot_ms"] = st.tpot_ms
    out.update(fp8_error(plain, fp8, cond, uncond, n))
    matrices = sum(w.numel() for lw in plain.model.decode_layers() for w in (lw.qkv_w, lw.proj_w, lw.gu_w, lw.down_w))
    out["plain_bytes_per_step"] = step_bytes(plain, 2, n)
    out["fp8_bytes_per_step"] = out["plain_bytes_per_step"] - matrices * plain.model.lm_head.weight.element_size() \
        + fp8.fp8.nbytes
    best = min(out["fp8_tpot_ms"], out.get("fp8_tuned_tpot_ms", float("inf")))
    out["fp8_achieved_gbps"] = out["fp8_bytes_per_step"] / (best * 1e-3) / 1e9
    return out


def fp8_error(plain, fp8, cond: torch.Tensor, uncond: torch.Tensor, n: int) -> dict[str, Any]:
    """What FP8 changes: greedy ids with guidance (agreement, first position that differs per prompt) and the
    teacher-forced logits on the unquantized model's ids (relative error, argmax agreement)."""
    from inference.fp8 import teacher_forced_error

    ids = {name: engine.generate(cond, uncond, n_tokens=n) for name, engine in (("plain", plain), ("fp8", fp8))}
    same = ids["plain"] == ids["fp8"]
    first = [int(row.logical_not().nonzero()[0]) if not row.all() else n for row in same]
    err = teacher_forced_error(plain.model, fp8.model, cond, ids["plain"].to(cond.device))
    return {"greedy_id_agreement": float(same.float().mean()), "greedy_first_difference": first,
            "teacher_forced_logits_rel_err": err["logits_rel_err"],
            "teacher_forced_argmax_agreement": err["argmax_agreement"]}


def fp8_reference(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """`fp8_error` on the tiny reference checkpoint and condition vectors of the tests (tests/data/cube3d)."""
    from safetensors.torch import load_file

    from inference.engine import Engine

    path = Path(__file__).resolve().parent.parent / "tests" / "data" / "cube3d" / "tiny_reference.safetensors"
    cond = load_file(str(path))["expected.cond"].to(device, dtype)
    plain, fp8 = (Engine("tiny", path, device, dtype, weights_prefix="model.", fp8_weights=q) for q in (False, True))
    return {"dtype": str(dtype).split(".")[-1], "mode": fp8.mode,
            **fp8_error(plain, fp8, cond[0:1], cond[1:2], plain.cfg.n_generated)}


def bench_mesh(config: str, device: torch.device, dtype: torch.dtype, ids: torch.Tensor, resolution: int,
               quick: bool) -> dict[str, Any]:
    """Tokens -> occupancy grid -> marching cubes -> GLB and OBJ, each stage timed (random tokenizer weights). On
    CUDA marching cubes runs on the device; the same grid then goes through scikit-image on the host (the peer
    path), and the two surfaces are compared (face counts, vertex distance in cells)."""
    from inference.errors import MeshError
    from inference.mesh import ShapeDecoder

    dec = ShapeDecoder(config, None, device, dtype, init_std=0.02)
    n = dec.cfg.num_latents
    ids = ids[:n] if ids.numel() >= n else torch.randint(0, dec.cfg.num_codes, (n,))
    dec.occupancy_grid(ids, resolution=min(resolution, 4))                 # warm-up (kernels, allocator)
    grid = dec.occupancy_grid(ids, resolution=resolution)
    if not grid.min() < 0 < grid.max():
        # random weights: move the level so the zero crossing exists (the released weights need no such step)
        dec.model.occupancy_decoder.c_head.bias -= grid.median().to(dtype)
    try:
        if device.type == "cuda":
            dec.decode_mesh(ids, resolution=resolution)                     # warm-up of the device mesh path
        mesh = dec.decode_mesh(ids, resolution=resolution)
    except MeshError as exc:
        return {"error": str(exc)}
    with tempfile.TemporaryDirectory() as tmp:
        files = (mesh.export(Path(tmp) / f"object.{s}") for s in ("glb", "obj"))
        sizes = {p.suffix[1:]: p.stat().st_size for p in files}
    st = mesh.stages
    out = {"resolution": resolution, "grid_points": (2 ** resolution + 1) ** 3, "vertices": len(mesh.vertices),
           "faces": len(mesh.faces), "file_bytes": sizes, "stages_s": {k: round(v, 4) for k, v in st.items()},
           "mesh_on_device": device.type == "cuda",
           "shape_decode_s": st["latents"] + st["occupancy"], "total_s": sum(st.values())}
    if device.type == "cuda":
        out["host_path"] = host_mesh_check(dec.occupancy_grid(ids, resolution=resolution), dec.cfg.bounds, mesh)
    return out


def host_mesh_check(grid: torch.Tensor, bounds: float, device_mesh) -> dict[str, Any]:
    """The peer path on the same grid (copy to the host, scikit-image's Lewiner marching cubes, trimesh's GLB),
    timed, and how far the device surface is from it and from scikit-image's classic method (its table)."""
    import numpy as np
    from scipy.spatial import cKDTree
    from skimage import measure

    from inference.mesh import Mesh, marching_cubes

    t0 = time.perf_counter()
    host = grid.cpu().numpy()
    t1 = time.perf_counter()
    verts, faces = marching_cubes(host, bounds)
    t2 = time.perf_counter()
    Mesh(verts, faces).to_trimesh().export(file_type="glb")
    t3 = time.perf_counter()
    cell = 2 * bounds / grid.shape[0]
    dist, _ = cKDTree(verts).query(device_mesh.vertices)
    classic_verts, classic_faces, _, _ = measure.marching_cubes(host, 0.0, method="lorensen")
    return {"classic_vertices": len(classic_verts), "classic_faces": len(classic_faces),
            "device_faces_minus_classic": len(device_mesh.faces) - len(classic_faces),
            "device_vertices_minus_classic": len(device_mesh.vertices) - len(classic_verts),
            "to_host_s": round(t1 - t0, 4), "marching_cubes_s": round(t2 - t1, 4), "trimesh_glb_s": round(t3 - t2, 4),
            "vertices": len(verts), "faces": len(faces),
            "device_faces_minus_host_pct": round(100 * (len(device_mesh.faces) - len(faces)) / len(faces), 4),
            "device_vertex_to_host_max_cells": round(float(dist.max()) / cell, 6),
            "device_vertex_to_host_p99_cells": round(float(np.percentile(dist, 99)) / cell, 6)}


def _ours_and_peer(v01: dict, v05: dict | None, mesh: dict | None) -> tuple[dict, dict]:
    ours = {"tpot_ms": v01["tpot_ms"], "tokens_512_s": v01["object_s"],
            "v05_tokens_1024_s": v05["object_s"] if v05 else None,
            "batch8_objects_per_s": v01["batch_objects_per_s"],
            "eager_nocache_tpot_ms": v01["eager_nocache_tpot_ms"], "eager_kv_tpot_ms": v01["eager_kv_tpot_ms"],
            "achieved_gbps": v01["achieved_gbps"], "shape_decode_s": mesh.get("shape_decode_s") if mesh else None,
            "v05_tpot_ms": v05["tpot_ms"] if v05 else None}
    n = v01["tokens"]
    # the eager + KV path, measured on a short run in this process, extended to a whole object
    kv_object = (v01["eager_kv_prefill_ms"] + (n - 1) * v01["eager_kv_tpot_ms"]) / 1e3
    kv_batch = (v01["eager_kv_batch_prefill_ms"] + (n - 1) * v01["eager_kv_batch_tpot_ms"]) / 1e3
    peer = {"tpot_ms": v01["eager_kv_tpot_ms"], "tokens_512_s": kv_object,
            "batch8_objects_per_s": v01["batch"] / kv_batch,
            "achieved_gbps": v01["bytes_per_step"] / (v01["eager_kv_tpot_ms"] * 1e-3) / 1e9}
    if v05:
        peer["v05_tokens_1024_s"] = (v05["eager_kv_prefill_ms"] + (v05["tokens"] - 1) * v05["eager_kv_tpot_ms"]) / 1e3
    ours, peer = ({k: v for k, v in side.items() if v is not None} for side in (ours, peer))
    return _rounded(ours), _rounded(peer)


def _rounded(d: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}


def _params(device: torch.device, v01: dict, v05: dict | None, mesh: dict | None, copy_gbps: float | None,
            errors: dict[str, str]) -> dict[str, Any]:
    def strip(d: dict) -> dict:
        return _rounded({k: v for k, v in d.items() if k != "ids"})

    p: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "weights": "random (std 0.02)",
                         "guidance": "batch 2 per prompt (cond + uncond)", "v01": strip(v01)}
    if v05:
        p["v05"] = strip(v05)
    if mesh:
        p["mesh"] = mesh
    one = 1.0 / v01["object_s"]
    p["batch8_vs_one_prompt_objects_per_s"] = round(v01["batch_objects_per_s"] / one, 3)
    if copy_gbps:
        p["copy_gbps"] = round(copy_gbps, 1)
        p["achieved_vs_copy"] = round(v01["achieved_gbps"] / copy_gbps, 3)
        p["floor_tpot_ms"] = round(v01["bytes_per_step"] / (copy_gbps * 1e9) * 1e3, 4)
    if device.type == "cuda":
        p["reference_h200"] = REFERENCE_H200
        p["speedup_vs_reference_fast_path"] = round(REFERENCE_H200["tpot_ms"] / v01["tpot_ms"], 2)
    if errors:
        p["errors"] = errors
    return p


def step_kernels(events: list[dict], marker: str = "FillFunctor") -> dict[str, Any]:
    """One decode step's kernels from a chrome trace (torch.profiler over graph replays): the step's span (first
    start to last end), busy time (union of kernel intervals), kernel count, and per kernel (name, grid) its count,
    mean time and `us_added`: how far it moved the step's end (its end past every earlier kernel's end), which
    under PDL, where kernels start early and wait, says what it costs the chain; largest first; means over the
    steps, which `marker` kernels (the position fill before each replay) separate."""
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    steps: list[list[dict]] = [[]]
    for e in kernels:
        if marker in e["name"]:
            steps.append([])
        else:
            steps[-1].append(e)
    steps = [s for s in steps if s]
    if not steps:
        raise ValueError(f"no kernels between `{marker}` kernels in the trace: was a graph replayed?")
    spans, busy, groups = [], [], {}
    for step in steps:
        spans.append(max(e["ts"] + e["dur"] for e in step) - step[0]["ts"])
        covered, end = 0.0, float("-inf")
        for e in step:                                   # sorted by start: union of the intervals
            lo, hi = max(e["ts"], end), e["ts"] + e["dur"]
            covered += max(0.0, hi - lo)
            end = max(end, hi)
        busy.append(covered)
        last_end = step[0]["ts"]
        for e in step:
            key = (e["name"].split("(")[0][:60], tuple(e.get("args", {}).get("grid", ())))
            added = max(0.0, e["ts"] + e["dur"] - last_end)
            last_end += added
            groups.setdefault(key, []).append((e["dur"], added))
    n = len(steps)
    rows = [{"kernel": name, "grid": list(grid), "per_step": round(len(d) / n, 2),
             "us_each": round(statistics.mean(t for t, _ in d), 2), "us_per_step": round(sum(t for t, _ in d) / n, 1),
             "us_added": round(sum(a for _, a in d) / n, 1)}
            for (name, grid), d in groups.items()]
    rows.sort(key=lambda r: -r["us_added"])
    return {"steps": n, "kernels_per_step": round(sum(map(len, steps)) / n, 1),
            "span_us": round(statistics.median(spans), 1), "busy_us": round(statistics.median(busy), 1),
            "kernels": rows}


def profile_steps(config: str, device: torch.device, dtype: torch.dtype, position: int,
                  replays: int = 20) -> dict[str, Any]:
    """Where a fast-path decode step's time goes: its kernels in the CUDA graph with PDL on (as it runs: the
    kernels overlap, the span counts) and off (each kernel's own time, no overlap), one prompt with guidance."""
    from torch.profiler import ProfilerActivity, profile

    from inference.engine import Engine

    engine = Engine(config, None, device, dtype, mode="fast", init_std=0.02)
    cond, uncond = prompts(engine, 1)
    _, st, _ = timed_generate(engine, cond, uncond, engine.cfg.n_generated, 3)
    out: dict[str, Any] = {"config": config, "position": position, "tpot_ms": round(st.tpot_ms, 4)}
    for pdl in (True, False):
        engine.launch.pdl = pdl
        engine.set_mode("fast")
        engine.time_step(position, repeats=3)                       # capture and warm the graph
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.time_step(position, repeats=replays)
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace))
            events = json.loads(trace.read_text())["traceEvents"]
        out["pdl_on" if pdl else "pdl_off"] = step_kernels(events)
        out[f"step_ms_pdl_{'on' if pdl else 'off'}"] = round(1e3 * engine.time_step(position, repeats=21), 4)
    return out


def _section(name: str, errors: dict[str, str], fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # keep the rest of the run: the JSON line says what failed
        log.exception("%s failed", name)
        errors[name] = f"{type(exc).__name__}: {exc}"
        return None


@click.command()
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--config", "config", type=click.Choice(["auto", "tiny", "v0.1", "all"]), default="auto",
              show_default=True, help="`all` = v0.1 and v0.5 (the GPU run); `auto` = all on CUDA, tiny on the CPU")
@click.option("--tokens", type=int, default=None, help="tokens per object (default: the config's)")
@click.option("--batch", type=int, default=8, show_default=True, help="prompts in the batched run")
@click.option("--resolution", type=int, default=None, help="mesh grid 2^r + 1 per axis (default 8 on CUDA, 4 on CPU)")
@click.option("--quick", is_flag=True, help="fewer repeats (smoke test)")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON line here")
@click.option("--no-results", is_flag=True, help="do not write bench/results/ (GPU runs write it by default)")
@click.option("--fp8", "fp8", is_flag=True, help="also measure the weight-only FP8 decode mode (TPOT and its error "
              "against the unquantized weights: random full-size weights and the tests' tiny reference)")
@click.option("--profile", "profile_at", type=int, default=None, help="GPU: only profile one decode step at this "
              "position (kernels in the CUDA graph, PDL on and off) and print that as JSON")
@click.option("--tune", is_flag=True, help="GPU: choose kernel launch parameters by whole-step timings on this card "
              "first (inference.tuning), and use them in this run")
def command(device: str, config: str, tokens: int | None, batch: int, resolution: int | None, quick: bool,
            out: Path | None, no_results: bool, fp8: bool, tune: bool, profile_at: int | None) -> None:
    """Cube 3D decode: fast path vs eager (+KV) vs no-cache, batched throughput, mesh stages."""
    from bench._report import emit

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    gpu = dev.type == "cuda"
    config = ("all" if gpu else "tiny") if config == "auto" else config
    dtype = torch.bfloat16 if gpu else torch.float32
    resolution = resolution or (8 if gpu else 4)
    if profile_at is not None:
        result = profile_steps("tiny" if config == "tiny" else "v0.1", dev, dtype, profile_at)
        text = json.dumps(result, indent=1)
        out.write_text(text) if out is not None else None
        click.echo(text)
        return
    errors: dict[str, str] = {}
    copy = _section("copy_bandwidth", errors, copy_bandwidth_gbps, dev) if gpu else None
    first = "tiny" if config == "tiny" else "v0.1"
    v01 = bench_decoder(first, dev, dtype, tokens, batch, quick, tune)
    torch.cuda.empty_cache() if gpu else None
    fp8_line = None
    if fp8:
        fp8_line = _section("fp8", errors, bench_fp8, first, dev, dtype, tokens, quick) or {}
        fp8_line["reference_tiny"] = _section("fp8_reference", errors, fp8_reference, dev, dtype)
        torch.cuda.empty_cache() if gpu else None
    v05 = _section("v0.5", errors, bench_decoder, "v0.5", dev, dtype, None, batch, quick) if config == "all" else None
    mesh = _section("mesh", errors, bench_mesh, first, dev, dtype, v01["ids"], resolution, quick)
    ours, peer = _ours_and_peer(v01, v05, mesh)
    card = torch.cuda.get_device_name(dev) if gpu else None
    params = _params(dev, v01, v05, mesh, copy, errors)
    if fp8_line is not None:
        params["fp8"] = fp8_line
    line = emit("cube3d", ours, peer, params,
                results_dir=None if no_results or not gpu else RESULTS_DIR, card=card)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(line, indent=1))


if __name__ == "__main__":
    command()
