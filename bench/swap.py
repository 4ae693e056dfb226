"""`featurectl bench swap`: a promote under steady load, as `generate-server --model models:/NAME@champion` serves.

Two random-weight decoder checkpoints of one config (seeds 0 and 1; v0.1 shapes in bf16 on CUDA, the tiny config on
the CPU) are registered as versions 1 and 2 of a model in a scratch model registry (MLflow on SQLite); version 1 is
promoted champion and served through `inference.service.rollout.Rollout`, the object generate-server serves, built
the way the server builds each version (a service, then its warm-up, which captures the CUDA graphs on a GPU).
`--clients` closed-loop clients send requests the whole run; after `--before-s` version 2 is promoted, and the run
goes on until version 2 has answered for `--after-s`.
- `swap_s`: from the rollout's poll first seeing version 2 under `champion` to version 2's first answer (the file's
  SHA-256 check, the load, the warm-up with its graph capture, the switch, one request); `load_and_warm_up_s` is
  the build alone, `seen_after_promote_s` how long the poll took to notice (at most `--poll-s`).
- `swap_failed_requests`: requests that failed from the promote to the end (goal 0); `failed_requests`: all.
- `p99_s`: end-to-end p99 of the requests admitted during the swap (seen to first answer of version 2); the peer's
  `p99_s` is that of the requests admitted outside it, on the same load in the same run.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import click
import torch

from bench._report import emit, percentiles

log = logging.getLogger("bench.swap")

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MODEL = "bench_swap"
PROMPTS = ("a wooden chair", "a red car", "an old stone house", "a tall lamp")
GOALS = {"swap_failed_requests": 0}


@dataclass
class Answer:
    admitted: float
    done: float
    answered_by: Optional[str]     # the version that answered it; None when it failed


def write_checkpoints(config: str, folder: Path, device: torch.device) -> list[Path]:
    """Two decoder checkpoints of `config` with random weights (seeds 0 and 1), as `models register` reads them."""
    from safetensors.torch import save_file

    from inference.config import Cube3DConfig
    from inference.engine import build_decoder

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    paths = []
    for seed in (0, 1):
        model = build_decoder(Cube3DConfig.from_name(config), None, device, dtype, seed=seed,
                              init_std=0.02 if device.type == "cuda" else 0.1)
        path = folder / f"{config}_seed{seed}.safetensors"
        save_file({k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}, str(path),
                  metadata={"cube3d_config": config})
        paths.append(path)
        del model
    return paths


class Timeline:
    """When the rollout saw version 2 under `champion` and how long its build took, from its own callbacks."""

    def __init__(self, registry, new_version: int):
        self.registry, self.new_version = registry, new_version
        self.seen: Optional[float] = None
        self.builds: list[tuple[float, float]] = []      # (construct s, warm-up s) of each version built

    def resolve(self, alias: str):
        version = self.registry.resolve(MODEL, alias)
        if version is not None and version.version == self.new_version and self.seen is None:
            self.seen = time.perf_counter()
        return version

    def build(self, cfg):
        from inference.service import GenerationService

        t0 = time.perf_counter()
        service = GenerationService(cfg)
        t1 = time.perf_counter()
        service.warm_up()
        self.builds.append((t1 - t0, time.perf_counter() - t1))
        return service


def steady_load(rollout, clients: int, stop: threading.Event, answers: list[Answer]) -> list[threading.Thread]:
    """`clients` threads, each sending its next request when the last one settled, until `stop`."""
    from inference.service import GenerationRequest

    lock = threading.Lock()

    def client(c: int) -> None:
        i = 0
        while not stop.is_set():
            request = GenerationRequest(PROMPTS[(c + i) % len(PROMPTS)], seed=i)
            admitted = time.perf_counter()
            try:
                answered = rollout.submit(request).result().model_version
            except Exception as exc:  # counted and reported: a benchmark must not hide failures
                log.error("request failed: %r", exc)
                answered = None
            with lock:
                answers.append(Answer(admitted, time.perf_counter(), answered))
            i += 1

    threads = [threading.Thread(target=client, args=(c,), name=f"swap-client-{c}") for c in range(clients)]
    for t in threads:
        t.start()
    return threads


def _first_answer(answers: list[Answer], label: str) -> Optional[float]:
    return min((a.done for a in answers if a.answered_by == label), default=None)


def run_swap(cfg, folder: Path, clients: int, before_s: float, after_s: float, poll_s: float,
             limit_s: float) -> dict[str, Any]:
    """Register, serve, promote under load; the raw timeline and answers."""
    from inference.registry import ModelRegistry, verify_checkpoint
    from inference.service.rollout import Rollout

    t0 = time.perf_counter()
    paths = write_checkpoints(cfg.model, folder, torch.device(cfg.device))
    checkpoints_s = time.perf_counter() - t0
    registry = ModelRegistry(f"sqlite:///{folder / 'registry.db'}")
    versions = [registry.register(MODEL, verify_checkpoint(p)) for p in paths]
    registry.promote(MODEL, versions[0].version, "champion")
    timeline = Timeline(registry, versions[1].version)
    rollout = Rollout(cfg, timeline.resolve, timeline.build, poll_s=poll_s)
    old, new = versions[0].label, versions[1].label
    answers: list[Answer] = []
    stop = threading.Event()
    threads = steady_load(rollout, clients, stop, answers)
    try:
        time.sleep(before_s)
        promoted = time.perf_counter()
        registry.promote(MODEL, versions[1].version, "champion")
        deadline = promoted + limit_s
        while (_first_answer(answers, new) is None or time.perf_counter() < _first_answer(answers, new) + after_s) \
                and time.perf_counter() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
        rollout.close()
    return {"answers": answers, "promoted": promoted, "seen": timeline.seen, "builds": timeline.builds,
            "first_new": _first_answer(answers, new), "old": old, "new": new, "checkpoint_mb":
            round(paths[0].stat().st_size / 2 ** 20, 1), "checkpoints_s": checkpoints_s}


def figures(run: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """ours, peer and the params' timing of one swap run."""
    answers, seen, first_new = run["answers"], run["seen"], run["first_new"]
    if seen is None or first_new is None:
        raise click.ClickException(f"{run['new']} never answered: the rollout did not switch within the run "
                                   "(see the log above); raise --limit-s")
    during = [a.done - a.admitted for a in answers if seen <= a.admitted <= first_new and a.answered_by]
    outside = [a.done - a.admitted for a in answers if not seen <= a.admitted <= first_new and a.answered_by]
    ok = [a for a in answers if a.answered_by]
    ours = {"swap_s": first_new - seen,
            "load_and_warm_up_s": sum(run["builds"][-1]),
            "seen_after_promote_s": seen - run["promoted"],
            "swap_failed_requests": sum(1 for a in answers if a.answered_by is None and a.done >= run["promoted"]),
            "failed_requests": len(answers) - len(ok),
            "p99_s": percentiles(during, (99,))["p99"]}
    peer = {"p99_s": percentiles(outside, (99,))["p99"]}
    timing = {"requests": len(answers), "during_swap": len(during), "outside_swap": len(outside),
              "answered_by": {v: sum(1 for a in ok if a.answered_by == v) for v in (run["old"], run["new"])},
              "p50_during_s": percentiles(during, (50,))["p50"], "p50_outside_s": percentiles(outside, (50,))["p50"],
              "new_version_construct_s": run["builds"][-1][0], "new_version_warm_up_s": run["builds"][-1][1],
              "first_version_build_s": sum(run["builds"][0]), "checkpoint_mb": run["checkpoint_mb"],
              "write_checkpoints_s": run["checkpoints_s"]}
    return ours, peer, timing


@click.command()
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--config", "config_name", default="auto", show_default=True,
              help="service config (`auto`: v0.1 on CUDA, tiny on the CPU)")
@click.option("--clients", type=click.IntRange(1, 64), default=4, show_default=True,
              help="closed-loop clients sending requests the whole run")
@click.option("--before-s", type=click.FloatRange(0.5, 600), default=10.0, show_default=True,
              help="steady load before the promote")
@click.option("--after-s", type=click.FloatRange(0.5, 600), default=10.0, show_default=True,
              help="steady load after the new version's first answer")
@click.option("--poll-s", type=click.FloatRange(0.05, 60), default=1.0, show_default=True,
              help="the rollout's registry poll (generate-server --poll-s)")
@click.option("--limit-s", type=click.FloatRange(1, 3600), default=300.0, show_default=True,
              help="give up when the new version has not answered this long after the promote")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON line here")
@click.option("--no-results", is_flag=True, help="do not write bench/results/ (GPU runs write it by default)")
def command(device: str, config_name: str, clients: int, before_s: float, after_s: float, poll_s: float,
            limit_s: float, out: Optional[Path], no_results: bool) -> None:
    """A promote under steady load: swap time, failed requests, p99 during vs outside the swap."""
    from inference.service import ServiceConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    gpu = dev.type == "cuda"
    name = ("v0.1" if gpu else "tiny") if config_name == "auto" else config_name
    overrides = {} if gpu else {"max_batch_wait_ms": 1.0, "batch_buckets": (1, 2), "mesh_workers": 1}
    cfg = ServiceConfig.from_name(name, device=str(dev), timeout_s=600.0, queue_size=256, **overrides)
    with tempfile.TemporaryDirectory(prefix="bench-swap-") as folder:
        run = run_swap(cfg, Path(folder), clients, before_s, after_s, poll_s, limit_s)
    ours, peer, timing = figures(run)
    rnd = lambda d: {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()}  # noqa: E731
    params = {"device": str(dev), "torch": torch.__version__, "config": cfg.model,
              "batch_buckets": list(cfg.batch_buckets), "clients": clients, "before_s": before_s,
              "after_s": after_s, "poll_s": poll_s, "registry": "MLflow model registry on a scratch SQLite file",
              "weights": "random decoder weights (seeds 0 and 1; bf16 on GPU), random CLIP text tower per version",
              "peer": "p99_s of the requests admitted outside the swap, same load, same run",
              "timing": rnd(timing), "goals": GOALS,
              "goals_met": {f"{k}=={v}": ours[k] == v for k, v in GOALS.items()}}
    card = torch.cuda.get_device_name(dev) if gpu else None
    line = emit("swap", rnd(ours), rnd(peer), params, results_dir=None if no_results or not gpu else RESULTS_DIR,
                card=card)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(line, indent=1))


if __name__ == "__main__":
    command()
