"""Issue 21's persistent-kernel experiment: one layer's MLP half as the engine launches it (four kernels under PDL)
against one persistent launch with grid barriers (`inference.persistent_mlp`), in CUDA graphs on the GPU.

`python3 -m bench.cube3d_persistent --out result.json` (on a GPU through the device tool). v0.1 shapes, one prompt
with guidance (2 rows), random weights (std 0.02), a chain of 24 layers with their own weights (so they stream
from DRAM, as in a decode step) captured once per variant and replayed, rounds interleaved; the median replay over
all rounds divided by the layers. The results' error against the engine's kernels in float32 and bf16.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict

import torch

from inference.config import Cube3DConfig
from inference.persistent_mlp import MlpPlan, MlpScratch, _mlp_half_kernel, mlp_half
from inference.triton_ops import Launch, TritonOps

PLANS = {
    "p128_n16_k512_w8": MlpPlan(),
    "p128_n16_k256_w8": MlpPlan(gu_k=256, down_k=256),
    "p128_n16_k256_w4": MlpPlan(gu_k=256, down_k=256, warps=4),
    "p128_n16_k512_w16": MlpPlan(warps=16),
    "p96_n32_k256_w8": MlpPlan(programs=96, gu_cols=32, down_cols=32, gu_k=256, down_k=256),
    "p96_n32_k512_w8": MlpPlan(programs=96, gu_cols=32, down_cols=32),
    "p96_n32_k256_w4": MlpPlan(programs=96, gu_cols=32, down_cols=32, gu_k=256, down_k=256, warps=4),
    "p64_n32_k256_w8": MlpPlan(programs=64, gu_cols=32, down_cols=32, gu_k=256, down_k=256),
    "p96_n64_k128_w8": MlpPlan(programs=96, gu_cols=64, down_cols=64, gu_k=128, down_k=128),
    "p96_n32_k256_w8_s3": MlpPlan(programs=96, gu_cols=32, down_cols=32, gu_k=256, down_k=256, stages=3),
    "p128_n16_k256_w4_s3": MlpPlan(gu_k=256, down_k=256, warps=4, stages=3),
    "p96_n32_k128_w4_s4": MlpPlan(programs=96, gu_cols=32, down_cols=32, gu_k=128, down_k=128, warps=4, stages=4),
    "p128_n16_k256_w8_fma": MlpPlan(gu_k=256, down_k=256, dot=False),
    "p128_n16_k512_w8_fma": MlpPlan(dot=False),
}


def _layers(cfg: Cube3DConfig, n: int, dtype: torch.dtype, device: str) -> list[tuple[torch.Tensor, ...]]:
    d, f = cfg.n_embd, cfg.mlp_hidden
    g = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * 0.02).to(dtype)
    return [(rnd(2 * f, d), rnd(2 * f), rnd(d, f), rnd(d)) for _ in range(n)]


def _chains(layers, pp, pb, eps, plan: MlpPlan | None, launches: tuple[int, ...] = (7,), piece: str = "all"):
    """The MLP halves of all layers in order, on x in place: the engine's kernels (plan None; `piece` one of them
    alone, on fixed inputs) or the persistent one (`launches` as `mlp_half` takes them)."""
    ops = TritonOps(Launch())
    rows, d, f = pp.shape[1], pp.shape[2], layers[0][2].shape[1]
    scratch = None if plan is None else MlpScratch(rows, d, f, plan, layers[0][0].dtype, pp.device)
    h0 = torch.randn(rows, d, device=pp.device).to(layers[0][0].dtype)
    act0 = torch.randn(rows, f, device=pp.device).to(layers[0][0].dtype)

    def run(x: torch.Tensor) -> torch.Tensor:
        h = x
        for gw, gb, dw, db in layers:
            if plan is not None:
                h = mlp_half(x, pp, pb, gw, gb, dw, db, eps, plan, scratch, launches)
            elif piece == "ln":
                h = ops.residual_layer_norm(x, pp, pb, eps)
            elif piece == "gate_up":
                h = ops.linear_swiglu(h0, gw, gb)
            elif piece == "down":
                h = ops.linear_parts(act0, dw)
            else:
                h = ops.residual_layer_norm(x, pp, pb, eps)
                h = ops.residual_layer_norm(x, ops.linear_parts(ops.linear_swiglu(h, gw, gb), dw), db, eps)
        return h
    return run


def _graph(run, x: torch.Tensor) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(x)
        run(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(x)
    return graph


def _replays_us(graph: torch.cuda.CUDAGraph, n: int) -> list[float]:
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [1000.0 * s.elapsed_time(e) for s, e in events]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def errors(cfg: Cube3DConfig, plans: dict[str, MlpPlan], dtype: torch.dtype, n_layers: int) -> dict:
    """Relative error (norm) of h and x after 1 and `n_layers` MLP halves against the engine's kernels."""
    layers = _layers(cfg, n_layers, dtype, "cuda")
    pp = torch.randn(3, 2, cfg.n_embd, device="cuda")
    pb = (torch.randn(cfg.n_embd, device="cuda") * 0.02).to(dtype)
    x0 = torch.randn(2, cfg.n_embd, device="cuda").to(dtype)
    out = {}
    for depth in (1, n_layers):
        xa = x0.clone()
        ha = _chains(layers[:depth], pp, pb, cfg.eps, None)(xa)
        for name, plan in plans.items():
            xb = x0.clone()
            hb = _chains(layers[:depth], pp, pb, cfg.eps, plan)(xb)
            out[f"{name}_layers{depth}"] = {"h": _rel(hb, ha), "x": _rel(xb, xa)}
    return out


def timings(cfg: Cube3DConfig, plans: dict[str, MlpPlan], n_layers: int, rounds: int, replays: int,
            breakdown: tuple[str, ...] = ()) -> dict:
    """Median microseconds per layer's MLP half for each variant, rounds interleaved; for the plans in `breakdown`
    also each phase as a launch of its own, and the engine's kernels one kind at a time."""
    layers = _layers(cfg, n_layers, torch.bfloat16, "cuda")
    pp = torch.randn(3, 2, cfg.n_embd, device="cuda")
    pb = (torch.randn(cfg.n_embd, device="cuda") * 0.02).to(torch.bfloat16)
    x0 = torch.randn(2, cfg.n_embd, device="cuda").to(torch.bfloat16)
    x = x0.clone()
    variants: dict[str, tuple] = {"engine_4_kernels": (None, (7,), "all")}
    variants.update({f"persistent_{k}": (p, (7,), "all") for k, p in plans.items()})
    for piece in breakdown and ("ln", "gate_up", "down"):
        variants[f"engine_only_{piece}"] = (None, (7,), piece)
    for k in breakdown:
        for launches in ((1, 2, 4), (1,), (2,), (4,)):
            variants[f"launches_{'_'.join(map(str, launches))}_{k}"] = (plans[k], launches, "all")
    graphs = {name: _graph(_chains(layers, pp, pb, cfg.eps, *v), x) for name, v in variants.items()}
    samples: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            x.copy_(x0)
            samples[name] += _replays_us(graph, replays)
    return {name: {"median_us_per_layer": statistics.median(s) / n_layers,
                   "min_us_per_layer": min(s) / n_layers, "replays": len(s)} for name, s in samples.items()}


def compiled() -> list[str]:
    """Registers and spills of each compiled persistent kernel (for reading the timings), as Triton reports them."""
    out = []
    try:
        for cache in _mlp_half_kernel.device_caches.values():
            for key, kernel in cache[0].items():
                out.append(f"regs {kernel.n_regs} spills {kernel.n_spills} warps {kernel.metadata.num_warps}: {key}")
    except (AttributeError, TypeError, IndexError) as exc:     # Triton's cache layout differs by version
        out.append(f"not read: {exc!r}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replays", type=int, default=60)
    parser.add_argument("--plans", default=",".join(PLANS))
    parser.add_argument("--breakdown", default="", help="plans to time phase by phase too (comma-separated)")
    parser.add_argument("--no-errors", action="store_true")
    args = parser.parse_args()
    cfg = Cube3DConfig.from_name("v0.1")
    plans = {k: PLANS[k] for k in args.plans.split(",")}
    result = {"device": torch.cuda.get_device_name(), "config": "v0.1", "rows": 2, "layers": args.layers,
              "plans": {k: asdict(p) for k, p in plans.items()},
              "weight_bytes_per_layer": 3 * cfg.n_embd * cfg.mlp_hidden * 2}
    f32_plans = dict(list(plans.items())[:2])
    for key, dtype, depth, which in () if args.no_errors else (("error_bf16", torch.bfloat16, 24, plans),
                                     ("error_float32", torch.float32, 4, f32_plans)):
        result[key] = errors(cfg, which, dtype, depth)
        print(key, json.dumps(result[key]), flush=True)
    breakdown = tuple(k for k in args.breakdown.split(",") if k)
    result["timings"] = timings(cfg, plans, args.layers, args.rounds, args.replays, breakdown)
    result["compiled"] = compiled()
    print(json.dumps(result["timings"], indent=1), flush=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
