"""Feast's UI on an applied copy of the example repo, read by a real headless Chromium: `featurectl ui` and Feast's
own `feast ui` serve it; its pages show the views, the event sources (Kafka topics, Parquet histories), each
view's tile query, and the lineage from topic and history through the views to the feature services."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from cli_helpers import ROOT, chromium, cli_server, copy_example_repo, featurectl, free_port, sibling
from featurectl.services.scratch_redis import stop_process

KAFKA = "kafka://127.0.0.1:19092"


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    """An applied copy of the example repo with a project of its own: (repo, project, data folder)."""
    tmp = tmp_path_factory.mktemp("feast_ui")
    project = f"ui_{uuid.uuid4().hex[:8]}"
    repo = copy_example_repo(tmp, project, {"path": f"sqlite:///{tmp / 'registry.db'}"}, data_dir=tmp / "data")
    done = sibling("version_env", "featurectl").run(repo, "apply")  # in-process: a subprocess costs seconds of imports
    assert f"OpenLineage namespace `{project}`" in done.stdout
    return repo, project, tmp / "data"


@pytest.fixture(scope="module")
def ui(applied):
    repo = applied[0]
    with cli_server(repo, "ui", ready_path="/") as server:
        yield server.url + f"/p/{applied[1]}"


def _dom(url: str, tmp_path: Path) -> str:
    return html.unescape(chromium(tmp_path / "profile", "--dump-dom", url))


def test_the_feature_view_list_shows_every_view(ui, applied, tmp_path):
    dom = _dom(f"{ui}/feature-view/", tmp_path)
    for view in ("asset_activity", "asset_attributes", "user_activity"):
        assert f'data-test-subj="row-{view}"' in dom and f'href="/p/{applied[1]}/feature-view/{view}"' in dom


def test_the_lineage_page_draws_topic_and_history_to_views_to_services(ui, applied, tmp_path):
    _, project, data = applied
    dom = _dom(f"{ui}/lineage/", tmp_path)
    edges = set(dom.split('aria-label="Edge from ')[1:])
    edges = {edge.split('"')[0] for edge in edges}
    for view, source in (("asset_activity", "asset_interactions"), ("user_activity", "asset_interactions"),
                         ("asset_attributes", "asset_catalog")):
        assert f"dataset:{KAFKA}:{source} to dataset:{project}:{view}" in edges
        assert f"dataset:file:{data / source} to dataset:{project}:{view}" in edges
    assert f"dataset:{project}:asset_activity to dataset:{project}:cube3d_conditioning" in edges
    assert f"dataset:{project}:asset_attributes to dataset:{project}:asset_ranking" in edges
    assert f"dataset:{project}:asset_ratios to dataset:{project}:asset_ranking" in edges
    assert f"dataset:{project}:generation_request to dataset:{project}:generation_fit" in edges
    assert f"dataset:file:{data / 'asset_meshes'} to dataset:{project}:asset_geometry" in edges
    # nothing else (no edge between a topic and its history): 3 views x 2 sources, the asset view's history, 2
    # on-demand views x 2 inputs, 5 inputs of the services
    assert len(edges) == 16
    assert 'data-id="dataset:file:' in dom and ">KafkaSource<" in dom and ">FileSource<" in dom


def test_a_view_page_shows_its_source_and_tile_query(ui, applied, tmp_path):
    from common.config import load_config
    from dsl.compile_flink import SourceSettings
    from dsl.compile_repo import compile_repo

    cfg = load_config(applied[0])
    compiled = compile_repo(cfg.repo_path, SourceSettings(cfg.platform.kafka.bootstrap_servers, cfg.data_dir))
    query = next(c.tile_query for c in compiled.views if c.view == "asset_activity")
    dom = _dom(f"{ui}/feature-view/asset_activity/", tmp_path)
    assert "featurectl.tile_query" in dom and query in dom
    assert "featurectl.kafka_topic" in dom and str(applied[2] / "asset_interactions") in dom


def test_the_data_source_page_lists_topics_and_histories(ui, tmp_path):
    dom = _dom(f"{ui}/data-source/", tmp_path)
    assert ">asset_interactions<" in dom and ">asset_interactions_history<" in dom
    assert ">asset_catalog<" in dom and ">STREAM_KAFKA<" in dom and ">BATCH_FILE<" in dom


def test_the_screenshot_script_writes_the_lineage_page(applied, tmp_path):
    png = tmp_path / "lineage.png"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "ui_screenshot.sh"), str(png), "--repo", str(applied[0])],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == (2800, 2000)  # 2x 1400x1000
    assert png.stat().st_size > 50_000  # a drawn page, not a blank one


def test_feast_ui_itself_serves_the_views_and_the_lineage(applied):
    repo, project, _ = applied
    port = free_port()
    log = repo.parent / "feast-ui.log"
    with log.open("w") as out:
        process = subprocess.Popen([str(Path(sys.executable).parent / "feast"), "ui", "--host", "127.0.0.1",
                                    "--port", str(port)], cwd=repo, stdout=out, stderr=subprocess.STDOUT)
    try:
        views = _json_when_up(f"http://127.0.0.1:{port}/api/v1/feature_views?project={project}", process, log)
        assert {v["spec"]["name"] for v in views["featureViews"]} == {"asset_activity", "asset_attributes",
                                                                      "user_activity", "asset_geometry",
                                                                      "asset_ratios", "generation_fit"}
        graph = _json_when_up(f"http://127.0.0.1:{port}/api/v1/lineage/openlineage/graph", process, log)
        assert {(n["namespace"], n["name"]) for n in graph["nodes"]} >= {(KAFKA, "asset_catalog"),
                                                                         (project, "cube3d_conditioning")}
    finally:
        stop_process(process, 20)


def _json_when_up(url: str, process: subprocess.Popen, log: Path, wait_s: float = 120) -> dict:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                return json.loads(reply.read())
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"feast ui did not answer {url}:\n{log.read_text()}") from None
            time.sleep(0.3)


def test_ui_refuses_a_project_nothing_was_applied_to(tmp_path):
    repo = copy_example_repo(tmp_path, "ui_empty", {"path": f"sqlite:///{tmp_path / 'registry.db'}"})
    done = featurectl("--repo", str(repo), "ui", "--port", str(free_port()))
    assert done.returncode == 1
    assert "project `ui_empty` has no feature views" in done.stderr and "featurectl apply" in done.stderr
    (tmp_path / "garbage.db").write_bytes(b"not a SQLite database" * 100)
    done = featurectl("--repo", str(repo), "--registry", f"sqlite:///{tmp_path / 'garbage.db'}", "ui")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "cannot read the registry" in done.stderr and "check that the file is a registry" in done.stderr
