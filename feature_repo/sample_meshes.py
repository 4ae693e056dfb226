"""Real meshes for the example repo's asset source, reproducible from a seed.

Each asset is one of several shape categories built from trimesh primitives (boxes, spheres, cylinders, capsules,
cones, tori, an open bowl) and their combinations (a table is a top on four legs, a snowman three stacked
spheres), then scaled unevenly, twisted, rotated and moved, so that shapes of one category differ but stay closer
to each other than to other categories. Files rotate through GLB, OBJ and PLY; `assets.parquet` lists them with
the columns an `AssetSource` list has (`asset_id`, `path` relative to the list, `updated_at` in epoch ms,
`category`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import numpy as np

FORMATS = ("glb", "obj", "ply")
LIST_NAME = "assets.parquet"
DAY_MS = 86_400_000


def _box(rng):
    import trimesh

    return trimesh.creation.box(extents=rng.uniform(0.5, 1.5, 3))


def _sphere(rng):
    import trimesh

    return trimesh.creation.icosphere(subdivisions=2, radius=rng.uniform(0.5, 1.0))


def _cylinder(rng):
    import trimesh

    return trimesh.creation.cylinder(radius=rng.uniform(0.3, 0.6), height=rng.uniform(1.0, 2.5), sections=24)


def _capsule(rng):
    import trimesh

    return trimesh.creation.capsule(height=rng.uniform(0.8, 2.0), radius=rng.uniform(0.25, 0.5), count=[12, 12])


def _cone(rng):
    import trimesh

    return trimesh.creation.cone(radius=rng.uniform(0.4, 0.8), height=rng.uniform(0.8, 2.0), sections=24)


def _torus(rng):
    import trimesh

    major = rng.uniform(0.6, 1.0)
    return trimesh.creation.torus(major, major * rng.uniform(0.15, 0.4), major_sections=24, minor_sections=12)


def _table(rng):
    import trimesh

    width, depth, height = rng.uniform(1.0, 2.0), rng.uniform(0.6, 1.2), rng.uniform(0.6, 1.0)
    parts = [trimesh.creation.box(extents=[width, depth, 0.08], transform=_moved(0, 0, height))]
    for sx in (-1, 1):
        for sy in (-1, 1):
            leg = trimesh.creation.cylinder(radius=0.05, height=height, sections=12)
            parts.append(leg.apply_translation([sx * (width / 2 - 0.1), sy * (depth / 2 - 0.1), height / 2]))
    return trimesh.util.concatenate(parts)


def _snowman(rng):
    import trimesh

    parts, z = [], 0.0
    for radius in sorted(rng.uniform(0.25, 0.6, 3), reverse=True):
        z += radius
        parts.append(trimesh.creation.icosphere(subdivisions=2, radius=radius).apply_translation([0, 0, z]))
        z += radius * 0.8
    return trimesh.util.concatenate(parts)


def _dumbbell(rng):
    import trimesh

    length, radius = rng.uniform(1.0, 2.0), rng.uniform(0.25, 0.45)
    bar = trimesh.creation.cylinder(radius=0.06, height=length, sections=12)
    ends = [trimesh.creation.icosphere(subdivisions=2, radius=radius).apply_translation([0, 0, s * length / 2])
            for s in (-1, 1)]
    return trimesh.util.concatenate([bar, *ends])


def _lamp(rng):
    import trimesh

    height = rng.uniform(1.0, 2.0)
    base = trimesh.creation.cylinder(radius=rng.uniform(0.25, 0.4), height=0.06, sections=24)
    pole = trimesh.creation.cylinder(radius=0.03, height=height, sections=12).apply_translation([0, 0, height / 2])
    shade = trimesh.creation.cone(radius=rng.uniform(0.3, 0.5), height=0.4, sections=24)
    return trimesh.util.concatenate([base, pole, shade.apply_translation([0, 0, height - 0.2])])


def _tree(rng):
    import trimesh

    trunk_h = rng.uniform(0.5, 1.0)
    trunk = trimesh.creation.cylinder(radius=0.08, height=trunk_h, sections=12).apply_translation([0, 0, trunk_h / 2])
    crown = trimesh.creation.cone(radius=rng.uniform(0.4, 0.7), height=rng.uniform(1.0, 1.8), sections=24)
    return trimesh.util.concatenate([trunk, crown.apply_translation([0, 0, trunk_h])])


def _bowl(rng):
    """An open half sphere: not watertight, so it has no volume."""
    import trimesh

    sphere = trimesh.creation.icosphere(subdivisions=2, radius=rng.uniform(0.5, 1.0))
    sphere.update_faces(sphere.triangles_center[:, 2] < rng.uniform(0.0, 0.3))
    sphere.remove_unreferenced_vertices()
    return sphere


def _moved(x: float, y: float, z: float) -> np.ndarray:
    matrix = np.eye(4)
    matrix[:3, 3] = [x, y, z]
    return matrix


SHAPES: dict[str, Callable] = {
    "box": _box, "sphere": _sphere, "cylinder": _cylinder, "capsule": _capsule, "cone": _cone, "torus": _torus,
    "table": _table, "snowman": _snowman, "dumbbell": _dumbbell, "lamp": _lamp, "tree": _tree,
    "bowl": _bowl,
}
CATEGORIES = tuple(SHAPES)


def asset_mesh(index: int, seed: int):
    """The mesh of asset `index` (its category is `CATEGORIES[index % len(CATEGORIES)]`): built, deformed, posed."""
    import trimesh

    rng = np.random.default_rng([seed, index])
    mesh = SHAPES[CATEGORIES[index % len(CATEGORIES)]](rng)
    vertices = mesh.vertices * rng.uniform(0.7, 1.4, 3)
    twist = rng.uniform(-0.4, 0.4)  # radians per unit of height about z
    angle = twist * (vertices[:, 2] - vertices[:, 2].mean())
    cos, sin = np.cos(angle), np.sin(angle)
    vertices = np.column_stack([cos * vertices[:, 0] - sin * vertices[:, 1],
                                sin * vertices[:, 0] + cos * vertices[:, 1], vertices[:, 2]])
    mesh = trimesh.Trimesh(vertices, mesh.faces, process=False)
    mesh.apply_transform(trimesh.transformations.random_rotation_matrix(rng.random(3)))
    return mesh.apply_translation(rng.normal(0, 2, 3))


def asset_id(index: int) -> str:
    """The example catalog's id of asset `index` (`feature_repo.sample_data.asset_id`)."""
    return f"asset_{index:06d}"


def write_assets(n: int, out: Path, as_of_ms: int, seed: int = 7,
                 on_asset: Optional[Callable[[int], None]] = None) -> Path:
    """Write `n` meshes under `out` and their list `out/assets.parquet`; returns the list's path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list] = {"asset_id": [], "path": [], "updated_at": [], "category": []}
    rng = np.random.default_rng([seed, 0])
    ages = rng.integers(0, 30 * DAY_MS, n)
    for index in range(n):
        name = f"{asset_id(index)}.{FORMATS[index % len(FORMATS)]}"
        asset_mesh(index, seed).export(out / name)
        rows["asset_id"].append(asset_id(index))
        rows["path"].append(name)
        rows["updated_at"].append(as_of_ms - int(ages[index]))
        rows["category"].append(CATEGORIES[index % len(CATEGORIES)])
        if on_asset:
            on_asset(1)
    listing = out / LIST_NAME
    pq.write_table(pa.table(rows, schema=pa.schema([("asset_id", pa.string()), ("path", pa.string()),
                                                    ("updated_at", pa.int64()), ("category", pa.string())])),
                   listing)
    return listing
