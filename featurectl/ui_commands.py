"""`featurectl ui`: Feast's own web UI for the repo's project, on the registry that featurectl resolves.

`feast ui` binds every interface and reads `registry.path` against the current folder; this command binds the
loopback unless told otherwise, takes the registry as every featurectl command does (relative to the repo,
`--registry`, `postgres`), and refuses a project nothing was applied to, which the UI would show empty.
"""

from __future__ import annotations

import click

from common.errors import FeaturectlError
from featurectl.lineage import consumer_settings


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (loopback by default)")
@click.option("--port", default=8888, show_default=True, type=click.IntRange(1, 65535))
@click.pass_obj
def ui(ctx, host: str, port: int) -> None:
    """Feast's UI for this project: views, services, entities, data sources (Kafka topics, Parquet histories)."""
    from feast import FeatureStore
    from sqlalchemy.exc import SQLAlchemyError

    cfg = ctx.config()
    store = FeatureStore(config=cfg.feast_repo_config())
    try:
        registered = store.list_feature_views(allow_cache=False)
    except SQLAlchemyError as exc:
        fix = ("start PostgreSQL (`featurectl services up --postgres`)" if cfg.uses_postgres_registry
               else "check that the file is a registry `featurectl apply` made")
        raise FeaturectlError(f"cannot read the registry {cfg.registry_url} ({type(exc).__name__}): {fix}, or "
                              "name another with --registry") from exc
    if not registered:
        raise FeaturectlError(f"project `{cfg.project}` has no feature views in {cfg.registry_url}: run "
                              "`featurectl apply` first")
    if consumer_settings(store) is None:
        click.echo("openlineage.consumer is off in feature_store.yaml: the Lineage page shows Feast's registry graph "
                   "only, from each view's offline table on (see README, Feast UI)")
    click.echo(f"Feast UI of project `{cfg.project}` ({cfg.registry_url}): http://{host}:{port}/p/{cfg.project}/")
    store.serve_ui(host=host, port=port)


COMMANDS = [ui]
