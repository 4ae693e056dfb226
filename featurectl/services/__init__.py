"""`featurectl services up|down|status`: the local Redis, Kafka and PostgreSQL of the one-machine setup.

Each service lives in its own module; all bind 127.0.0.1 on the ports feature_store.yaml names and keep pid
files, logs and data under `platform.state_dir/<service>/`.
"""

from __future__ import annotations

from typing import Optional

import click

from common.config import ProjectConfig
from featurectl.services.kafka_broker import KafkaBroker
from featurectl.services.postgres_server import PostgresServer
from featurectl.services.process import LocalService, LocalServiceError
from featurectl.services.redis_server import RedisServer

SERVICES: dict[str, type[LocalService]] = {"redis": RedisServer, "kafka": KafkaBroker, "postgres": PostgresServer}


def all_services(cfg: ProjectConfig) -> list[LocalService]:
    return [cls(cfg) for cls in SERVICES.values()]


def wanted_services(cfg: ProjectConfig, only: Optional[str], postgres: Optional[bool]) -> list[LocalService]:
    """`--only` wins; otherwise Redis and Kafka, plus PostgreSQL when the flag or the config asks for it."""
    if only:
        return [SERVICES[only](cfg)]
    with_postgres = cfg.platform.postgres.enabled if postgres is None else postgres
    return [svc for svc in all_services(cfg) if with_postgres or svc.name != "postgres"]


@click.group()
def services() -> None:
    """Start, stop and inspect the local Redis, Kafka (KRaft) and PostgreSQL."""


@services.command()
@click.option("--postgres/--no-postgres", default=None,
              help="also start PostgreSQL (default: platform.postgres.enabled in feature_store.yaml)")
@click.option("--only", type=click.Choice(list(SERVICES)), default=None, help="start this one service only")
@click.pass_obj
def up(obj, postgres: Optional[bool], only: Optional[str]) -> None:
    """Start the services that are not running and wait until each answers; running ones are left alone."""
    for svc in wanted_services(obj.config(), only, postgres):
        click.echo(svc.up())


@services.command()
@click.pass_obj
def down(obj) -> None:
    """Stop every service that `up` started (by its pid file), whatever the current flags."""
    failures = []
    for svc in reversed(all_services(obj.config())):
        try:
            click.echo(svc.down())
        except (LocalServiceError, OSError) as exc:
            failures.append(f"{svc.name}: {exc}")
    if failures:
        raise click.ClickException("could not stop " + "; ".join(failures))


@services.command()
@click.pass_obj
def status(obj) -> None:
    """One line per service: name, up/down, pid, address."""
    for svc in all_services(obj.config()):
        click.echo(svc.status())


COMMANDS = [services]
