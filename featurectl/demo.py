"""`featurectl demo`: the main job on embedded defaults, end to end as far as the platform goes today."""

from __future__ import annotations

import datetime as dt
import time

import click


GEOMETRY_VIEW = "asset_geometry"  # the example repo's view of mesh features and the D2 embedding
SIMILAR = 5
SIMILAR_TO = "asset_000000"
ASSETS_SINCE = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)  # before any asset version a demo writes


def _step(title: str) -> None:
    click.secho(f"\n== {title}", fg="green", bold=True)


@click.command()
@click.option("--days", default=2, show_default=True, help="days of synthetic history")
@click.option("--events-per-day", default=50_000, show_default=True)
@click.option("--live-seconds", default=15.0, show_default=True, help="how long live events are streamed")
@click.option("--live-rate", default=200.0, show_default=True, help="live events per second")
@click.option("--meshes", default=60, show_default=True, type=click.IntRange(min=SIMILAR + 1),
              help="asset meshes written and derived on Ray")
@click.pass_context
def demo(click_ctx: click.Context, days: int, events_per_day: int, live_seconds: float, live_rate: float,
         meshes: int) -> None:
    """Start the services, generate data, plan and apply the example repo, derive asset meshes on Ray and search
    them by shape, run a batch tile query, backfill and materialize, stream live events and watch online values
    change, generate a mesh conditioned on an asset's features and find the assets nearest its shape."""
    from featurectl import asset_commands, datagen, materialize_commands, repo_commands, services, similar_commands

    ctx = click_ctx.obj
    _step("services")
    click_ctx.invoke(services.up)
    _step("synthetic history")
    click_ctx.invoke(datagen.history, days=days, events_per_day=events_per_day)
    _step("plan")
    click_ctx.invoke(repo_commands.plan, sql=False)
    _step("apply")
    click_ctx.invoke(repo_commands.apply)
    _step(f"assets: {meshes} meshes derived on Ray (trimesh measures, D2 shape embedding) into Redis and the "
          "vector index")
    click_ctx.invoke(datagen.assets, n=meshes, out=None, seed=7)
    click_ctx.invoke(asset_commands.process, source_name=None, address=None, workers=2, materialize=True)
    # `process` materializes only what it derived: a re-run with unchanged meshes after Redis lost its data (a
    # restart without persistence) would search an empty view, so the demo materializes every asset version
    click_ctx.invoke(materialize_commands.materialize, start=ASSETS_SINCE, end=dt.datetime.now(dt.timezone.utc),
                     views=(GEOMETRY_VIEW,))
    _step(f"search: the {SIMILAR} assets most similar in shape to {SIMILAR_TO}")
    click_ctx.invoke(similar_commands.similar, entity_id=SIMILAR_TO, k=SIMILAR, view_name=None)
    _step("batch: tiles of asset_activity from the Parquet history (Flink batch mode)")
    _show_tiles(ctx.config())
    _step("backfill the offline feature tables, materialize the latest values into Redis")
    from featurectl import batch_commands

    end = dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    first = end - dt.timedelta(days=days)
    click_ctx.invoke(batch_commands.backfill, start=first, end=end, view_names=(), parallelism=None,
                     jobmanager=None)
    # an entity whose last change is before the range has its backfilled row there, at that change: materialize
    # from the longest ttl earlier, so that every entity with a value in the range reaches Redis (Feast's rule
    # takes rows in [START, END] only)
    from dsl.repo import load_repo

    since = first - max(view.ttl for view in load_repo(ctx.repo).views)
    click_ctx.invoke(materialize_commands.materialize, start=since, end=end, views=())
    _step("read back through the online SDK (feature service cube3d_conditioning)")
    _show_online(ctx.config())
    _step("stream: live events through Kafka -> Flink -> Redis, read back through the SDK while they change")
    from featurectl.demo_stream import stream_live

    global_args = ["--repo", str(ctx.repo), *(["--registry", ctx.registry] if ctx.registry else [])]
    stream_live(ctx.config(), global_args, seconds=live_seconds, rate=live_rate)
    _step("generate: a wooden version of one asset (tiny model on the CPU, v0.1 on a GPU)")
    from featurectl.generate_commands import demo_generation

    cfg = ctx.config()
    generated = demo_generation(cfg, out=cfg.state_dir / "demo_asset.glb")
    _step(f"search: the {SIMILAR} assets nearest the generated mesh's shape")
    _show_nearest(cfg, generated)


def _show_nearest(cfg, mesh_file) -> None:
    """The assets whose D2 embedding is nearest that of `mesh_file`, measured as `assets process` measures one."""
    from batch.assets.mesh_features import MeshDecodeError, decode_mesh, mesh_features
    from dsl import load_repo
    from serving import OnlineClient

    view = load_repo(cfg.repo_path).view(GEOMETRY_VIEW)
    try:
        measured = mesh_features(decode_mesh(mesh_file.read_bytes(), mesh_file.suffix.lstrip(".")),
                                 view.source.embedding)
    except MeshDecodeError as exc:
        click.echo(f"  {mesh_file.name}: nothing to measure ({exc})")
        return
    shown = ["category", "face_count", "components"]
    with OnlineClient(cfg.feast_repo_config()) as client:
        hits = client.search(f"{view.name}:{view.source.embedding.name}", measured.embedding.tolist(), SIMILAR,
                             features=shown)
    click.echo("\t".join(["rank", "asset_id", "distance", *shown]))
    for rank, (ids, distance) in enumerate(zip(hits.ids, hits.distances), 1):
        values = [str(hits.features[name][rank - 1]) for name in shown]
        click.echo("\t".join([str(rank), ids["asset_id"], f"{distance:.6g}", *values]))


def _show_online(cfg) -> None:
    from serving import OnlineClient

    client = OnlineClient.from_repo(cfg.repo_path, registry=cfg.registry_url)
    ids = ["asset_000000", "asset_000001", "asset_000002"]
    started = time.perf_counter()
    columns = client.get_features("cube3d_conditioning", {"asset_id": ids})
    elapsed_ms = (time.perf_counter() - started) * 1000
    client.close()
    names = [n for n in columns if n != "asset_id"]
    for i, asset_id in enumerate(ids):
        click.echo(f"  {asset_id}: " + ", ".join(f"{n}={columns[n][i]}" for n in names))
    click.echo(f"  ({len(ids)} entities x {len(names)} features in one round trip, {elapsed_ms:.2f} ms)")


def _show_tiles(cfg) -> None:
    from common.flink import create_table_env
    from batch.tiles import query_tiles
    from dsl import load_repo
    from dsl.compile_flink import SourceSettings, compile_view

    repo = load_repo(cfg.repo_path)
    compiled = compile_view(repo.view("asset_activity"), SourceSettings(cfg.platform.kafka.bootstrap_servers,
                                                                        cfg.data_dir))
    started = time.monotonic()
    env = create_table_env(streaming=False, jobmanager=cfg.platform.flink.jobmanager,
                           parallelism=cfg.platform.flink.parallelism)
    top = query_tiles(compiled, env=env, select="SELECT asset_id, SUM(views__count) AS view_count, "
                      "HLL_ESTIMATE(HLL_MERGE(unique_users__hll)) AS user_estimate, COUNT(*) AS tile_count "
                      "FROM tiles GROUP BY asset_id ORDER BY view_count DESC LIMIT 5")
    click.echo(f"tile query over the whole history in {time.monotonic() - started:.1f}s; most viewed assets:")
    for row in top.itertuples():
        click.echo(f"  {row.asset_id}  {int(row.view_count):>7,} views  ~{int(row.user_estimate):>6,} unique users  "
                   f"{int(row.tile_count):>5,} active minutes")


COMMANDS = [demo]
