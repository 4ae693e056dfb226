"""`featurectl report` on a real project: a checked backfill of `asset_activity` (with nulls), materialized, then
served and pushed to by a running `featurectl serve`; the page has every section with one image per plot and no
outside resource, and headless Chromium renders it (a screenshot that is not one colour, printed for the test
output). Without a server the page says so in the server's sections."""

from __future__ import annotations

import datetime as dt
import html
import json
import random
import re
import time
import uuid

import matplotlib.image
import numpy as np
import pyarrow as pa
import pytest
import redis

from batch.offline_table import RangeWriter
from batch.quality import check_backfill
from cli_helpers import chromium, copy_example_repo, featurectl, free_port, register_repo, sibling
from common.config import load_config
from dsl import load_repo
from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path
from dsl.types import ValueType
from redis_store import freshness
from redis_store.freshness_history import read_history
from redis_store.settings import RedisSettings

pytestmark = pytest.mark.integration

serving_env = sibling("serving_env", "serving")
NOW = dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0)
START, END = NOW - dt.timedelta(days=1), NOW
VIEW = "asset_activity"
ASSETS = [f"a{i}" for i in range(40)]
SECTIONS = ("freshness", "null-rates", "distributions", "drift", "serving")


def _offline_rows(view) -> pa.Table:
    """A row per asset an hour or two before NOW; views_1h null in about a quarter of them."""
    rng = random.Random(7)
    columns: dict[str, list] = {"asset_id": ASSETS,
                                EVENT_TIMESTAMP: [NOW - dt.timedelta(minutes=rng.randint(60, 120)) for _ in ASSETS]}
    for name, kind in view.output_schema().items():
        if kind is ValueType.STRING:
            columns[name] = [f"user_{rng.randint(0, 5)}" for _ in ASSETS]
        elif kind is ValueType.FLOAT64:
            columns[name] = [rng.uniform(0, 9_000) for _ in ASSETS]
        else:
            columns[name] = [rng.randint(0, 50) for _ in ASSETS]
    columns["views_1h"] = [None if rng.random() < 0.25 else v for v in columns["views_1h"]]
    schema = pa.schema([("asset_id", pa.string()), (EVENT_TIMESTAMP, pa.timestamp("ms", "UTC"))]
                       + [(n, k.arrow_type()) for n, k in view.output_schema().items()])
    return pa.Table.from_pydict(columns, schema)


@pytest.fixture(scope="module")
def project(tmp_path_factory, local_services):
    """The example repo under a project of its own: `asset_activity` backfilled (rows written, checked, profiled)
    and materialized. Yields (repo, project, null share of views_1h)."""
    folder = tmp_path_factory.mktemp("report")
    name = f"report_{uuid.uuid4().hex[:8]}"
    repo = copy_example_repo(folder, name, {"path": f"sqlite:///{folder / name}.db"}, data_dir=folder / "data")
    register_repo(repo)
    cfg = load_config(repo)
    view = load_repo(repo).view(VIEW)
    table = _offline_rows(view)
    start_ms, end_ms = int(START.timestamp() * 1000), int(END.timestamp() * 1000)
    with RangeWriter(offline_table_path(cfg.data_dir, view), table.schema, start_ms, end_ms) as writer:
        writer.write(table)
        writer.commit()
    check_backfill([view], START, END, cfg.data_dir, cfg.registry_url, name)
    done = featurectl("--repo", str(repo), "materialize", START.isoformat(), END.isoformat(), "--view", VIEW)
    assert done.returncode == 0, done.stdout + done.stderr
    yield repo, name, table.column("views_1h").null_count / table.num_rows
    freshness.forget_newest(RedisSettings.from_config(cfg), name)
    client = redis.Redis(*local_services.redis_host_port)
    for key in client.scan_iter(match=f"*{name}".encode(), count=10_000):
        client.delete(key)


def _push(url: str, asset: str, at: dt.datetime) -> None:
    body = {"push_source_name": "asset_attributes_push",
            "df": {"asset_id": [asset], "event_timestamp": [at.isoformat()], "category": ["lamp"],
                   "creator_id": ["c1"], "style": ["voxel"], "bbox_x": [1.0], "bbox_y": [1.0], "bbox_z": [1.0],
                   "polygon_count": [10]}}
    status, reply = serving_env.post(url, body, path="/push")
    assert status == 200 and reply["online_written"] == 1, reply


def _wait_for(check, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, f"waited {timeout_s:.0f}s for {what}"
        time.sleep(0.3)
    return got


@pytest.fixture(scope="module")
def served(project):
    """A feature server that answered requests for every asset and took two pushes (two freshness samples apart);
    yields its URL once its drift sample holds the served values."""
    repo, name, _ = project
    with serving_env.feature_server(repo, free_port()) as url:
        for lo in range(0, len(ASSETS), 8):
            body = {"features": ["asset_activity:views_1h", "asset_activity:last_user_24h"],
                    "entities": {"asset_id": ASSETS[lo:lo + 8] + ["unknown"]}}
            assert serving_env.post(url, body)[0] == 200
        settings = RedisSettings.from_config(load_config(repo))
        _wait_for(lambda: len(read_history(settings, name)) >= 1, "the materialization's freshness sample")
        pushes = iter(range(1_000))

        def pushed_and_sampled() -> bool:  # a push per try: the history keeps one sample per 5 s at most
            _push(url, f"p{next(pushes)}", dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1))
            return any("asset_attributes" in s.newest_ms for s in read_history(settings, name))

        _wait_for(pushed_and_sampled, "a push's freshness sample")
        _wait_for(lambda: VIEW in json.loads(serving_env.get(url, "/stats")[1]).get("drift", {}),
                  "the served values in the drift sample")
        yield url


def _sections(page: str) -> dict[str, str]:
    parts = re.findall(r'<section id="([^"]+)">(.*?)</section>', page, re.S)
    return dict(parts)


def _not_one_colour(png_path) -> None:
    pixels = matplotlib.image.imread(png_path)[..., :3]
    colours = np.unique((pixels.reshape(-1, 3) * 255).astype(np.uint8), axis=0)
    background = np.all(pixels > 0.97, axis=-1).mean()
    assert len(colours) > 50 and background < 0.97, (
        f"{png_path}: {len(colours)} colours, {background:.1%} white: an empty or error page")


def test_the_report_plots_every_section_and_chromium_renders_it(project, served, tmp_path):
    repo, name, views_1h_nulls = project
    out = tmp_path / "report.html"
    done = featurectl("--repo", str(repo), "report", "--server", served, "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"written to {out}" in done.stdout and "warning: " not in done.stderr
    page = out.read_text()
    sections = _sections(page)
    assert tuple(sections) == SECTIONS
    for section_id, body in sections.items():
        assert body.count("<img ") == body.count('<figure class="plot"') >= 1, section_id
        assert 'class="empty"' not in body, section_id
    assert re.findall(r'<img [^>]*src="([^"]{0,22})', page) == ["data:image/png;base64,"] * page.count("<img ")
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<script" not in page and "<link" not in page
    assert {'id="freshness-age"', f'id="nulls-{VIEW}"', f'id="distribution-{VIEW}"', 'id="drift-psi"',
            'id="serving-latency"', 'id="serving-rows"'} <= set(re.findall(r'id="[^"]+"', page))
    assert 0 < views_1h_nulls < 1

    screenshot = tmp_path / "report.png"
    chromium(tmp_path / "profile", "--hide-scrollbars", "--window-size=1200,2400", f"--screenshot={screenshot}",
             out.as_uri())
    print(f"\nreport screenshot: {screenshot}")
    _not_one_colour(screenshot)
    dom = html.unescape(chromium(tmp_path / "profile", "--dump-dom", out.as_uri()))
    assert f"featurectl report: project {name}" in re.sub(r"<[^>]+>", "", dom)
    assert dom.count("<img ") == page.count("<img ")


def test_without_a_server_the_page_says_what_is_left_out(project, tmp_path, monkeypatch):
    """In-process (the subprocess above already covers the CLI's start): the default path, in the current folder."""
    from click.testing import CliRunner

    from featurectl.cli import Context
    from featurectl.report_commands import report

    repo, name, _ = project
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(report, [], obj=Context(repo, None))
    assert done.exit_code == 0, done.output
    written = tmp_path / f"featurectl-report-{name}.html"
    assert f"written to {written}" in done.output
    page = written.read_text()
    sections = _sections(page)
    for section_id in ("drift", "serving"):
        assert "<img " not in sections[section_id] and "featurectl report --server URL" in sections[section_id]
    assert 'id="freshness-age"' in page and f'id="nulls-{VIEW}"' in page


def test_redis_and_a_server_away_are_named_and_the_page_is_written(project, tmp_path):
    """The project's registry, with Redis and the server on ports nothing listens on."""
    from click.testing import CliRunner

    from featurectl.cli import Context
    from featurectl.report_commands import report

    repo, name, _ = project
    registry = load_config(repo).registry_url
    away = copy_example_repo(tmp_path, name, {"path": registry},
                             {"type": "redis", "connection_string": f"127.0.0.1:{free_port()}"})
    out, server = tmp_path / "away.html", f"http://127.0.0.1:{free_port()}"
    done = CliRunner().invoke(report, ["--server", server, "--out", str(out)], obj=Context(away, None))
    assert done.exit_code == 0, done.output
    assert "warning: " in done.output and f"cannot read {server}/stats" in done.output
    sections = _sections(out.read_text())
    assert '<ul class="notes">' in out.read_text() and "the freshness plot is left out" in out.read_text()
    assert "<img " not in sections["freshness"] and "Redis could not be read" in sections["freshness"]
    assert f"the feature server at {server} could not be read" in sections["serving"]
    assert f'id="nulls-{VIEW}"' in sections["null-rates"], "the registry's records are drawn all the same"


def test_the_age_drops_at_each_sample_and_grows_with_the_clock_until_the_next():
    from common.feature_profile import FeatureProfile
    from featurectl.report_page import AGE_STEP, MIN_AGE_S, age_line, bin_labels

    samples = [(1_000, 0), (5_000, 4_000), (8_000, 9_000)]
    times, ages = age_line(samples, now_ms=10_000)
    seconds = [t.timestamp() for t in times]
    # each segment starts at its sample and ends at the next one (or now); points between grow by at most AGE_STEP
    starts = [i for i in range(len(seconds)) if i == 0 or seconds[i] == seconds[i - 1]]
    assert [seconds[i] for i in starts] == [1, 5, 8] and seconds[-1] == 10
    assert [ages[i] for i in starts] == [1, 1, MIN_AGE_S]  # an event time ahead of the clock: drawn at the floor
    assert [ages[i - 1] for i in starts[1:]] + [ages[-1]] == [5, 4, MIN_AGE_S]
    ends = {i - 1 for i in starts[1:]} | {len(ages) - 1}
    for i in range(1, len(ages)):
        if i not in starts:
            assert ages[i - 1] <= ages[i] <= ages[i - 1] * AGE_STEP * (1 + 1e-9)
        if i not in starts and i not in ends:  # points between samples lie on the true, linear age
            newest = next(n for at, n in reversed(samples) if at <= seconds[i] * 1000)
            assert abs(ages[i] - max(seconds[i] - newest / 1000, MIN_AGE_S)) < 1e-3
    assert len(ages) > 6, "the segments that grow on the log axis get points between their samples"
    assert bin_labels(FeatureProfile("numeric", (0.2, 0.3, 0.5), cuts=(1.0, 2.5))) == ["<= 1", "(1, 2.5]", "> 2.5"]
    assert bin_labels(FeatureProfile("categorical", (0.6, 0.4), categories=("chair",))) == ["chair", "other"]


def test_a_record_newer_than_the_history_ends_the_line_within_the_gap():
    from featurectl.report_page import ReportData, ViewData, _view_samples
    from redis_store.freshness_history import GAP_MS, FreshnessSample

    now = dt.datetime.fromtimestamp(100, dt.timezone.utc)
    data = ReportData("p", now, [ViewData("v", None), ViewData("w", None)], [FreshnessSample(10_000, {"v": 9_000})],
                      {"v": 12_000, "w": 50_000})
    assert _view_samples(data, "v") == [(10_000, 9_000), (10_000 + GAP_MS, 12_000)]
    assert _view_samples(data, "w") == [(100_000, 50_000)]  # recorded before its history began: now
