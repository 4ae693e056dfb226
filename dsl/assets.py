"""3D assets as a source: a collection of mesh files whose derived features views can serve.

    meshes = AssetSource("asset_meshes", assets="assets/assets.parquet")   # or a folder of .glb/.obj/.ply files
    geometry = FeatureView("asset_geometry", entity=asset, source=meshes,
                           features=[Attribute(c) for c in [*MESH_FEATURES, "shape_d2"]])

An `AssetSource` is an event source whose events are asset versions: `featurectl assets process` decodes each
changed file, measures it and writes one row per asset version (`asset_id`, `category`, `updated_at`, every
column of `MESH_FEATURES` and the shape embedding) to the source's Parquet history (`path`) and to the offline
table of each view over it. Its schema is fixed, so views over it are checked like any other (unknown column,
wrong type). The shape embedding is declared by `embedding` (a `ShapeDescriptor`): a column `embedding.name` of
type `Vector(bins)`, which a view serves (and the vector index searches) as `Attribute(embedding.name)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from dsl.errors import DefinitionError, backticked
from dsl.names import check_name
from dsl.source import EventSource
from dsl.types import Bool, FeatureType, Float64, Int64, String, Timestamp, ValueType, Vector

ASSET_ID = "asset_id"
ASSET_CATEGORY = "category"
ASSET_TIMESTAMP = "updated_at"
MESH_FILE_TYPES = ("glb", "gltf", "obj", "ply", "stl", "off")

# The features every asset version gets; `batch.assets.mesh_features` computes them with trimesh.
MESH_FEATURES: dict[str, ValueType] = {
    "extent_x": Float64,  # the axis-aligned bounding box's sides, in the file's units
    "extent_y": Float64,
    "extent_z": Float64,
    "vertex_count": Int64,  # after trimesh merges duplicate vertices
    "face_count": Int64,  # triangles
    "surface_area": Float64,
    "volume": Float64,  # NULL unless the mesh is watertight (a volume is not defined otherwise)
    "is_watertight": Bool,
    "components": Int64,  # connected bodies
}
MAX_BINS = 4096


@dataclass(frozen=True)
class ShapeDescriptor:
    """A fixed-size float32 shape embedding of each asset: the D2 shape distribution (Osada et al. 2002), the
    histogram of `pairs` random surface-point distances divided by their mean, in `bins` bins, from `seed`."""

    name: str = "shape_d2"
    bins: int = 64
    pairs: int = 4096
    seed: int = 0

    @property
    def vector_type(self) -> Vector:
        """L2, for the vector is the square root of a distribution: L2 distance orders as Hellinger distance."""
        return Vector(self.bins, "L2")

    def __post_init__(self) -> None:
        where = f"shape descriptor {backticked(self.name)}"
        check_name(where, "name", self.name)
        for what, value, low, high in (("bins", self.bins, 4, MAX_BINS), ("pairs", self.pairs, 64, 1_000_000),
                                       ("seed", self.seed, 0, 2**32 - 1)):
            if type(value) is not int or not low <= value <= high:
                raise DefinitionError(where, f"{what} {value!r} is not an int from {low} to {high}",
                                      f"give e.g. {what}={getattr(ShapeDescriptor, what)}")


def asset_schema(embedding: ShapeDescriptor) -> dict[str, FeatureType]:
    """The columns of an asset source with this embedding, in order."""
    return {ASSET_ID: String, ASSET_CATEGORY: String, ASSET_TIMESTAMP: Timestamp, **MESH_FEATURES,
            embedding.name: embedding.vector_type}


@dataclass(frozen=True)
class AssetSource(EventSource):
    """Mesh files (`assets`: a folder of GLB/glTF/OBJ/PLY/STL/OFF files, or a Parquet list with `asset_id`, `path`,
    `updated_at` (epoch ms) and optionally `category` columns; relative to the data folder unless absolute) whose
    derived rows go to the Parquet history `path` (default: the source's name). A folder's asset ids are the file
    names without extension and their update times the files' modification times."""

    schema: Mapping[str, FeatureType] = field(default_factory=dict, init=False)
    timestamp_field: Optional[str] = field(default=ASSET_TIMESTAMP, init=False)
    assets: str = ""
    embedding: ShapeDescriptor = field(default_factory=ShapeDescriptor)

    def __post_init__(self) -> None:
        where = f"asset source {backticked(self.name)}"
        if not (isinstance(self.assets, str) and self.assets and self.assets.isprintable()):
            raise DefinitionError(where, f"assets {backticked(self.assets)} is not a folder or a Parquet file",
                                  "give assets=\"assets\" (a folder of mesh files) or \"assets/list.parquet\"")
        if self.kafka_topic is not None:
            raise DefinitionError(where, "has a kafka_topic", "asset sources are files: leave kafka_topic out")
        if not isinstance(self.embedding, ShapeDescriptor):
            raise DefinitionError(where, f"embedding must be a ShapeDescriptor, got {type(self.embedding).__name__}",
                                  "write embedding=ShapeDescriptor(bins=64)")
        if self.embedding.name in (ASSET_ID, ASSET_CATEGORY, ASSET_TIMESTAMP, *MESH_FEATURES):
            raise DefinitionError(where, f"embedding name `{self.embedding.name}` is a column of the source",
                                  "give the ShapeDescriptor another name=\"...\"")
        object.__setattr__(self, "schema", asset_schema(self.embedding))
        object.__setattr__(self, "path", self.path or self.name)
        super().__post_init__()

    @property
    def assets_is_list(self) -> bool:
        return self.assets.endswith(".parquet")
