"""`featurectl generate PROMPT [--asset-id ID] --out FILE.glb` and `featurectl generate-server`: Cube 3D generation
conditioned on asset features read from the online store of `--repo`."""

from __future__ import annotations

import functools
import gc
import logging
from pathlib import Path
from typing import Any, Callable, Optional

import click

log = logging.getLogger(__name__)

STAGE_ORDER = ("queue", "fetch", "text", "prefill", "decode", "shape_decode", "meshing", "export", "total")


def _model_options(fn: Callable) -> Callable:
    """The options that choose the models and their settings, shared by both commands."""
    options = [
        click.option("--config", "config_name", default="auto", show_default=True,
                     help="service config: v0.1, v0.5 or tiny; `auto` = v0.1 on a GPU, tiny on the CPU"),
        click.option("--gpt-weights", type=click.Path(exists=True, dir_okay=False), help="decoder safetensors "
                     "(default: random weights)"),
        click.option("--shape-weights", type=click.Path(exists=True, dir_okay=False), help="shape tokenizer "
                     "safetensors (default: random weights)"),
        click.option("--text-encoder", type=click.Path(exists=True, file_okay=False), help="local folder of the "
                     "CLIP ViT-L/14 text tower and tokenizer (default: a random one)"),
        click.option("--asset-projection", type=click.Path(exists=True, dir_okay=False),
                     help="trained asset-feature projection (default: zeros, the released behaviour)"),
        click.option("--device", default=None, help="cuda, cpu (default: the config's)"),
        click.option("--resolution", type=click.IntRange(3, 10), default=None, help="mesh grid 2^r + 1 per axis"),
        click.option("--coarse-levels", type=click.IntRange(0, 6), default=None,
                     help="coarse-to-fine occupancy levels; 0 evaluates every grid point"),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), fn)


def service_config(config_name: str, **overrides: Any):
    from inference.service import ServiceConfig

    if config_name == "auto":
        import torch

        config_name = "v0.1" if torch.cuda.is_available() else "tiny"
    try:
        return ServiceConfig.from_name(config_name, **overrides)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--config") from exc


def build_service(project, cfg, warm_up: bool):
    """The service with the repo's online store as its feature source (the registry is read in the background)."""
    from inference.service import GenerationService, online_store

    service = GenerationService(cfg, make_client=online_store(project.repo_path, project.registry_url,
                                                              cfg.feature_timeout_s))
    if warm_up:
        service.warm_up()
        gc.collect()
        gc.freeze()  # models, registry, tokenizer: never garbage; keep them out of every later collection
    return service


def build_rollout(project, cfg, model_uri: str, ab_share: float, shadow_share: float, poll_s: float):
    """The versions of a registered model behind one app: the champion, an A/B or shadow challenger, followed."""
    from inference.registry import ModelRegistry, parse_model_uri
    from inference.service.rollout import Rollout

    name, _ = parse_model_uri(model_uri)
    registry = ModelRegistry(project.registry_url)
    return Rollout(cfg, lambda alias: registry.resolve(name, alias), lambda c: build_service(project, c, True),
                   ab_share, shadow_share, poll_s)


def _ab_share(ctx, param, value: Optional[str]) -> float:
    """`challenger=0.1` -> 0.1."""
    if value is None:
        return 0.0
    alias, _, share = value.partition("=")
    try:
        number = float(share)
    except ValueError:
        number = -1.0
    if alias != "challenger" or not 0 < number < 1:
        raise click.BadParameter(f"`{value}`: give the challenger's share of traffic, e.g. challenger=0.1")
    return number


def _model_uri(ctx, param, value: Optional[str]) -> Optional[str]:
    from inference.registry import ModelRegistryError, parse_model_uri

    if value is not None:
        try:
            if parse_model_uri(value)[1] != "champion":
                raise ModelRegistryError(f"`{value}`: a server follows the champion (models:/NAME@champion); "
                                         "--ab and --shadow bring in the challenger")
        except ModelRegistryError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


def stage_table(summary: dict) -> str:
    """The per-stage P50/P99 table of `ServiceStats.summary()`, in milliseconds."""
    lines = [f"{'stage':<14} {'count':>6} {'p50 ms':>10} {'p99 ms':>10}"]
    for name in STAGE_ORDER:
        row = summary["stages"].get(name)
        if row:
            lines.append(f"{name:<14} {row['count']:>6} {row['p50_ms']:>10.3f} {row['p99_ms']:>10.3f}")
    fallbacks = {k: v for k, v in summary["fallbacks"].items() if v}
    if fallbacks:
        lines.append("feature fallbacks: " + ", ".join(f"{k} {v}" for k, v in fallbacks.items()))
    return "\n".join(lines)


def generate_to_file(project, cfg, prompt: str, out: Path, asset_id: Optional[str] = None, seed: int = 0,
                     top_p: Optional[float] = None, repeat: int = 1, warm_up: bool = False):
    """Generate `repeat` times (the last mesh is written to `out`); returns the last result and the stage table."""
    from inference.service import GenerationRequest

    if out.suffix.lower() != ".glb":
        raise click.BadParameter(f"`{out.name}`: the service writes GLB; use a `.glb` file name", param_hint="--out")
    service = build_service(project, cfg, warm_up)
    try:
        for _ in range(repeat):
            result = service.generate(GenerationRequest(prompt, asset_id=asset_id, seed=seed, top_p=top_p))
        table = stage_table(service.stats.summary())
    finally:
        service.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(result.glb)
    return result, table


def demo_generation(project, out: Path = Path("generated/demo_asset.glb"), asset_id: str = "asset_000001",
                    repeat: int = 5) -> Path:
    """The demo's last step: a wooden version of one asset, its mesh file and the per-stage latency table."""
    cfg = service_config("auto")
    result, table = generate_to_file(project, cfg, "a wooden version", out, asset_id=asset_id, repeat=repeat,
                                     warm_up=True)
    how = f"bbox condition {result.bbox}" if result.bbox else f"no bbox ({result.fallback or 'v0.1 has no bbox token'})"
    click.echo(f"{out}: {result.faces:,} faces, {len(result.glb):,} bytes; {how}; config {cfg.model} on "
               f"{cfg.torch_device}")
    click.echo(table)
    return out


@click.command()
@click.argument("prompt")
@click.option("--asset-id", default=None, help="condition on this asset's features from the online store")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="the mesh file (.glb)")
@click.option("--seed", type=click.IntRange(0, 2 ** 31 - 1), default=0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None, help="sample (default: greedy)")
@click.option("--repeat", type=click.IntRange(1, 1000), default=1, show_default=True,
              help="generate this many times (after a warm-up) and print P50/P99 per stage")
@_model_options
@click.pass_obj
def generate(ctx, prompt: str, asset_id: Optional[str], out: Path, seed: int, top_p: Optional[float], repeat: int,
             config_name: str, **overrides: Any) -> None:
    """Generate a mesh for PROMPT, optionally conditioned on an asset's features; print the stage latencies."""
    cfg = service_config(config_name, **overrides)
    result, table = generate_to_file(ctx.config(), cfg, prompt, out, asset_id, seed, top_p, repeat,
                                     warm_up=repeat > 1)
    fallback = f" (asset features not used: {result.fallback})" if result.fallback else ""
    click.echo(f"wrote {out}: {result.vertices:,} vertices, {result.faces:,} faces{fallback}")
    if result.bbox:
        click.echo(f"bbox condition from the asset's features: {[round(v, 4) for v in result.bbox]}")
    click.echo(table)


@click.command("generate-server")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (loopback by default)")
@click.option("--port", default=6570, show_default=True, type=click.IntRange(1, 65535))
@click.option("--queue-size", type=click.IntRange(1, 100_000), default=None, help="requests waiting before 429")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 3600), default=None,
              help="seconds POST /generate waits for the mesh before answering 202 with a job id (a request's "
                   "`timeout_s` overrides it, up to 10x) [default: 60]")
@click.option("--job-timeout", "job_timeout_s", type=click.FloatRange(1, 86400), default=None,
              help="seconds a request may wait in the queue before it is dropped unrun (overload) [default: 300]")
@click.option("--require-api-key/--no-require-api-key", default=None,
              help="ask POST /generate and GET /jobs/ID for an API key (`featurectl keys`); default: "
                   "platform.auth.enabled in feature_store.yaml (off in the example repo)")
@click.option("--model", "model_uri", default=None, callback=_model_uri,
              help="serve a registered model, models:/NAME@champion, following its promotions and rollbacks "
                   "without a restart (instead of --gpt-weights)")
@click.option("--ab", "ab_share", default=None, callback=_ab_share, metavar="challenger=SHARE",
              help="with --model: send this share of requests (by a stable hash of X-Request-ID, else the asset "
                   "id) to the challenger")
@click.option("--shadow", "shadow_share", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="with --model: run this share of the champion's requests again on the challenger, after "
                   "answering, and record latency and agreement in /metrics (never returned)")
@click.option("--poll-s", type=click.FloatRange(0.1, 3600), default=5.0, show_default=True,
              help="with --model: seconds between reads of the model's aliases")
@_model_options
@click.pass_obj
def generate_server(ctx, host: str, port: int, queue_size: Optional[int], timeout_s: Optional[float],
                    job_timeout_s: Optional[float], require_api_key: Optional[bool], model_uri: Optional[str],
                    ab_share: float, shadow_share: Optional[float], poll_s: float, config_name: str,
                    **overrides: Any) -> None:
    """Serve POST /generate (mesh or job id), GET /jobs/ID, /metrics, /stats over HTTP."""
    from inference.service.http_app import serve
    from serving.gateway import Gateway

    if model_uri is None and (ab_share or shadow_share):
        raise click.UsageError("--ab and --shadow split traffic between versions of a registered model: add "
                               "--model models:/NAME@champion")
    if model_uri is not None and overrides.get("gpt_weights"):
        raise click.UsageError("--model takes the decoder weights from the registry: leave out --gpt-weights")
    cfg = service_config(config_name, queue_size=queue_size, timeout_s=timeout_s, job_timeout_s=job_timeout_s,
                         **overrides)
    project = ctx.config()
    auth = project.platform.auth
    required = auth.enabled if require_api_key is None else require_api_key
    make_gateway = (lambda: Gateway.open(project.registry_url, project.project, auth.refresh_s)) if required else None
    if model_uri is None:
        make_service = functools.partial(build_service, project, cfg, True)
    else:
        make_service = functools.partial(build_rollout, project, cfg, model_uri, ab_share, shadow_share or 0.0,
                                         poll_s)
    serve(make_service, host, port, make_gateway, project.platform.http)


COMMANDS = [generate, generate_server]
