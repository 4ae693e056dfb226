"""`featurectl keys create | list | revoke | usage`: API keys for `serve` (reads and pushes) and `generate`."""

from __future__ import annotations

import time

import click


def _store(ctx):
    from serving.api_keys import KeyStore

    cfg = ctx.config()
    return KeyStore(cfg.registry_url, cfg.project)


@click.group()
def keys() -> None:
    """API keys of this project, stored hashed in the registry database, with per-minute budgets.

    Servers ask for them when `platform.auth.enabled` is true or they run with `--require-api-key`.
    """


@keys.command()
@click.argument("name")
@click.option("--service", "services", multiple=True,
              help="feature service the key may read (repeat; `*` for every service and free feature lists)")
@click.option("--push", "pushes", multiple=True,
              help="push source the key may push to: an event source or `{view}_push` (repeat; `*` for all)")
@click.option("--requests-per-minute", default=6_000, show_default=True, help="budget of feature reads and pushes")
@click.option("--tokens-per-minute", default=100_000, show_default=True, help="generated shape tokens budget")
@click.pass_obj
def create(ctx, name: str, services: tuple[str, ...], pushes: tuple[str, ...], requests_per_minute: int,
           tokens_per_minute: int) -> None:
    """Create a key (at least one --service or --push); its secret is printed once and never stored."""
    key, token = _store(ctx).create(name, list(services), requests_per_minute, tokens_per_minute, list(pushes))
    _warn_unknown(ctx, services, pushes)
    click.echo(f"created key {key.key_id} ({name}); send it as `Authorization: Bearer <key>`. "
               "It is shown once:")
    click.echo(token)


def _warn_unknown(ctx, services: tuple[str, ...], pushes: tuple[str, ...]) -> None:
    """Name the grants this repo defines nothing for (a typo gives a key that every request is refused with): a
    warning, since a service registered with Feast's SDK, or defined later, is a valid grant."""
    import difflib

    from common.errors import FeaturectlError
    from dsl.repo import load_repo
    from serving.push_targets import PushTargets

    try:
        repo = load_repo(ctx.config().repo_path)
    except FeaturectlError:
        return  # definitions that do not load: `apply` says why; the key stands as asked
    targets = PushTargets(repo)
    known = {"feature service": sorted(s.name for s in repo.services),
             "push source": sorted([*targets.sources, *targets.views])}
    for kind, names in (("feature service", services), ("push source", pushes)):
        for granted in names:
            if granted == "*" or granted in known[kind]:
                continue
            close = difflib.get_close_matches(granted, known[kind], 1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            click.echo(f"warning: this repo defines no {kind} `{granted}`{hint}; defined: "
                       f"{', '.join(known[kind]) or 'none'}. The key is refused (403) for it until one by that name "
                       "is registered", err=True)


@keys.command("list")
@click.pass_obj
def list_keys(ctx) -> None:
    """Every key, active or revoked (never a secret)."""
    rows = _store(ctx).list()
    if not rows:
        click.echo("no keys: `featurectl keys create NAME --service S` makes one")
    for key in rows:
        state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "active"
        pushes = f" push={','.join(key.pushes)}" if key.pushes else ""
        click.echo(f"{key.key_id}  {key.name:<20} {state:<24} services={','.join(key.services)}{pushes} "
                   f"requests/min={key.requests_per_minute} tokens/min={key.tokens_per_minute}"
                   + ("" if key.project else "  (made before keys belonged to a project: valid for all)"))


@keys.command()
@click.argument("key_id")
@click.pass_obj
def revoke(ctx, key_id: str) -> None:
    """Revoke a key by id; servers stop accepting it within platform.auth.refresh_s (10 s by default)."""
    _store(ctx).revoke(key_id)
    click.echo(f"revoked {key_id}")


@keys.command()
@click.option("--since-minutes", default=60, show_default=True)
@click.pass_obj
def usage(ctx, since_minutes: int) -> None:
    """Requests, generated shape tokens and throttled (429) requests per key; servers write usage every
    platform.auth.refresh_s and at shutdown."""
    since = int(time.time() // 60) - since_minutes
    rows = _store(ctx).usage(since)  # before the header: a failed read prints its error alone
    click.echo(f"{'key':<10}{'name':<22}{'requests':>10}{'tokens':>10}{'throttled':>11}")
    for key_id, name, requests, tokens, rejected in rows:
        click.echo(f"{key_id:<10}{name:<22}{requests:>10}{tokens:>10}{rejected:>11}")


COMMANDS = [keys]
