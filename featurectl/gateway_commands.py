"""`featurectl gateway`: one API in front of several `featurectl generate-server` replicas, routed by latency."""

from __future__ import annotations

import logging
from typing import Optional

import click

log = logging.getLogger(__name__)


def _mesh_charge(config_name: str):
    """What a mesh of the replicas' model costs a key (its generated shape tokens) and the service it needs."""
    from inference.config import CUBE3D_CONFIGS
    from inference.service.config import SERVICE_CONFIGS
    from serving.routing.app import MeshCharge

    service = SERVICE_CONFIGS[config_name]
    return MeshCharge(service.feature_service, CUBE3D_CONFIGS[service.model].n_generated)


@click.command()
@click.option("--replica", "replicas", multiple=True, required=True, metavar="URL",
              help="a generate-server, http://HOST:PORT; repeat for each replica")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (loopback by default)")
@click.option("--port", default=6580, show_default=True, type=click.IntRange(1, 65535))
@click.option("--balance", type=click.Choice(["latency", "round-robin"]), default="latency", show_default=True,
              help="latency: power of two choices on each replica's latency estimate x its queue, and replicas "
                   "much slower than the others drained; round-robin: in turn (failures still drain)")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 3600), default=90.0, show_default=True,
              help="seconds a replica may take to answer before it is failed over (a request's own "
                   "`timeout_s` plus 10 s when that is longer)")
@click.option("--config", "config_name", type=click.Choice(["v0.1", "v0.5", "tiny"]), default="v0.1",
              show_default=True, help="the replicas' model: each mesh charges its generated shape tokens to the key")
@click.option("--require-api-key/--no-require-api-key", default=None,
              help="check API keys and token budgets here (the replicas then run without keys); default: "
                   "platform.auth.enabled in feature_store.yaml")
@click.pass_obj
def gateway(ctx, replicas: tuple[str, ...], host: str, port: int, balance: str, timeout_s: float, config_name: str,
            require_api_key: Optional[bool]) -> None:
    """Serve the replicas' POST /generate and GET /jobs/ID as one API, with /metrics and /stats per replica."""
    from serving.gateway import Gateway
    from serving.routing.app import GatewayApp, serve
    from serving.routing.replica import RoutingSettings
    from serving.routing.router import Router

    project = ctx.config()
    auth = project.platform.auth
    required = auth.enabled if require_api_key is None else require_api_key
    router = Router(replicas, RoutingSettings(balance=balance, timeout_s=timeout_s))
    make_keys = (lambda: Gateway.open(project.registry_url, project.project, auth.refresh_s)) if required else None
    if not required:
        log.warning("API keys are off at the gateway: callers' keys are passed on for the replicas to check (turn "
                    "them on here with platform.auth.enabled: true or --require-api-key)")
        if host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("serving on %s: reachable from other machines without API keys", host)
    app = GatewayApp(router, make_keys, _mesh_charge(config_name) if required else None, project.platform.http)
    serve(app, host, port)


COMMANDS = [gateway]
