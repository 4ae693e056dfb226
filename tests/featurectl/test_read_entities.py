"""`training-set --entities FILE.csv`: join keys and request fields read as declared, the rest inferred."""

from __future__ import annotations

import click
import pyarrow as pa
import pytest

from batch.training import entity_columns, resolve_features
from cli_helpers import ROOT
from dsl import load_repo
from dsl.compile_feast import EVENT_TIMESTAMP
from featurectl.batch_commands import read_entities


@pytest.fixture(scope="module")
def columns():
    repo = load_repo(ROOT / "feature_repo")
    return entity_columns(resolve_features(repo, ["generation_fit:prompt_length", "user_activity:events_1h"]))


def test_join_keys_and_request_fields_are_read_as_declared(tmp_path, columns):
    assert {k: v.value for k, v in columns.items()} == {"asset_id": "string", "user_id": "string",
                                                        "prompt": "string", "target_volume": "float64"}
    path = tmp_path / "entities.csv"
    path.write_text(f"asset_id,user_id,prompt,target_volume,label,{EVENT_TIMESTAMP}\n"
                    "123,NA,,1,7,2026-01-01T00:00:00Z\n"
                    "a1,u1,null,2.5,,2026-01-01T01:00:00+01:00\n")
    table = read_entities(path, types=columns)
    assert table.column("asset_id").to_pylist() == ["123", "a1"]  # inferred, it was int64, then "convert it"
    assert table.column("user_id").to_pylist() == ["NA", "u1"]  # inferred, it was null
    assert table.column("prompt").to_pylist() == ["", "null"]  # inferred, "" was null and "null" null
    assert table.column("target_volume").to_pylist() == [1.0, 2.5]
    assert table.column("label").to_pylist() == [7, None]  # not declared: inferred as before
    assert table.column(EVENT_TIMESTAMP).cast(pa.int64()).to_pylist() == [1767225600, 1767225600]


def test_a_value_unlike_its_declared_type_and_times_arrow_cannot_read(tmp_path, columns):
    path = tmp_path / "entities.csv"
    path.write_text(f"asset_id,target_volume,{EVENT_TIMESTAMP}\na1,big,2026-01-01\n")
    with pytest.raises(click.BadParameter, match=r"CSV conversion error to double: invalid value 'big'; fix the "
                                                 r"file \(join keys and request fields are read as their declared "
                                                 r"types: `asset_id` string, .*`target_volume` float64\)"):
        read_entities(path, types=columns)
    path.write_text(f"asset_id,{EVENT_TIMESTAMP}\na1,2026-01-01\na2,2026-01-01T06:00:00Z\n")
    times = read_entities(path, types=columns).column(EVENT_TIMESTAMP)  # mixed forms: read as pandas reads them
    assert times.cast(pa.timestamp("ms", "UTC")).cast(pa.int64()).to_pylist() == [1767225600000, 1767247200000]
