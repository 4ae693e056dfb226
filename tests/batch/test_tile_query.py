"""The compiled tile query, run by PyFlink in batch mode on a small Parquet file, equals plain Python."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

import oracle
from batch.tiles import query_tiles
from common.flink import create_table_env
from dsl import load_repo
from dsl.compile_flink import source_path
from feature_repo.sample_data import SampleSpec, interactions_table

pytestmark = pytest.mark.integration

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
HOURS = 3


@pytest.fixture(scope="module")
def repo(pytestconfig):
    return load_repo(pytestconfig.rootpath / "feature_repo")


@pytest.fixture(scope="module")
def events(tmp_path_factory, repo):
    data_dir = tmp_path_factory.mktemp("data")
    view = repo.view("asset_activity")
    table = interactions_table(SampleSpec(n_assets=40, n_users=300, seed=3), START_MS,
                               START_MS + HOURS * 3_600_000, 6_000)
    folder = source_path(view.source, data_dir)
    folder.mkdir(parents=True)
    pq.write_table(table.slice(0, 3_000), folder / "part-0.parquet")
    pq.write_table(table.slice(3_000), folder / "part-1.parquet")
    return data_dir, table.to_pylist()


@pytest.fixture(scope="module")
def batch_env():
    return create_table_env(streaming=False)


def _same(expected, actual) -> bool:
    if isinstance(expected, float) or isinstance(actual, float):
        return actual is not None and expected is not None and math.isclose(expected, actual, rel_tol=1e-12)
    return expected == actual


@pytest.mark.parametrize("view_name", ["asset_activity", "user_activity"])
def test_tile_query_matches_python(repo, events, batch_env, view_name):
    data_dir, rows = events
    view = repo.view(view_name)
    expected = oracle.tiles(view, rows, data_dir)
    frame = query_tiles(oracle.compiled_for(view, data_dir), env=batch_env)
    assert len(frame) == len(expected)
    keys = list(view.entity.join_keys)
    mismatches = []
    for record in frame.to_dict("records"):
        want = expected[(*(record[k] for k in keys), record["tile_start"])]
        for column, value in want.items():
            got = record[column]
            got = None if isinstance(got, float) and math.isnan(got) else got
            got = bytes(got) if isinstance(got, (bytearray, memoryview)) else got
            if not _same(value, got):
                mismatches.append((column, value, got))
    assert not mismatches, mismatches[:5]
