"""`featurectl serve`: the HTTP feature server, or the latency percentiles of a running one (`--stats URL`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import click


def _print_stats(url: str) -> None:
    target = url.rstrip("/") + "/stats"
    try:
        with urllib.request.urlopen(target, timeout=5) as reply:
            summary = json.loads(reply.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read {target} ({exc}); is `featurectl serve` running there?") from exc
    for title, rows in (("endpoint", summary["endpoints"]), ("feature service", summary["feature_services"])):
        click.secho(f"{title:<28} {'count':>9} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'p99.9 ms':>9}", bold=True)
        for name, row in rows.items():
            click.echo(f"{name:<28} {row['count']:>9} {row['p50']:>9.3f} {row['p90']:>9.3f} {row['p99']:>9.3f} "
                       f"{row['p99.9']:>9.3f}")
    click.echo(f"redis errors: {summary['redis_errors']}, in flight: {summary['in_flight']}")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (loopback by default)")
@click.option("--port", default=6566, show_default=True, type=click.IntRange(1, 65535))
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64), help="worker processes")
@click.option("--timeout", "timeout_s", default=1.0, show_default=True, type=click.FloatRange(0.01, 60),
              help="seconds to wait for Redis before answering 503")
@click.option("--stats", "stats_url", default=None, metavar="URL",
              help="print P50/P90/P99/P99.9 per endpoint of the server at URL, then exit")
@click.option("--require-api-key/--no-require-api-key", default=None,
              help="ask every POST /get-online-features, /push and /retrieve-online-documents for an API key "
                   "(`featurectl keys`); default: "
                   "platform.auth.enabled in feature_store.yaml (off in the example repo)")
@click.pass_obj
def serve(ctx, host: str, port: int, workers: int, timeout_s: float, stats_url: str | None,
          require_api_key: bool | None) -> None:
    """Serve features over HTTP: Feast's POST /get-online-features, /push and /retrieve-online-documents; GET /health,
    /ready, /metrics, /stats, /openapi.json."""
    if stats_url:
        _print_stats(stats_url)
        return
    cfg = ctx.config()
    from serving.server import serve as run_server

    run_server(cfg.repo_path, cfg.registry_url, host, port, workers, timeout_s, require_api_key)


COMMANDS = [serve]
