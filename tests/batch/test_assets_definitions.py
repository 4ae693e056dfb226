"""Asset sources in the DSL: a fixed, typed schema checked eagerly like any source's; the mesh features module
computes exactly the declared features."""

from __future__ import annotations

from pathlib import Path

import pytest
import trimesh

from dsl import (MESH_FEATURES, AssetSource, Attribute, DefinitionError, Entity, FeatureView, Int64,
                 ShapeDescriptor, String, TypeMismatchError, UnknownColumnError, Vector)
from dsl.compile_flink import SourceSettings, compile_view

asset = Entity("asset", join_keys={"asset_id": String})


def test_an_asset_source_has_the_mesh_features_and_the_embedding_as_typed_columns():
    source = AssetSource("meshes", assets="assets/assets.parquet", embedding=ShapeDescriptor(bins=32))
    assert source.path == "meshes" and source.timestamp_field == "updated_at" and source.assets_is_list
    assert source.schema["shape_d2"] == Vector(32, "L2") and set(MESH_FEATURES) < set(source.schema)
    view = FeatureView("geometry", entity=asset, source=source, features=[Attribute(c) for c in source.schema
                                                                           if c not in ("asset_id", "updated_at")])
    assert view.vector_features == {"shape_d2": Vector(32, "L2")}
    compiled = compile_view(view, SourceSettings("127.0.0.1:9092", Path("/data")))
    assert "shape_d2" in compiled.tile_query


def test_mesh_features_computes_exactly_the_declared_features():
    from batch.assets.mesh_features import mesh_features

    features = mesh_features(trimesh.creation.box(extents=[1, 2, 3]), ShapeDescriptor())
    assert list(features.values) == list(MESH_FEATURES)
    assert features.values["volume"] == pytest.approx(6.0) and features.values["surface_area"] == pytest.approx(22)


@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"assets": ""}, DefinitionError, "is not a folder or a Parquet file"),
    ({"assets": "a", "kafka_topic": "meshes"}, DefinitionError, "asset sources are files"),
    ({"assets": "a", "embedding": "d2"}, DefinitionError, "embedding must be a ShapeDescriptor"),
    ({"assets": "a", "embedding": ShapeDescriptor(name="volume")}, DefinitionError, "is a column of the source"),
])
def test_bad_asset_sources_are_refused_when_built(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        AssetSource("meshes", **kwargs)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"bins": 2}, "bins 2 is not an int from 4"), ({"pairs": 10}, "pairs 10 is not an int"),
    ({"seed": -1}, "seed -1 is not an int"), ({"name": "shape-d2"}, "is not allowed"),
])
def test_bad_shape_descriptors_are_refused(kwargs, fragment):
    with pytest.raises(DefinitionError, match=fragment):
        ShapeDescriptor(**kwargs)


def test_views_over_an_asset_source_are_checked_like_any_view():
    source = AssetSource("meshes", assets="assets")
    with pytest.raises(UnknownColumnError, match="unknown column `polygons`"):
        FeatureView("geometry", entity=asset, source=source, features=[Attribute("polygons")])
    with pytest.raises(TypeMismatchError, match="join key `asset_id` is int64"):
        FeatureView("geometry", entity=Entity("asset", join_keys={"asset_id": Int64}),
                    source=source, features=[Attribute("volume")])
