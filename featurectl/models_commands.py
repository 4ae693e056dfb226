"""`featurectl models register | list | promote | rollback`: versions of the generation model, with their
feature lineage, in MLflow's Model Registry beside the project's registry (`inference.registry`)."""

from __future__ import annotations

from typing import Optional

import click


def _registry(ctx):
    from inference.registry import ModelRegistry

    return ModelRegistry(ctx.config().registry_url)


def _tags(pairs: tuple[str, ...]) -> dict[str, str]:
    tags = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"`{pair}` is not KEY=VALUE, e.g. --tag data=2026-11", param_hint="--tag")
        tags[key] = value
    return tags


def _line(v) -> str:
    aliases = f"  @{' @'.join(v.aliases)}" if v.aliases else ""
    lineage = (f"  features: {v.lineage['feature_service']} {v.lineage['feature_service_version']} "
               f"({v.lineage.get('feature_views', '')})" if v.lineage else "  features: none recorded")
    tags = "  tags: " + ", ".join(f"{k}={val}" for k, val in sorted(v.tags.items())) if v.tags else ""
    return (f"  v{v.version}  {v.created:%Y-%m-%d %H:%M:%S}Z  {v.config}  sha256 {v.sha256[:12]}{aliases}\n"
            f"      {v.source}\n    {lineage}{tags}")


@click.group()
def models() -> None:
    """Versions of the generation model: register checked checkpoints, promote them, roll back.

    `featurectl generate-server --model models:/NAME@champion` serves the champion and follows its changes.
    """


@models.command()
@click.argument("name")
@click.argument("path", type=click.Path(dir_okay=False, exists=True))
@click.option("--tag", "tags", multiple=True, help="KEY=VALUE kept with the version (repeat)")
@click.option("--feature-service", default=None,
              help="the feature service the model is conditioned on; its views' applied versions are recorded")
@click.option("--config", "config_name", default=None,
              help="the Cube 3D config (v0.1, v0.5, tiny) when the checkpoint's metadata does not name it")
@click.pass_obj
def register(ctx, name: str, path: str, tags: tuple[str, ...], feature_service: Optional[str],
             config_name: Optional[str]) -> None:
    """Check the decoder checkpoint PATH (names and shapes) and register it as the next version of NAME."""
    from inference.registry import feature_lineage, verify_checkpoint

    checkpoint = verify_checkpoint(path, config_name)
    lineage = feature_lineage(ctx.config(), feature_service) if feature_service else None
    version = _registry(ctx).register(name, checkpoint, _tags(tags), lineage)
    click.echo(f"registered {name} version {version.version}: {checkpoint.tensors} tensors of config "
               f"{checkpoint.config}, sha256 {checkpoint.sha256[:12]}"
               + (f", conditioned on {lineage.service} {lineage.version}" if lineage else ""))


@models.command("list")
@click.argument("name", required=False)
@click.pass_obj
def list_models(ctx, name: Optional[str]) -> None:
    """Every model with its versions, aliases and lineage (or only NAME's)."""
    registry = _registry(ctx)
    names = [name] if name else registry.names()
    if not names:
        click.echo("no models: `featurectl models register NAME PATH` adds one")
    for model in names:
        click.echo(f"model {model}")
        for version in registry.versions(model):
            click.echo(_line(version))


@models.command()
@click.argument("name")
@click.argument("version", type=click.IntRange(1))
@click.option("--alias", type=click.Choice(["champion", "challenger"]), required=True)
@click.pass_obj
def promote(ctx, name: str, version: int, alias: str) -> None:
    """Point ALIAS of NAME at VERSION; servers of models:/NAME@ALIAS switch to it without a restart."""
    promoted = _registry(ctx).promote(name, version, alias)
    click.echo(f"{name}@{alias} -> version {promoted.version}")


@models.command()
@click.argument("name")
@click.pass_obj
def rollback(ctx, name: str) -> None:
    """Point NAME's champion back at the version that was champion before it."""
    was, now = _registry(ctx).rollback(name)
    click.echo(f"{name}@champion: version {was} -> version {now}")


COMMANDS = [models]
